"""attnkit models written as HuggingFace transformers directories (``save_pretrained`` layout),
loadable with the Auto classes, only when a transformers class computes exactly the same
function; otherwise :class:`UnfaithfulExport` names the feature that has no counterpart.

Encoder-decoder (:class:`~attnkit.models.seq2seq.Seq2SeqTransformer`, pre-LN, one embedding
matrix shared by source, target and generator) -> ``PegasusForConditionalGeneration``: the one
encoder-decoder class of transformers with pre-LN layers, a final LayerNorm after each stack,
sinusoidal positions added to embeddings scaled by sqrt(d_model), no LayerNorm on the
embeddings, and a bias on the logits (``final_logits_bias``). ``MarianMTModel`` and
``BartForConditionalGeneration`` are post-LN (BART also normalises the embeddings), so they
would compute something else. Pegasus writes its sine features in the first half of the vector
and its cosines in the second, attnkit interleaves them: the export permutes the model's width
axis (every matrix and LayerNorm along it), which changes no output, so both tables agree.

Decoder-only LMs: :mod:`attnkit.integrations.hf_export_lm` (``GPT2LMHeadModel`` or
``PegasusForCausalLM``), with the helpers here: the atomic directory write, the tokenizer, the
Pegasus names of a layer's weights and the width permutation.

The tokenizer is saved as a ``PreTrainedTokenizerFast`` (``tokenizer.json``) that appends
[EOS] to each text, as attnkit's encoder inputs have it; generation starts from [BOS].
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from tokenizers import Tokenizer, processors
from torch import Tensor

from attnkit.files import usual_mode
from attnkit.nn.positional import sinusoidal_table
from attnkit.nn.projection import unpack

__all__ = [
    "UnfaithfulExport",
    "available",
    "check_out",
    "export_seq2seq",
    "hf_tokenizer",
    "load_all",
    "pegasus_config",
    "pegasus_layer_weight",
    "pegasus_table",
    "quiet",
    "width_permutation",
    "write_atomically",
]


class UnfaithfulExport(ValueError):
    """No transformers class computes this model's function; the message names the feature."""


def available() -> bool:
    """Whether HuggingFace transformers can be imported (the optional extra ``hf``)."""
    return importlib.util.find_spec("transformers") is not None


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """transformers' warnings and progress bars off inside the block."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        logging.enable_progress_bar()


def width_permutation(d_model: int) -> Tensor:
    """The order of attnkit's interleaved sinusoid columns (sin 0, cos 0, sin 1, cos 1, ...)
    that gives Pegasus's halves (sin 0, sin 1, ..., cos 0, cos 1, ...): (d_model,) indices."""
    return torch.cat(
        [torch.arange(0, d_model, 2, device="cpu"), torch.arange(1, d_model, 2, device="cpu")]
    )


def _check_seq2seq(c) -> None:
    problems = []
    if not c.norm_first:
        problems.append("post-LN layers (Pegasus, the pre-LN encoder-decoder, normalises first)")
    if c.tie_embeddings != "all":
        problems.append(f"tie_embeddings={c.tie_embeddings!r} (Pegasus shares one matrix)")
    if c.d_model % 2:
        problems.append(f"an odd d_model ({c.d_model}: Pegasus' sinusoids need an even width)")
    if c.layer_norm_eps != 1e-5:
        problems.append(f"layer_norm_eps={c.layer_norm_eps} (Pegasus uses 1e-5)")
    if problems:
        raise UnfaithfulExport(
            "export: this encoder-decoder has no faithful transformers class: "
            + "; ".join(problems)
        )


_LAYER = {
    "self_attn.": "self_attn.",
    "multihead_attn.": "encoder_attn.",
    "linear1.": "fc1.",
    "linear2.": "fc2.",
}
_ENC_NORMS = {"norm1.": "self_attn_layer_norm.", "norm2.": "final_layer_norm."}
_DEC_NORMS = {
    "norm1.": "self_attn_layer_norm.",
    "norm2.": "encoder_attn_layer_norm.",
    "norm3.": "final_layer_norm.",
}
# along the width axis: input columns (1) or output rows / vectors (0)
_PERMUTE_IN = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "linear1.weight")
_PERMUTE_OUT = ("out_proj.weight", "out_proj.bias", "linear2.weight", "linear2.bias")


def pegasus_table(max_len: int, d_model: int) -> Tensor:
    """attnkit's sinusoid table (max_len, d_model) with its columns in Pegasus's order: equal
    to ``PegasusSinusoidalPositionalEmbedding``'s own table to float32 rounding."""
    return sinusoidal_table(max_len, d_model)[:, width_permutation(d_model)].clone()


def pegasus_layer_weight(
    sub: str, t: Tensor, p: Tensor, norms: dict[str, str]
) -> tuple[str, Tensor]:
    """One weight of an attnkit layer, ``sub`` its name inside the layer (``self_attn.q_proj.
    weight``, ``linear1.bias``, ``norm2.weight``, ...) -> (its name inside a Pegasus layer, the
    tensor with its width axis permuted by ``p``); ``norms`` names the layer's LayerNorms."""
    for ours, theirs in (*_LAYER.items(), *norms.items()):
        if sub.startswith(ours):
            key = f"{theirs}{sub[len(ours) :]}"
            break
    else:  # pragma: no cover - every parameter of a layer is named above
        raise UnfaithfulExport(f"export: no Pegasus counterpart for the weight {sub}")
    if sub.endswith(_PERMUTE_IN):
        t = t[:, p]
    elif sub.endswith(_PERMUTE_OUT) or "norm" in sub.split(".")[0]:
        t = t[p]
    return key, t.clone()


