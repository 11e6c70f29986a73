"""The transformers guide's list (docs/guides/transformers.md) of the architectures that run
with ``attn_implementation="attnkit"``
is generated here: every tiny model of ``hf_models.BUILDERS`` is built, run with ``"eager"`` and
with ``"attnkit"`` on the same weights and a padded batch, and listed when the logits of every real
token agree within 1e-5 (float32). The test fails when the README's block differs from the list;
``make readme-hf`` (``ATTNKIT_WRITE_README=1``) rewrites the block."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed (pip install 'attnkit[hf]')")

sys.path.insert(0, str(Path(__file__).parent))

import hf_models as M  # noqa: E402

import attnkit.integrations.transformers as ak_hf  # noqa: E402

README = Path(__file__).resolve().parents[2] / "docs" / "guides" / "transformers.md"
START, END = "<!-- hf-architectures:start -->", "<!-- hf-architectures:end -->"


def _features(model) -> str:
    cfg = model.config
    out = []
    heads, kv = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    if heads and kv and kv < heads:
        out.append("grouped-query heads")
    if getattr(cfg, "sliding_window", None):
        out.append("sliding window")
    if getattr(cfg, "attn_logit_softcapping", None):
        out.append("logit softcapping")
    if any(n.endswith("sinks") for n, _ in model.named_parameters()):
        out.append("attention sinks")
    if getattr(cfg, "is_encoder_decoder", False):
        out.append("encoder-decoder, cross-attention")
    if cfg.model_type == "t5":
        out.append("relative position bias")
    return ", ".join(out)


def _matches(name: str) -> str | None:
    """The README line of ``name`` when attnkit's logits equal eager's, else None."""
    ak_hf.register()
    eager, ours = M.pair(name)
    ids, am = M.batch(3, 11, pad="right")
    kw = dict(input_ids=ids, attention_mask=am)
    real = am.bool()
    if name in M.ENCODER_DECODERS:
        dec = ids[:, :7].clone()
        dec[:, 0] = 2
        kw["decoder_input_ids"], real = dec, torch.ones(3, 7, dtype=torch.bool)
    with torch.no_grad():
        a, b = eager(**kw).logits[real], ours(**kw).logits[real]
    if not torch.allclose(b, a, rtol=1e-5, atol=1e-5):
        return None
    feats = _features(ours)
    line = f"- {ours.config.model_type} (`{type(ours).__name__}`)"
    return line + (f": {feats}" if feats else "")


def generated() -> str:
    lines = [line for n in sorted(M.BUILDERS) if (line := _matches(n)) is not None]
    return "\n".join([START, *lines, END])


def test_readme_lists_the_architectures_that_match_eager():
    block = generated()
    assert block.count("\n- ") == len(M.BUILDERS), f"some tiny models differ from eager:\n{block}"
    text = README.read_text(encoding="utf-8")
    assert START in text and END in text, (
        f"docs/guides/transformers.md lacks the {START} ... {END} block"
    )
    current = text[text.index(START) : text.index(END) + len(END)]
    if os.environ.get("ATTNKIT_WRITE_README") == "1" and current != block:
        tmp = README.with_suffix(".md.tmp")
        tmp.write_text(text.replace(current, block), encoding="utf-8")
        tmp.replace(README)  # atomic
        current = block
    assert current == block, (
        "docs/guides/transformers.md's architecture list is stale: run `make readme-hf`"
    )
