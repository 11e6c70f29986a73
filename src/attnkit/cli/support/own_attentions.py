"""attnkit's own trained models (``attnkit train`` run directories and checkpoints, language
models and encoder-decoders) as ``--model`` of ``attnkit view`` and ``attnkit explain``, and the
page of ``attnkit generate --view``: their attention weights on a text as the same
:class:`~attnkit.integrations.hf_attention_weights.ModelAttentions` a transformers model gives.

A language model gives one section, its causal self-attention on the text's tokens (cut to
its training window). An encoder-decoder translates the text (greedy), then gives three
sections, as ``attnkit translate --view`` computes them: the encoder's self-attention, the
decoder's self-attention and the cross-attention, row t labelled with the token step t produced.

The model runs where it is (the run's ``--device``), its token ids beside it; the weights come
back to the host once per section (stacked on the device first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["is_run", "lm_sections", "load", "own_attentions"]


def is_run(path: Path) -> bool:
    """Whether ``path`` is an attnkit checkpoint or run directory (a ``manifest.json``
    beside it, in ``best/`` or in a ``step-*`` directory), not a transformers directory."""
    if not path.is_dir():
        return False
    if (path / "manifest.json").is_file() or (path / "best" / "manifest.json").is_file():
        return True
    return any(path.glob("step-*/manifest.json"))


def load(path: Path) -> Any:
    """The run's best checkpoint (else its last) as a
    :class:`~attnkit.train.inference.session.Loaded`."""
    import sys

    from attnkit.cli.support.common import one_line
    from attnkit.cli.support.options import checkpoint_of
    from attnkit.train.inference import session

    with checkpoint_of("--model"):
        loaded = session.load(path, best=True)
    print(f"checkpoint {one_line(loaded.describe())}", file=sys.stderr)  # as generate says
    return loaded


def _shown(tok: Any, ids: list[int]) -> list[str]:
    """Each token as text (byte-level BPE pieces decoded one by one)."""
    out = []
    for i in ids:
        text = tok.decode([i], skip_special_tokens=False)
        out.append(text.strip() or (tok.id_to_token(i) or f"<{i}>").strip() or repr(text))
    return out


def lm_sections(loaded: Any, ids: list[int]) -> tuple[Any, list[str]]:
    """(the one self-attention section of the language model on ``ids``, its tokens); the
    model runs on its device, the section's weights are on the host."""
    import torch

    from attnkit.integrations.hf_attention_weights import AttentionSection
    from attnkit.viz.weights import lm_attentions

    tokens = _shown(loaded.tokenizer, ids)
    device = next(loaded.model.parameters()).device
    weights = lm_attentions(loaded.model, torch.tensor([ids], device=device)).cpu()
    note = "rows: each token; columns: the tokens it attends to (itself and those before: causal)"
    return AttentionSection("self-attention", weights, tokens, tokens, note), tokens


def own_attentions(loaded: Any, name: str, text: str) -> Any:
    """The :class:`~attnkit.integrations.hf_attention_weights.ModelAttentions` of attnkit model
    ``loaded`` on ``text`` (see the module docstring)."""
    from attnkit.integrations.hf_attention_weights import AttentionSection, ModelAttentions

    tok = loaded.tokenizer
    enc = tok.encode(text, add_special_tokens=False)
    if loaded.kind == "lm":
        limit = loaded.train_config.resolved().block_size
        ids, offsets = enc.ids[:limit], [tuple(o) for o in enc.offsets[:limit]]
        if not ids:
            raise ValueError(f"text: {text!r} has no tokens for this model")
        section, tokens = lm_sections(loaded, ids)
        truncated = limit if len(enc.ids) > limit else None
        return ModelAttentions(
            name, "decoder", tokens, [False] * len(ids), offsets, (section,), truncated
        )
    import torch

    from attnkit.train.data.tasks import seq2seq_example
    from attnkit.train.inference.metrics import translate
    from attnkit.viz.weights import seq2seq_attentions

    output = translate(loaded.model, tok, [text])[0]
    src, tgt = seq2seq_example(tok, text, output)
    device = next(loaded.model.parameters()).device
    src_ids, tgt_ids = (torch.tensor([x], device=device) for x in (src, tgt[:-1]))
    att = seq2seq_attentions(loaded.model, src_ids, tgt_ids)
    src_tokens, reads, produced = _shown(tok, src), _shown(tok, tgt[:-1]), _shown(tok, tgt[1:])
    sections = (
        AttentionSection("encoder self-attention", att.encoder.cpu(), src_tokens, src_tokens,
                         "rows and columns: the text's tokens (then [EOS])"),
        AttentionSection("decoder self-attention", att.decoder.cpu(), reads, reads,
                         "rows and columns: the tokens the decoder reads at each step ([BOS], "
                         "then its own output so far); causal"),
        AttentionSection("cross-attention", att.cross.cpu(), produced, src_tokens,
                         "row t: the decoder step that produced output token t (shown on the "
                         "left); columns: the text's tokens"),
    )  # fmt: skip
    offsets = [tuple(o) for o in enc.offsets] + [(0, 0)]
    special = [False] * len(enc.ids) + [True]
    return ModelAttentions(name, "encoder-decoder", src_tokens, special, offsets, sections, None)
