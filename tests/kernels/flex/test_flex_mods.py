"""The Flex translation of every mask kind (:mod:`attnkit.kernels.flex.mods`) against the
catalogue's NumPy reference (tests/support/masks.py, written without attnkit) and against
``Mask.materialize``: the ``mask_mod`` evaluated by Flex itself (``create_mask``, which calls
it under ``vmap`` on 0-d indices, as the kernels do), the score bias (``score_mod`` on a zero
score) where keys are allowed, and softcap.

Axes (hypothesis, derandomized): every catalogue kind and combination, batch dims 0-2, odd
lengths, Lq != Lk (both causal alignments are catalogue kinds), fully masked rows.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import create_mask

from attnkit import masks as M
from attnkit.kernels.flex.mods import FlexLayout, build_mods, supported_mask
from tests.support.masks import KINDS, make_case, ref_mask
from tests.support.numerics import split_mask

SETTINGS = settings(max_examples=80, deadline=None, derandomize=True, database=None)
CPU = torch.device("cpu")


def _flex_shape(batch: tuple[int, ...]) -> tuple[int, int]:
    return ((1, 1) + tuple(batch))[-2:]


def _mask_obj(kind, batch, lq, lk, seed):
    spec = make_case(kind, batch, lq, lk, seed)
    if spec is None:
        return None, None
    return spec, M.normalize(spec.mask, batch, lq, lk)


def _vmap_bias(score_mod, b, h, lq, lk):
    """score_mod(0, b, h, i, j) on the (B, H, Lq, Lk) grid, under vmap as Flex calls it."""
    from torch import vmap

    def one(bi, hi, qi, ki):
        return score_mod(torch.zeros((), dtype=torch.float32), bi, hi, qi, ki)

    f = one
    for dims in ((None, None, None, 0), (None, None, 0, None), (None, 0, None, None)):
        f = vmap(f, dims)
    f = vmap(f, (0, None, None, None))
    ar = torch.arange
    return f(ar(b), ar(h), ar(lq), ar(lk))


CASES = st.fixed_dictionaries(
    dict(
        kind=st.sampled_from([k for k in KINDS if k != "none"]),
        batch=st.sampled_from([(), (3,), (2, 3)]),
        lq=st.integers(1, 40),
        lk=st.integers(1, 40),
        seed=st.integers(0, 2**20),
    )
)


@SETTINGS
@given(c=CASES)
def test_mask_mod_and_bias_match_the_reference(c):
    batch, lq, lk = c["batch"], c["lq"], c["lk"]
    spec, mask = _mask_obj(c["kind"], batch, lq, lk, c["seed"])
    if spec is None or supported_mask(mask, len(batch)) is not None:
        return
    layout = FlexLayout(len(batch))
    mods = build_mods(mask, lq, lk, layout, CPU)
    bf, hf = _flex_shape(batch)
    allowed, bias = split_mask(ref_mask(spec, batch, lq, lk))
    want = np.broadcast_to(
        np.ones((lq, lk), bool) if allowed is None else allowed, batch + (lq, lk)
    ).reshape(bf, hf, lq, lk)
    if mods.mask_mod is None:
        assert want.all(), c
    else:
        got = create_mask(mods.mask_mod, bf, hf, lq, lk, device="cpu")
        np.testing.assert_array_equal(got.numpy(), want, err_msg=str(c))
        # and the same as attnkit's own materialisation
        mat = mask.materialize(lq, lk)
        mat = mat.reshape(
            mat.shape[: len(mask.batch_shape)]
            + (1,) * (len(batch) - len(mask.batch_shape))
            + (lq, lk)
        )
        np.testing.assert_array_equal(
            got.numpy(), np.broadcast_to(mat.numpy(), batch + (lq, lk)).reshape(bf, hf, lq, lk)
        )
    if bias is None:
        assert mods.score_mod is None, c
        return
    got = _vmap_bias(mods.score_mod, bf, hf, lq, lk).double().numpy()
    ref = np.broadcast_to(bias, batch + (lq, lk)).reshape(bf, hf, lq, lk)
    ref = np.clip(ref, -np.finfo(np.float32).max, np.finfo(np.float32).max)  # P5 saturation
    err = np.abs(np.where(want, got - ref, 0)).max(initial=0.0)
    assert err <= 1e-6 * max(1.0, np.abs(np.where(want, ref, 0)).max(initial=0.0)), c


def test_softcap_then_bias():
    """score_mod = c * tanh(s / c) + bias (the cap before the bias, as attnkit defines it)."""
    mods = build_mods(M.alibi(0.5), 3, 5, FlexLayout(0), CPU, softcap=2.0)
    s = torch.tensor(7.0)
    i, j = torch.tensor(1), torch.tensor(4)
    got = mods.score_mod(s, torch.tensor(0), torch.tensor(0), i, j)
    want = 2.0 * math.tanh(7.0 / 2.0) - 0.5 * abs(4 - (1 + 5 - 3))
    assert abs(float(got) - want) <= 1e-6


def test_softcap_without_a_mask():
    mods = build_mods(None, 4, 4, FlexLayout(2), CPU, softcap=3.0)
    assert mods.mask_mod is None and mods.bias_mod is None
    got = mods.score_mod(torch.tensor(-9.0), *(torch.tensor(0),) * 4)
    assert abs(float(got) - 3.0 * math.tanh(-3.0)) <= 1e-6


def test_unsupported_layouts_say_why():
    assert "batch dims" in supported_mask(None, 3)
    why = supported_mask(M.key_padding([1, 2]), 0)
    assert why is not None and "batch shape" in why