def _pegasus_state(model) -> dict[str, Tensor]:
    """The model's weights under Pegasus's names, the width axis permuted."""
    c = model.config
    p = width_permutation(c.d_model)
    out: dict[str, Tensor] = {}
    for name, t in unpack(model.state_dict()).items():  # q, k, v apart, as Pegasus
        t = t.detach().float().cpu()
        if name.startswith(("src_embed.", "tgt_embed.", "generator.weight")):
            continue
        if name == "generator.bias":
            out["final_logits_bias"] = t[None, :].clone()
            continue
        stack, rest = name.split(".")[1], name.split(".", 2)[2]  # transformer.<stack>.<rest>
        if rest.startswith("norm."):
            out[f"model.{stack}.layer_norm.{rest[5:]}"] = t[p].clone()
            continue
        _, i, sub = rest.split(".", 2)  # layers.<i>.<sub>
        key, t = pegasus_layer_weight(sub, t, p, _ENC_NORMS if stack == "encoder" else _DEC_NORMS)
        out[f"model.{stack}.layers.{i}.{key}"] = t
    shared = model.src_embed.weight.detach().float().cpu()[:, p].clone()
    out["model.shared.weight"] = shared
    return out


def hf_tokenizer(tok: Tokenizer, append_eos: bool = True, **kw):
    """attnkit's tokenizer as a transformers ``PreTrainedTokenizerFast`` (its special tokens
    named); ``append_eos``: each text gets [EOS] at the end (an encoder's input), else the ids
    are attnkit's plain encoding (a language model's prompt). ``kw`` go to the constructor."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(tok.to_str())
    if append_eos:
        eos = tok.token_to_id("[EOS]")
        tok.post_processor = processors.TemplateProcessing(
            single="$A [EOS]", pair="$A [EOS] $B [EOS]", special_tokens=[("[EOS]", eos)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        bos_token="[BOS]",
        eos_token="[EOS]",
        unk_token="[UNK]",
        **kw,
    )


def check_out(out: str | os.PathLike) -> Path:
    """``out`` as a Path; ValueError when it exists and is not an empty directory."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"out: {out} exists and is not an empty directory; choose a new one")
    return out


def write_atomically(hf, hf_tok, out: Path) -> Path:
    """``hf.save_pretrained`` and ``hf_tok.save_pretrained`` into a temporary directory beside
    ``out`` (an empty or missing directory), then renamed to ``out``: a reader sees the whole
    directory or none of it."""
    hf.eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        hf.save_pretrained(tmp)
        hf_tok.save_pretrained(tmp)
        _usual_modes(tmp)
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _usual_modes(directory: Path) -> None:
    """Give ``directory`` and its files the modes ``mkdir`` and ``open`` would under the
    process's umask: ``mkdtemp`` makes a 0700 directory, and some files are written 0600, so
    the export would otherwise be unreadable by anyone else (a shared model directory)."""
    directory.chmod(usual_mode(directory=True))
    for f in directory.iterdir():
        if f.is_file():
            f.chmod(usual_mode())


def export_seq2seq(model, tok: Tokenizer, out: str | os.PathLike) -> Path:
    """Write ``model`` (a Seq2SeqTransformer) and ``tok`` as a transformers directory ``out``
    (PegasusForConditionalGeneration + PreTrainedTokenizerFast), atomically (a temporary
    directory renamed into place). UnfaithfulExport naming the feature when no transformers
    class computes the same function; ValueError when ``out`` exists and is not empty."""
    from transformers import PegasusForConditionalGeneration

    c = model.config
    _check_seq2seq(c)
    out = check_out(out)
    cfg = pegasus_config(
        c,
        vocab_size=c.src_vocab_size,
        encoder_layers=c.num_encoder_layers,
        decoder_layers=c.num_decoder_layers,
        encoder_attention_heads=c.nhead,
        decoder_attention_heads=c.nhead,
        encoder_ffn_dim=c.dim_feedforward,
        decoder_ffn_dim=c.dim_feedforward,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        tie_word_embeddings=True,
    )
    hf = PegasusForConditionalGeneration(cfg)
    state = _pegasus_state(model)
    table = pegasus_table(c.max_len, c.d_model)
    for stack in ("encoder", "decoder"):
        state[f"model.{stack}.embed_positions.weight"] = table.clone()
    load_all(hf, state, _TIED)
    return write_atomically(hf, hf_tokenizer(tok), out)


def pegasus_config(c, **kw):
    """A ``PegasusConfig`` with what every attnkit model shares from its config ``c`` (width,
    activation, positions, special ids; embeddings scaled by sqrt(d_model)) and ``kw``."""
    from transformers import PegasusConfig

    return PegasusConfig(
        d_model=c.d_model,
        activation_function=c.activation,
        max_position_embeddings=c.max_len,
        scale_embedding=True,
        pad_token_id=c.pad_id,
        bos_token_id=c.bos_id,
        eos_token_id=c.eos_id,
        decoder_start_token_id=c.bos_id,
        forced_eos_token_id=None,
        **kw,
    )


def load_all(hf, state: dict[str, Tensor], tied: tuple[str, ...] = ()) -> None:
    """Load ``state`` into the transformers model ``hf``; every weight but the ``tied`` ones
    (shared with another) must be in it, and nothing else."""
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:  # pragma: no cover - the mappings cover every weight
        raise UnfaithfulExport(f"export: weights left unmapped: {missing or unexpected}")


_TIED = (
    "lm_head.weight",
    "model.encoder.embed_tokens.weight",
    "model.decoder.embed_tokens.weight",
)
