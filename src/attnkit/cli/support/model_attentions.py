"""The ``--model`` option of ``attnkit view`` and ``attnkit explain``: which model, and its
attention weights on a text.

An ``attnkit train`` run or checkpoint directory runs on attnkit's own model
(:mod:`attnkit.cli.support.own_attentions`). ``default``, or a directory whose config says
``model_type: bert`` (or no model type), runs on attnkit's own BERT
(:class:`attnkit.models.bert.BertModel`: fast, no transformers needed).
Any other model (a directory saved by transformers, or a model name in the local Hugging Face
cache) runs in transformers with attnkit's attention
(:mod:`attnkit.integrations.hf_attention_weights`). Both give the same
:class:`~attnkit.integrations.hf_attention_weights.ModelAttentions`.

``--device``: :func:`choose` puts the model on the device and :func:`attentions` its inputs;
the weights come back to the host once per section, after the forward pass (stacked on the
device first, never copied layer by layer), for the page or the printout.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from attnkit.cli.support.common import UsageError, option_names
from attnkit.cli.support.options import checkpoint_of

__all__ = ["ChosenModel", "add_download_option", "attentions", "choose"]

_NAMES = {"model": "--model", "path": "--model", "download": "--download"}


def add_download_option(p: argparse.ArgumentParser) -> None:
    """``--download``: let ``--model NAME`` fetch a model missing from the local cache."""
    p.add_argument(
        "--download",
        action="store_true",
        help="with --model NAME: download the model from the Hugging Face Hub when it is not "
        "in the local cache (default: never download)",
    )


@dataclass(frozen=True)
class ChosenModel:
    """A loaded model: ``native`` (an attnkit BertModel), ``hf`` (a transformers
    ``LoadedModel``) or ``own`` (a checkpoint of ``attnkit train``), exactly one of them set;
    ``name`` is what titles show."""

    name: str
    native: Any
    hf: Any
    own: Any = (
        None  # issue 31: an attnkit run's checkpoint (attnkit.train.inference.session.Loaded)
    )


def choose(model: str, download: bool = False, device: Any = None) -> ChosenModel:
    """Locate and load ``--model`` on ``device`` (a torch.device; None: the CPU); UsageError
    naming ``--model`` for any problem."""
    import torch

    from attnkit.models.hub_cache import locate_model, model_type

    device = torch.device("cpu") if device is None else device

    with option_names(_NAMES):
        from attnkit.cli.support import own_attentions as own

        with checkpoint_of("--model"):  # also a directory it may not read
            located = locate_model(model, download=download)
            own_run = own.is_run(located.path)
        if own_run:  # attnkit train's run or checkpoint directory
            loaded = own.load(located.path)
            loaded.model.to(device)  # built on the run's device already; .to makes it sure
            return ChosenModel(located.name, None, None, loaded)
        config = located.path / "config.json"
        if not config.exists():
            raise UsageError(
                f"--model: {config}: file not found ({str(located.path)!r} is not a model "
                "directory saved by save_pretrained)"
            )
        kind = "bert" if model == "default" else model_type(located.path)
        try:
            if kind in ("bert", ""):  # no model_type: transformers cannot load it; our BERT may
                from attnkit.models.bert import BertModel

                bert = BertModel.from_pretrained(located.path).to(device)
                return ChosenModel(located.name, bert, None)
            from attnkit.integrations.hf_attention_weights import load_model

            hf = load_model(located.path, name=located.name, device=device)
            return ChosenModel(located.name, None, hf)
        except ImportError as e:
            extra = "model" if kind in ("bert", "") else "hf"
            raise UsageError(
                f"--model: a {kind or 'BERT'} model needs packages this installation lacks "
                f"({e}); install them with: pip install 'attnkit[{extra}]'"
            ) from e


def attentions(chosen: ChosenModel, text: str) -> Any:
    """The model's :class:`~attnkit.integrations.hf_attention_weights.ModelAttentions` on ``text``,
    computed on the model's device; the weights are host tensors."""
    from attnkit.integrations.hf_attention_weights import (
        AttentionSection,
        ModelAttentions,
        model_attentions,
    )

    if chosen.own is not None:
        from attnkit.cli.support.own_attentions import own_attentions

        return own_attentions(chosen.own, chosen.name, text)
    if chosen.hf is not None:
        from attnkit.integrations.hf_attention_forward import UnsupportedFeatureError

        try:
            return model_attentions(chosen.hf, text)
        except UnsupportedFeatureError as e:  # a feature attnkit's attention does not serve
            why = " ".join(str(e).split()).split("; use attn_implementation")[0]
            raise UsageError(
                f"--model: {chosen.name} cannot be shown: view and explain run transformers "
                f"models with attnkit's attention, and {why}"
            ) from e
    import torch

    model = chosen.native
    device = next(model.parameters()).device
    batch = model.tokenize([text])
    inputs = (batch.input_ids, batch.attention_mask, batch.token_type_ids)
    with torch.inference_mode():
        out = model(*(t.to(device) for t in inputs), True)
        weights = torch.stack([a[0] for a in out.attentions]).float().cpu()  # (N, H, L, L)
    tokens = list(batch.tokens[0])
    encoding = model.tokenizer.encode(text)
    offsets = [tuple(o) for o in encoding.offsets][: len(tokens)]
    special = [bool(s) for s in batch.special_tokens_mask[0].tolist()]
    limit = model.pooling.max_seq_length
    note = "rows: each token; columns: the tokens it attends to"
    section = AttentionSection("self-attention", weights, tokens, tokens, note)
    truncated = limit if len(tokens) >= limit else None
    return ModelAttentions(chosen.name, "encoder", tokens, special, offsets, (section,), truncated)
