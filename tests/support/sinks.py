"""Softcapping and sinks written out in float64 torch (transformers' eager formula), the
autograd reference of tests/kernels/test_sinks_softcap.py and test_blocksparse_softcap_sinks.py,
and the comparison with its tolerance."""

from __future__ import annotations

import numpy as np
import torch

from tests.support.numerics import TOL, rel_err


def torch_reference(q, k, v, allowed, bias, scale, cap, sinks):
    """Float64 torch, as transformers' eager functions (Gemma 2, gpt-oss): scores, cap, bias,
    -inf where not allowed, the sink column appended and dropped after the softmax. Rows with
    no finite logit give 0 (attnkit's rule without a sink)."""
    s = (q @ k.transpose(-1, -2)) * scale
    if cap is not None:
        s = torch.tanh(s / cap) * cap
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = s.masked_fill(~allowed, -torch.inf)
    col = torch.full(s.shape[:-1] + (1,), -torch.inf, dtype=s.dtype)
    if sinks is not None:
        col = sinks[:, None, None].expand(col.shape)
    z = torch.cat([s, col], -1)
    m = z.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, 0)
    e = torch.exp(z - m)
    tot = e.sum(-1, keepdim=True)
    w = (e / torch.where(tot == 0, 1, tot))[..., :-1]
    return w @ v, w


def check_close(got, ref, dtype, what):
    err = rel_err(got, ref)
    floor = 1e-12 if dtype == torch.float64 else 1e-6  # absolute, for results that are ~0
    ok = err <= TOL[dtype] or float(np.abs(got - ref).max()) <= floor
    assert ok, f"{what}: relative error {err:.3g} > {TOL[dtype]:g}"
