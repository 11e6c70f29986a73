"""Element-wise dropout (kernels/dropout): the numba pass against an independent NumPy
regeneration of its documented keep mask (splitmix64 of (seed, i // 2), a 32-bit word per
element) and the float64 result x * keep / (1 - p); gradients (autograd, gradcheck, a double
backward), odd sizes across work units, threads, NaN and inf as torch's multiplication treats
them, the kept fraction (binomial bound), reproducibility from torch's seed, and what is left to
torch's own dropout.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnkit.kernels import dropout as kd
from attnkit.kernels.dropout import elementwise as ew

U64 = np.uint64


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
    return z ^ (z >> U64(31))


def keep_ref(seed: int, n: int, p: float) -> np.ndarray:
    """The keep mask of the module docstring, from its formula (NumPy uint64, wrapping)."""
    with np.errstate(over="ignore"):
        pairs = np.arange(n // 2 + n % 2, dtype=np.uint64)
        u = _mix(U64(seed) + (pairs + U64(1)) * U64(0x9E3779B97F4A7C15))
    words = np.stack([u & U64(0xFFFFFFFF), u >> U64(32)], axis=1).reshape(-1)[:n]
    return words >= U64(round(p * 2**32))


def expected(x: torch.Tensor, keep: np.ndarray, p: float) -> np.ndarray:
    """x * keep / (1 - p) in float64 (a multiplication: 0 * NaN is NaN)."""
    m = np.where(keep, 1.0 / (1.0 - p), 0.0).reshape(x.shape)
    with np.errstate(invalid="ignore"):
        return x.detach().double().numpy() * m


def close(got: torch.Tensor, ref: np.ndarray, dtype: torch.dtype) -> None:
    """Elementwise: one rounding of the factor and one of the product (2 eps relative)."""
    eps = torch.finfo(dtype).eps
    np.testing.assert_allclose(got.detach().double().numpy(), ref, rtol=2 * eps, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(8193,), (3, 97, 61), (2, ew.CHUNK + 3)])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.93])
def test_forward_and_gradient_match_the_reference(dtype, shape, p) -> None:
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=g, dtype=dtype).requires_grad_()
    seed = 0x1234_5678_9ABC_DEF0 + len(shape)
    out, keep = ew.keep_scale(x.detach(), p, seed)
    ref_keep = keep_ref(seed, x.numel(), p)
    np.testing.assert_array_equal(keep.view(-1).numpy(), ref_keep)
    close(out, expected(x, ref_keep, p), dtype)
    # through autograd: the seed comes from torch's generator
    torch.manual_seed(7)
    seed = ew.draw_seed()
    torch.manual_seed(7)
    y = kd.dropout(x, p)
    ref_keep = keep_ref(seed, x.numel(), p)
    close(y, expected(x, ref_keep, p), dtype)
    dy = torch.randn(shape, generator=g, dtype=dtype)
    (dx,) = torch.autograd.grad(y, x, dy)
    close(dx, expected(dy, ref_keep, p), dtype)


def test_threads_and_units_do_not_change_the_mask() -> None:
    x = torch.randn(3 * ew.CHUNK + 5)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ew.keep_scale(x, 0.3, 99)
        torch.set_num_threads(2)
        two = ew.keep_scale(x, 0.3, 99)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
    np.testing.assert_array_equal(one[1].numpy(), keep_ref(99, x.numel(), 0.3))


def test_gradcheck_and_double_backward_in_float64() -> None:
    x = torch.randn(4, 2049, dtype=torch.float64, requires_grad=True)

    def f(t: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(3)  # the same mask at every evaluation
        return kd.dropout(t, 0.25)

    assert kd.served(x, 0.25)
    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-8, fast_mode=True)
    # double backward: the gradient is linear in the incoming gradient with the same mask
    y = f(x)
    dy = torch.randn_like(x, requires_grad=True)
    (dx,) = torch.autograd.grad(y, x, dy, create_graph=True)
    (ddy,) = torch.autograd.grad(dx.sum(), dy)
    keep = (y.detach() != 0) | (x.detach() == 0)
    torch.testing.assert_close(ddy, keep.double() / 0.75, rtol=1e-12, atol=0)


def test_nan_and_inf_propagate_as_torch_multiplies() -> None:
    n = 10_001
    x = torch.randn(n)
    x[::7] = math.nan
    x[3::11] = math.inf
    x[5::13] = -math.inf
    seed = 2024
    out, keep = ew.keep_scale(x, 0.5, seed)
    ref = expected(x, keep_ref(seed, n, 0.5), 0.5)  # dropped NaN/inf -> NaN, kept -> itself
    np.testing.assert_array_equal(np.isnan(out.numpy()), np.isnan(ref))
    finite = ~np.isnan(ref)
    np.testing.assert_allclose(out.numpy()[finite], ref[finite], rtol=2**-23, atol=0)


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9])
def test_kept_fraction_and_mean_are_unbiased(p) -> None:
    n = 1 << 20
    x = torch.ones(n)
    torch.manual_seed(11)
    y = kd.dropout(x, p)
    kept = int((y != 0).sum())
    sd = math.sqrt(n * p * (1 - p))
    assert abs(kept - n * (1 - p)) < 6 * sd
    assert abs(float(y.double().mean()) - 1.0) < 6 * sd / n / (1 - p)


def test_same_torch_seed_same_mask_other_seed_other_mask() -> None:
    x = torch.randn(50_000)
    torch.manual_seed(5)
    a = kd.dropout(x, 0.2)
    torch.manual_seed(5)
    b = kd.dropout(x, 0.2)
    c = kd.dropout(x, 0.2)  # the generator moved on
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize(
    "make, p",
    [
        (lambda: torch.randn(ew.MIN_ELEMENTS - 1), 0.1),  # small
        (lambda: torch.randn(200, 300).t(), 0.1),  # not contiguous
        (lambda: torch.randn(20_000, dtype=torch.bfloat16), 0.1),  # dtype
        (lambda: torch.randn(20_000), 0.0),
        (lambda: torch.randn(20_000), 1.0),
    ],
)
def test_what_the_kernel_leaves_to_torch_is_torchs_dropout(make, p) -> None:
    x = make()
    assert not kd.served(x, p)
    torch.manual_seed(1)
    got = kd.dropout(x, p)
    torch.manual_seed(1)
    want = torch.nn.functional.dropout(x, p, training=True)
    assert torch.equal(got, want)


def test_torch_func_transforms_take_torchs_dropout() -> None:
    x = torch.randn(3, 20_000)

    def f(t: torch.Tensor) -> torch.Tensor:
        return kd.dropout(t, 0.5).sum()

    torch.manual_seed(6)
    g = torch.func.grad(f)(x[0])
    assert set(g.unique().tolist()) <= {0.0, 2.0}
    out = torch.func.vmap(lambda t: kd.dropout(t, 0.5), randomness="different")(x)
    assert out.shape == x.shape and set((out / x).unique().tolist()) <= {0.0, 2.0}


def test_meta_tensors_are_left_to_torch() -> None:
    x = torch.empty(20_000, device="meta")
    assert not kd.served(x, 0.1)
    assert kd.dropout(x, 0.1).shape == x.shape


def test_threshold_resolves_p_to_two_to_the_minus_32() -> None:
    assert kd.threshold(0.0) == 0
    assert kd.threshold(1.0) == 2**32
    assert kd.threshold(0.1) == 429496730
