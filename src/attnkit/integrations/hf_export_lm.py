"""attnkit language models (:class:`~attnkit.models.lm.TransformerLM`) written as transformers
directories that ``AutoModelForCausalLM`` loads, only when a transformers class computes the same
function; otherwise :class:`~attnkit.integrations.hf_export.UnfaithfulExport` names the feature.

- **Learned positions** (``--positions learned``) -> ``GPT2LMHeadModel``: unscaled token
  embeddings plus a learned position table (``wte``, ``wpe``, ``n_positions`` = the table's
  rows), pre-LN blocks and a final LayerNorm (``ln_f``), attention scaled by 1/sqrt(head dim),
  activation ``gelu`` (exact, erf: as attnkit's) or ``relu``, ``layer_norm_epsilon`` equal.
  GPT-2 stores its projections as ``Conv1D`` (weights transposed) with q, k and v fused in
  ``c_attn``; the biases attnkit lacks (``--no-bias``) become zeros, which changes nothing.
- **Sinusoidal positions** (the default) -> ``PegasusForCausalLM`` (Pegasus's decoder alone):
  embeddings scaled by sqrt(d_model), sinusoidal positions, pre-LN layers and a final
  LayerNorm; the width axis is permuted to Pegasus's sine/cosine layout as for the
  encoder-decoder export. Its layers carry a cross-attention that a decoder-only call never runs
  (``encoder_hidden_states`` None); its weights are written as zeros, so nothing random is
  loaded. Pegasus's LayerNorms use eps 1e-5.

Neither class has a bias on its output layer (``lm_head``): an LM trained with biases (attnkit's
default; ``--no-bias`` turns them off) is refused, as are post-LN layers (both classes normalise
first) and sliding-window attention (``--window``: both attend to the whole prefix).

The tokenizer is a ``PreTrainedTokenizerFast`` that encodes a prompt as attnkit does (no
special tokens added). ``generation_config.json`` suppresses the ids attnkit never generates
([PAD], [BOS], [UNK]), stops at [EOS] and at ``max_length`` = the position table's rows
(prompt included; issue 31), so ``model.generate`` continues a prompt as
:meth:`TransformerLM.generate <attnkit.models.lm.TransformerLM.generate>` does. Both classes
stop at the end of their position table (GPT-2's ``n_positions``, Pegasus's
``max_position_embeddings`` = the model's ``max_len``): ``model.generate()`` stops there by the
generation config, but an explicit ``max_new_tokens`` takes precedence over ``max_length`` in
transformers, and a call that asks for more positions than the table has fails inside
transformers (``IndexError``); attnkit's ``generate`` command crops the context instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import Tensor

from attnkit.integrations.hf_export import (
    UnfaithfulExport,
    check_out,
    hf_tokenizer,
    load_all,
    pegasus_config,
    pegasus_layer_weight,
    pegasus_table,
    width_permutation,
    write_atomically,
)
from attnkit.models.lm import TransformerLM
from attnkit.nn.projection import unpack

__all__ = ["export_lm", "lm_class"]

_GPT2_LAYER = {  # attnkit name inside a layer -> GPT-2's, for weights stored transposed (Conv1D)
    "self_attn.out_proj.": "attn.c_proj.",
    "linear1.": "mlp.c_fc.",
    "linear2.": "mlp.c_proj.",
    "norm1.": "ln_1.",
    "norm2.": "ln_2.",
}
_PEGASUS_NORMS = {"norm1.": "self_attn_layer_norm.", "norm2.": "final_layer_norm."}


def lm_class(config) -> str:
    """The transformers class that computes what a TransformerLM of ``config`` (an
    :class:`~attnkit.models.lm.LMConfig`) computes: "GPT2LMHeadModel" or "PegasusForCausalLM";
    UnfaithfulExport naming every feature that neither represents."""
    c = config
    learned = c.positions == "learned"
    target = "GPT2LMHeadModel" if learned else "PegasusForCausalLM"
    problems = []
    if c.bias:
        problems.append(
            "the bias of the output layer (generator.bias: GPT2LMHeadModel's and "
            "PegasusForCausalLM's output layers have none; train with --no-bias)"
        )
    if not c.norm_first:
        problems.append(f"post-LN layers (--no-norm-first: {target} normalises first)")
    if c.window is not None:
        problems.append(
            f"sliding-window attention (--window {c.window}: {target} attends to the whole prefix)"
        )
    if not learned and c.d_model % 2:
        problems.append(f"an odd d_model ({c.d_model}: Pegasus's sinusoids need an even width)")
    if not learned and c.layer_norm_eps != 1e-5:
        problems.append(f"layer_norm_eps={c.layer_norm_eps} (Pegasus uses 1e-5)")
    if problems:
        raise UnfaithfulExport(
            f"export: the language model has no faithful transformers class ({target} for its "
            f"{c.positions} positions): " + "; ".join(problems)
        )
    return target


def _attention_dropout(c) -> float:
    return c.dropout if c.attention_dropout is None else c.attention_dropout


def _t(t: Tensor) -> Tensor:
    return t.detach().float().cpu()


def _gpt2(model):
    """(GPT2LMHeadModel, state dict in GPT-2's names) of a TransformerLM."""
    from transformers import GPT2Config, GPT2LMHeadModel

    c = model.config
    drop = c.dropout
    cfg = GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.max_len,
        n_embd=c.d_model,
        n_layer=c.num_layers,
        n_head=c.nhead,
        n_inner=c.dim_feedforward,
        activation_function=c.activation,
        resid_pdrop=drop,
        embd_pdrop=drop,
        attn_pdrop=_attention_dropout(c),
        layer_norm_epsilon=c.layer_norm_eps,
        bos_token_id=c.bos_id,
        eos_token_id=c.eos_id,
        pad_token_id=c.pad_id,
        tie_word_embeddings=c.tie_embeddings,
    )
    state = {
        "transformer.wte.weight": _t(model.embed.weight),
        "transformer.wpe.weight": _t(model.positional.weight),
        "transformer.ln_f.weight": _t(model.norm.weight),
    }
    if c.bias:  # pragma: no cover - refused by lm_class (the output layer's bias)
        state["transformer.ln_f.bias"] = _t(model.norm.bias)
    if not c.tie_embeddings:
        state["lm_head.weight"] = _t(model.generator.weight)
    for i, layer in enumerate(model.layers):
        pre = f"transformer.h.{i}."
        a = layer.self_attn
        # GPT-2's c_attn packs q | k | v as attnkit does, stored transposed (Conv1D)
        state[pre + "attn.c_attn.weight"] = torch.cat([_t(w).T for w in a.in_proj.weights()], 1)
        if c.bias:
            state[pre + "attn.c_attn.bias"] = torch.cat([_t(b) for b in a.in_proj.biases()])
        for name, t in layer.state_dict().items():
            for ours, theirs in _GPT2_LAYER.items():
                if name.startswith(ours):
                    t = _t(t)
                    is_matrix = name.endswith("weight") and t.dim() == 2
                    state[pre + theirs + name[len(ours) :]] = t.T if is_matrix else t
    return GPT2LMHeadModel(cfg), state


