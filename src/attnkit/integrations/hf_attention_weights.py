"""Any local transformers model's attention weights on one text, through attnkit's
``attn_implementation="attnkit"`` (:mod:`attnkit.integrations.transformers`).

    loaded = load_model(path, name="gpt2")                 # a directory with config.json
    result = model_attentions(loaded, "The animal didn't cross the street")
    for section in result.sections:                        # 1 (encoder / decoder) or 3
        section.title, section.weights.shape               # (N, H, Lq, Lk)

Encoder-only models (BERT, RoBERTa, DistilBERT) and decoder-only models (GPT-2, Llama,
Mistral) give one section, their self-attention on the text. Encoder-decoder models (BART, T5,
Marian) give three: the encoder's self-attention on the text, and for the output the model
produces from it (greedy decoding, no sampling) the decoder's self-attention and its
cross-attention. Cross-attention row ``t`` is the decoder step that *produced* output token
``t``, and is labelled with that token; its keys are the text's tokens.

The model runs where :func:`load_model` put it (``device=``), its inputs beside it; the
weights come back to the host once per section, stacked on the device first.

Weights are the model's own softmax rows (``output_attentions=True``, float32): for the models
above, the same as ``attn_implementation="eager"`` to float32 rounding. Only safetensors weights
are read (never pickle), remote code is never run, and nothing is downloaded.

Shape legend: ``N`` layers, ``H`` heads, ``S`` text tokens, ``T`` output tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnkit.checks import positive_int

__all__ = ["AttentionSection", "LoadedModel", "ModelAttentions", "load_model", "model_attentions"]

_MAX_OUTPUT = 64  # longest generated output of an encoder-decoder (tokens)


@dataclass(frozen=True)
class AttentionSection:
    """One kind of attention: ``weights`` (N, H, Lq, Lk) float32 on the CPU, the query
    tokens (Lq) and key tokens (Lk) as shown, and ``note``, what the rows and columns are
    (plain words)."""

    title: str
    weights: torch.Tensor
    q_tokens: list[str]
    k_tokens: list[str]
    note: str


@dataclass(frozen=True)
class ModelAttentions:
    """A model's attention on one text.

    ``tokens`` (S) are the text's tokens as shown, ``special`` (S) marks the tokenizer's special
    tokens, ``offsets`` (S) each token's (start, end) characters in the text ((0, 0) for special
    tokens); ``sections`` hold the weights; ``truncated_to`` is the token limit the text was cut
    to (None when it fit); ``kind`` is "encoder", "decoder" or "encoder-decoder"."""

    name: str
    kind: str
    tokens: list[str]
    special: list[bool]
    offsets: list[tuple[int, int]]
    sections: tuple[AttentionSection, ...]
    truncated_to: int | None


@dataclass(frozen=True)
class LoadedModel:
    """A transformers model (eval mode, float32, attnkit's attention) with its tokenizer."""

    model: Any
    tokenizer: Any
    name: str
    kind: str


def _quiet_transformers() -> Any:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def load_model(
    path: str | Path, *, name: str | None = None, device: str | torch.device | None = None
) -> LoadedModel:
    """Load the model and tokenizer in directory ``path`` with attnkit's attention.

    Args:
        path: a directory saved by ``save_pretrained`` (config.json, ``*.safetensors``, and a
            tokenizer).
        name: the display name (default: the directory's name).
        device: where the model runs (default: the CPU). It is read on the CPU, then moved,
            so a GPU default device (``with torch.device("cuda")``) needs no accelerate.

    Raises:
        FileNotFoundError: no config.json, no safetensors weights (pickled ``.bin`` weights are
            refused), or no tokenizer.
        ValueError: a config transformers does not know.
    """
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path: expected a directory path, got {type(path).__name__}")
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model: {str(path)!r} has no config.json (not a model directory)")
    if not any(path.glob("*.safetensors")):
        raise FileNotFoundError(
            f"model: {str(path)!r} has no .safetensors weights (attnkit never loads pickled "
            ".bin weights; convert them with save_pretrained(..., safe_serialization=True))"
        )
    tf = _quiet_transformers()
    from attnkit.integrations.transformers import register

    impl = register()
    try:
        config = tf.AutoConfig.from_pretrained(path, trust_remote_code=False)
    except (ValueError, KeyError, OSError) as e:
        raise ValueError(f"model: {path / 'config.json'}: {' '.join(str(e).split())}") from None
    kind = "encoder-decoder" if getattr(config, "is_encoder_decoder", False) else "encoder"
    auto = tf.AutoModelForSeq2SeqLM if kind == "encoder-decoder" else tf.AutoModel
    archs = getattr(config, "architectures", None) or []
    if any(a.endswith("ForCausalLM") for a in archs):  # PegasusForCausalLM: the decoder alone
        kind, auto = "decoder", tf.AutoModelForCausalLM  # (its config says encoder-decoder)
    try:
        tokenizer = tf.AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (ValueError, OSError, TypeError) as e:
        raise FileNotFoundError(
            f"model: {str(path)!r}: no usable tokenizer ({' '.join(str(e).split())[:200]})"
        ) from None
    _check_weights_fit(auto, config, path)
    with torch.device("cpu"):  # under a GPU default device, transformers wants accelerate
        model = auto.from_pretrained(
            path,
            attn_implementation=impl,
            dtype=torch.float32,
            use_safetensors=True,
            trust_remote_code=False,
        ).eval()
    if device is not None:
        model.to(device)
    if kind == "encoder" and _is_causal_lm(tf, config):
        kind = "decoder"
    return LoadedModel(model, tokenizer, name or path.resolve().name, kind)


def _check_weights_fit(auto: Any, config: Any, path: Path) -> None:
    """The model that ``config`` describes, built on the meta device (shapes only, no memory),
    against the safetensors headers of ``path``: ValueError naming a mismatch before anything
    is built (:func:`attnkit.models.hf_loading.check_shapes`)."""
    from attnkit.models.hf_loading import check_shapes

    try:
        with torch.device("meta"):
            shell = auto.from_config(config, trust_remote_code=False)
    except Exception:  # noqa: BLE001 - a model that cannot be laid out on meta: transformers
        return  # checks its weights itself when it loads them
    expected = {k: tuple(v.shape) for k, v in shell.state_dict().items()}
    prefix = getattr(shell, "base_model_prefix", "") or ""
    check_shapes(path, expected, (f"{prefix}.",) if prefix else ())


def _is_causal_lm(tf: Any, config: Any) -> bool:
    """A decoder-only model: its saved architecture is a causal LM, or its model type has a
    causal LM in transformers and no masked LM (GPT-2, Llama, Mistral; not BERT or RoBERTa)."""
    if getattr(config, "is_decoder", False):
        return True
    archs = getattr(config, "architectures", None) or []
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return True
    names = tf.models.auto.modeling_auto
    causal = config.model_type in names.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return causal and config.model_type not in names.MODEL_FOR_MASKED_LM_MAPPING_NAMES


def _limit(tokenizer: Any, config: Any) -> int:
    limits = [getattr(tokenizer, "model_max_length", None)]
    for key in ("max_position_embeddings", "n_positions"):
        limits.append(getattr(config, key, None))
    ok = [int(x) for x in limits if isinstance(x, int) and 0 < x < 1_000_000]
    return min(ok) if ok else 512


def _show(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each token as text: decoded alone (byte-level BPE pieces become readable), else the
    vocabulary entry."""
    out = []
    for i, raw in zip(ids, tokenizer.convert_ids_to_tokens(ids), strict=True):
        text = tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        out.append(text.strip() or (str(raw) if raw is not None else f"<id {i}>"))
    return out


def _stack(attentions: Any) -> torch.Tensor:
    """transformers' per-layer (1, H, Lq, Lk) weights -> (N, H, Lq, Lk) float32 on the host:
    stacked where the model ran, then one copy."""
    return torch.stack([a[0] for a in attentions]).float().cpu()


def model_attentions(
    loaded: LoadedModel, text: str, *, max_output_tokens: int = _MAX_OUTPUT
) -> ModelAttentions:
    """Run ``loaded`` on ``text`` and collect every layer's and head's attention weights.

    Args:
        loaded: from :func:`load_model`.
        text: the text (cut to the model's token limit; ``truncated_to`` says so).
        max_output_tokens: encoder-decoder models: the longest output generated (greedy).

    Returns:
        :class:`ModelAttentions`: one section for encoder-only and decoder-only models,
        three (encoder self-, decoder self-, cross-attention) for encoder-decoder models.
    """
    if not isinstance(loaded, LoadedModel):
        raise TypeError(f"loaded: expected a LoadedModel, got {type(loaded).__name__}")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"text: expected a non-empty str, got {text!r}")
    max_output_tokens = positive_int("max_output_tokens", max_output_tokens)
    model, tok = loaded.model, loaded.tokenizer
    limit = _limit(tok, model.config)
    full = tok(text, add_special_tokens=True)["input_ids"]
    enc = tok(
        text,
        return_tensors="pt",
        truncation=True,
        max_length=limit,
        return_special_tokens_mask=True,
        return_offsets_mapping=bool(getattr(tok, "is_fast", False)),
    )
    ids = enc["input_ids"][0].tolist()
    tokens = _show(tok, ids)
    special = [bool(s) for s in enc["special_tokens_mask"][0].tolist()]
    if "offset_mapping" in enc:
        offsets = [(int(a), int(b)) for a, b in enc["offset_mapping"][0].tolist()]
    else:
        offsets = [(0, 0)] * len(ids)
    device = next(model.parameters()).device  # the inputs go where the model is
    inputs = {k: enc[k].to(device) for k in ("input_ids", "attention_mask")}
    truncated = limit if len(full) > limit else None
    if loaded.kind != "encoder-decoder":
        with torch.no_grad():
            out = model(**inputs, output_attentions=True)
        causal = loaded.kind == "decoder"
        note = "rows: each token; columns: the tokens it attends to" + (
            " (only itself and the tokens before it: causal)" if causal else ""
        )
        weights = _stack(out.attentions)
        sections = (AttentionSection("self-attention", weights, tokens, tokens, note),)
    else:
        sections = _seq2seq_sections(loaded, inputs, tokens, max_output_tokens)
    return ModelAttentions(loaded.name, loaded.kind, tokens, special, offsets, sections, truncated)


def _seq2seq_sections(
    loaded: LoadedModel, inputs: dict, src_tokens: list[str], max_output_tokens: int
) -> tuple[AttentionSection, ...]:
    """Greedy output, then one teacher-forced forward on it: encoder self-attention (S, S),
    decoder self-attention (T, T) and cross-attention (T, S)."""
    model, tok = loaded.model, loaded.tokenizer
    with torch.no_grad():
        seq = model.generate(
            **inputs, max_new_tokens=max_output_tokens, do_sample=False, num_beams=1
        )  # (1, 1 + T): the decoder's start token, then the T produced tokens
        out = model(**inputs, decoder_input_ids=seq[:, :-1], output_attentions=True)
    steps = seq[0].cpu().tolist()
    inputs_shown = _show(tok, steps[:-1])  # what the decoder reads at each step
    produced = _show(tok, steps[1:])  # what each step produced
    return (
        AttentionSection(
            "encoder self-attention",
            _stack(out.encoder_attentions),
            src_tokens,
            src_tokens,
            "rows and columns: the text's tokens",
        ),
        AttentionSection(
            "decoder self-attention",
            _stack(out.decoder_attentions),
            inputs_shown,
            inputs_shown,
            "rows and columns: the tokens the decoder reads at each step (its start token, "
            "then its own output so far); causal",
        ),
        AttentionSection(
            "cross-attention",
            _stack(out.cross_attentions),
            produced,
            src_tokens,
            "row t: the decoder step that produced output token t (shown on the left); "
            "columns: the text's tokens",
        ),
    )
