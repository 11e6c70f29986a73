"""The mask catalogue's NumPy reference against attnkit's own materialize (two independent
computations of every mask kind: a disagreement is a bug in one of them), and the gradient
reference against float64 autograd."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnkit import reference as R
from tests.support import grads as G
from tests.support.masks import CATALOGUE, KINDS, make_case, reduce_grad, ref_mask
from tests.support.numerics import rel_err

SHAPES = [((), 1, 1), ((), 7, 97), ((2, 3), 13, 5), ((3,), 97, 7), ((2, 3), 129, 130)]


def _materialized(mask, batch, lq, lk):
    """The mask as attnkit materializes it, lifted like the reference's NumPy mask."""
    if mask is None or isinstance(mask, torch.Tensor):
        return ref_mask(mask, batch, lq, lk)
    nb, extra = len(mask.batch_shape), len(batch) - len(mask.batch_shape)

    def lift(a):
        return a.reshape(a.shape[:nb] + (1,) * extra + a.shape[-2:])

    allowed = lift(mask.materialize(lq, lk).numpy())
    bias = mask.materialize_bias(lq, lk)
    if bias is None:
        return allowed
    return np.where(allowed, lift(bias.detach().double().numpy()), -np.inf)


CASES = [  # only the kinds defined at each batch shape
    pytest.param(kind, *shape, id=f"{kind}-{shape}")
    for shape in SHAPES
    for kind in KINDS
    if CATALOGUE[kind][1] <= len(shape[0])
]


@pytest.mark.parametrize("kind,batch,lq,lk", CASES)
def test_ref_mask_matches_materialize(kind, batch, lq, lk):
    spec = make_case(kind, batch, lq, lk, seed=lq * 7 + lk)
    want = _materialized(spec.mask, batch, lq, lk)
    got = ref_mask(spec, batch, lq, lk)
    if want is None:
        assert got is None
        return
    shape = np.broadcast_shapes(np.shape(want), np.shape(got))
    np.testing.assert_array_equal(np.broadcast_to(got, shape), np.broadcast_to(want, shape))


@pytest.mark.parametrize("kind", ["tensor_float_grad", "raw_float_grad", "window&tensor_grad"])
def test_dot_gradients_match_autograd(kind):
    """G.dot (q, k, v and a float mask's gradient through reduce_grad) against torch autograd
    of the plain float64 formula."""
    gen = torch.Generator().manual_seed(5)
    batch, lq, lk = (2, 3), 6, 9
    q, k, v = (torch.randn(*batch, n, 4, generator=gen, dtype=torch.float64) for n in (lq, lk, lk))
    spec = make_case(kind, batch, lq, lk, gen)
    m = ref_mask(spec, batch, lq, lk)
    t = R.scaled_dot_product(q.numpy(), k.numpy(), v.numpy(), m)
    d_out = np.random.default_rng(0).standard_normal(t.output.shape)
    g = G.dot(t, d_out)
    leaf, shape, nb = spec.leaves()[0]
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    bias = torch.as_tensor(_materialized(spec.mask, batch, lq, lk))  # -inf where disallowed
    s = xs[0] @ xs[1].transpose(-1, -2) / 2 + bias
    out = torch.softmax(s, -1) @ xs[2]
    out.backward(torch.from_numpy(d_out))
    for x, name in zip(xs, "qkv"):
        assert rel_err(x.grad, g[name]) < 1e-12, name
    leaf.grad = None
    s = q @ k.transpose(-1, -2) / 2 + _torch_bias(spec, batch, lq, lk)
    (torch.softmax(s, -1) @ v).backward(torch.from_numpy(d_out))
    assert rel_err(leaf.grad, reduce_grad(g["bias"], shape, nb).reshape(leaf.shape)) < 1e-12


def _torch_bias(spec, batch, lq, lk):
    """The mask's leaf tensor broadcast as a score bias, keeping its autograd link."""
    leaf, shape, nb = spec.leaves()[0]
    full = batch + (lq, lk)
    if nb < 0:
        x = leaf.reshape((1,) * (len(full) - leaf.dim()) + tuple(leaf.shape))
    else:
        x = leaf.reshape(tuple(shape[:nb]) + (1,) * (len(batch) - nb) + tuple(shape[nb:]))
    allowed = torch.as_tensor(np.broadcast_to(ref_mask(spec, batch, lq, lk), full) != -np.inf)
    return torch.where(allowed, x.expand(full), -torch.inf)