def _pegasus(model):
    """(PegasusForCausalLM, state dict in Pegasus's names, width permuted) of a TransformerLM."""
    from transformers import PegasusForCausalLM

    c = model.config
    p = width_permutation(c.d_model)
    cfg = pegasus_config(
        c,
        vocab_size=c.vocab_size,
        encoder_layers=0,
        decoder_layers=c.num_layers,
        decoder_attention_heads=c.nhead,
        decoder_ffn_dim=c.dim_feedforward,
        dropout=c.dropout,
        attention_dropout=_attention_dropout(c),
        activation_dropout=c.dropout,
        is_decoder=True,
        is_encoder_decoder=False,
        tie_word_embeddings=c.tie_embeddings,
    )
    state = {
        "model.decoder.embed_tokens.weight": _t(model.embed.weight)[:, p].clone(),
        "model.decoder.embed_positions.weight": pegasus_table(c.max_len, c.d_model),
        "model.decoder.layer_norm.weight": _t(model.norm.weight)[p].clone(),
    }
    if not c.tie_embeddings:
        state["lm_head.weight"] = _t(model.generator.weight)[:, p].clone()
    for i, layer in enumerate(model.layers):
        for name, t in unpack(layer.state_dict()).items():  # q, k, v apart, as Pegasus
            key, t = pegasus_layer_weight(name, _t(t), p, _PEGASUS_NORMS)
            state[f"model.decoder.layers.{i}.{key}"] = t
    return PegasusForCausalLM(cfg), state


def _complete(hf, state: dict[str, Tensor], tied: bool) -> dict[str, Tensor]:
    """``state`` plus zeros for what attnkit's model lacks: biases (``--no-bias``) and the
    cross-attention a decoder-only call never runs; UnfaithfulExport for anything else."""
    out = dict(state)
    left = []
    for name, t in hf.state_dict().items():
        if name in out or (tied and name == "lm_head.weight"):
            continue
        if name.endswith(".bias") or ".encoder_attn" in name:
            out[name] = torch.zeros_like(t)
        else:  # pragma: no cover - the mappings cover every weight
            left.append(name)
    if left:  # pragma: no cover
        raise UnfaithfulExport(f"export: weights left unmapped: {left[:5]}")
    return out


def export_lm(model, tok: Tokenizer, out: str | os.PathLike) -> tuple[Path, str]:
    """Write ``model`` (a TransformerLM) and ``tok`` as a transformers directory ``out``
    (:func:`lm_class`'s class + ``PreTrainedTokenizerFast`` + ``generation_config.json``),
    atomically. Returns (the directory, the class name). UnfaithfulExport naming the feature
    when no transformers class computes the same function; ValueError when ``out`` exists and
    is not empty. Both are raised before anything is written."""
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model: expected an attnkit TransformerLM, got {type(model).__name__}")
    if not isinstance(tok, Tokenizer):
        raise TypeError(f"tok: expected a tokenizers.Tokenizer, got {type(tok).__name__}")
    if tok.get_vocab_size() > model.config.vocab_size:
        raise ValueError(
            f"tok: {tok.get_vocab_size()} tokens, more than the model's vocabulary of "
            f"{model.config.vocab_size}"
        )
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out: expected a directory path, got {type(out).__name__}")
    c = model.config
    target = lm_class(c)
    out = check_out(out)
    hf, state = _gpt2(model) if target == "GPT2LMHeadModel" else _pegasus(model)
    tied = ("lm_head.weight",) if c.tie_embeddings else ()
    load_all(hf, _complete(hf, state, c.tie_embeddings), tied)
    g = hf.generation_config
    g.bos_token_id, g.eos_token_id, g.pad_token_id = c.bos_id, c.eos_id, c.pad_id
    unk = tok.token_to_id("[UNK]")  # a placeholder for unreadable input, never text
    g.suppress_tokens = list(model.banned_ids()) + ([] if unk is None else [unk])
    g.max_length = c.max_len  # the position table: generate() stops there (prompt included)
    tokenizer = hf_tokenizer(tok, append_eos=False, model_max_length=c.max_len)
    return write_atomically(hf, tokenizer, out), target
