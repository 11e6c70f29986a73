"""Relative error and per-dtype tolerances, shared by every test that compares with a reference.

``rel_err(got, ref) = norm(got - ref) / norm(ref)`` (the absolute norm when ``ref`` is 0; an
absolute floor per entry with ``entry_floor``); ``max_rel_err``: the largest entry's error against
the largest reference entry, with an absolute floor.

Tolerances: float64 1e-10 and float32 1e-5 relative (:data:`TOL`). bfloat16 / float16 results are
held to a small multiple (:data:`HALF_FACTOR`) of the error a *plain* implementation makes at the
same dtype (:func:`plain_attention`: inputs and projections in that dtype, scores, softmax and
weighted sum in float32 as P4 asks, one rounding at the end), and never looser than that multiple
of the dtype's epsilon (the error of rounding the exact result once). Where the plain
implementation overflows (inf/NaN), only the epsilon floor remains.

:func:`tolerance` also takes a plain error for float32/float64: inputs whose softmax is
ill-conditioned at that dtype (scores of 1e3 whose gaps are O(1), gradients that cancel) are
inexact in any implementation, so the bound is ``max(TOL, HALF_FACTOR * plain error)``; the
fuzz harness measures that error with :class:`Rounding` (simulated rounding of every forward
and backward intermediate). For well-conditioned inputs it is far below TOL and the bound is TOL.

A result that cancels (a gradient that is exactly 0 by symmetry, like that of a key-projection
bias) has no meaningful relative error: :func:`magnitude_floor` also allows an absolute error
of a few roundings of the size of its terms (tests/fuzz/magnitudes.py computes that size).
"""

from __future__ import annotations

import math

import numpy as np
import torch

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
HALF_FACTOR = 4.0
HALF = (torch.bfloat16, torch.float16)


def to_np(t) -> np.ndarray:
    """A tensor (any dtype, possibly requiring grad) or array as float64 NumPy."""
    if isinstance(t, torch.Tensor):
        return t.detach().to(torch.float64).numpy()
    return np.asarray(t, dtype=np.float64)


def rel_err(got, ref, floor: float = 0.0, *, entry_floor: float = 0.0) -> float:
    """norm(got - ref) / max(norm(ref), floor, entry_floor * sqrt(ref.size)); with no floor, the
    absolute error when ref is all zero. ``entry_floor`` is an absolute floor per entry (a
    root-mean-square): a bound ``rel_err <= tol`` then also passes an error of ``tol *
    entry_floor`` per entry, for results whose true value is 0 or tiny. Shapes must match."""
    g, r = to_np(got), to_np(ref)
    assert g.shape == r.shape, (g.shape, r.shape)
    n = max(float(np.linalg.norm(r)), floor, entry_floor * math.sqrt(r.size))
    d = np.linalg.norm(g - r)
    return float(d / n) if n > 0 else float(d)


ABS_FLOOR = 1e-6
"""The absolute floor of :func:`max_rel_err`: a reference whose largest entry is below it (0, or
rounding noise around 0) is compared absolutely at this scale, never relatively against 0. The
layers and models compared with it have entries of order 1e-2..1e1, so it never binds there."""


def max_rel_err(got, ref, floor: float = ABS_FLOOR) -> float:
    """max|got - ref| / max(max|ref|, floor): the largest error against the largest reference
    entry, with an absolute floor (:data:`ABS_FLOOR`); shapes must match."""
    g, r = to_np(got), to_np(ref)
    assert g.shape == r.shape, (g.shape, r.shape)
    return float(np.abs(g - r).max(initial=0.0) / max(float(np.abs(r).max(initial=0.0)), floor))


def magnitude_floor(dtype: torch.dtype, magnitude: float) -> float:
    """The absolute error allowed in a result whose terms have total size ``magnitude`` (the
    sum of their absolute values, see tests/fuzz/magnitudes.py), besides the relative
    :func:`tolerance`: HALF_FACTOR roundings of that size at the compute dtype (P4: float32 for
    the half types). It matters only where the result cancels to far below its terms (a
    gradient that is exactly 0 by symmetry, a row with one key): there the float64 reference
    is itself rounding noise of size eps64 * magnitude, and no relative bound can hold."""
    compute = torch.float32 if dtype in HALF else dtype
    return HALF_FACTOR * torch.finfo(compute).eps * magnitude


def tolerance(dtype: torch.dtype, plain_err: float | None = None) -> float:
    """The relative-error bound for a result at ``dtype`` (see the module docstring)."""
    plain = plain_err if plain_err is not None and math.isfinite(plain_err) else 0.0
    if dtype in HALF:
        return HALF_FACTOR * max(plain, torch.finfo(dtype).eps)
    return max(TOL[dtype], HALF_FACTOR * plain)


class Rounding:
    """Simulated rounding at relative size ``eps``: ``r(x)`` returns x * (1 + eps * u) with u
    of random sign and size in [1, 2], and its gradient is perturbed the same way in the
    backward pass.

    A plain implementation that wraps every intermediate in ``r`` and runs in float64 makes the
    errors an implementation at a dtype with that epsilon makes, but independently of the
    reference's own rounding (a torch implementation can round exactly like the NumPy
    reference and then look more accurate than the problem allows). ``Rounding(0)`` is exact.

    ``stored_eps`` (the half types' unit roundoff eps/2; ``eps`` is float32's, P4): a fused
    backward (PyTorch's flash kernels, as FlashAttention's) computes the row term
    ``D_i = rowsum(dO_i ⊙ O_i)`` of ``dS = W ⊙ (dW - D)`` from the output *as returned*, rounded
    to the dtype; :func:`plain_attention` then perturbs D by ``rowsum(dO ⊙ O ⊙ stored_eps·u)``.
    Where dW - D cancels (dW_ij nearly equal across the keys of a row) this is the dominant
    error of a half-precision gradient: a bfloat16 general_attention at Lq = Lk = 2 has a dq
    error of 4 eps in PyTorch's own SDPA backward while a float32 softmax backward has 0.1 eps.
    """

    def __init__(self, eps: float = 0.0, seed: int = 0, stored_eps: float = 0.0) -> None:
        self.eps, self.gen = eps, torch.Generator().manual_seed(seed)
        self.stored_eps = stored_eps

    def stored(self, x: torch.Tensor) -> torch.Tensor:
        """``r(x)`` for a tensor the call holds at the inputs' dtype (q W, a projection): for
        the half types rounded at that dtype's unit roundoff ``stored_eps``, not float32's."""
        if not self.stored_eps:
            return self(x)
        eps, self.eps = self.eps, self.stored_eps
        try:
            return self(x)
        finally:
            self.eps = eps

    def _u(self, shape) -> torch.Tensor:
        """Random signs times magnitudes in [1, 2]: never ~0 (a perturbation of eps survives even
        when simulated in float64 itself), and two of them never cancel exactly."""
        sign = torch.randint(0, 2, shape, generator=self.gen).to(torch.float64) * 2 - 1
        return sign * (1 + torch.rand(shape, generator=self.gen, dtype=torch.float64))

    def _noise(self, x: torch.Tensor) -> torch.Tensor:
        return x * (1 + self.eps * self._u(x.shape)).to(x.dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.eps:
            return x
        d = self._noise(x.detach()) - x.detach()
        y = x + torch.where(torch.isfinite(d), d, torch.zeros((), dtype=d.dtype))
        if y.requires_grad:
            y.register_hook(self._noise)
        return y

    def recomputed_factor(self, size: torch.Tensor) -> torch.Tensor:
        """exp(eps * |size| * u), capped at e^+-1: how far weights recomputed from scores of
        magnitude ``size`` may be off."""
        size = torch.where(torch.isfinite(size), size.abs(), torch.zeros((), dtype=size.dtype))
        u = self._u(size.shape)
        return torch.exp((self.eps * size * u).clamp(-1, 1)).to(size.dtype)

    def recomputed(self, x: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
        """``x`` (shifted scores) whose gradient is off by a factor exp(eps * size * u), as when
        a backward pass recomputes exp(scores - logsumexp) from scores rounded to ``size``."""
        if not self.eps or not x.requires_grad:
            return x
        size = torch.where(torch.isfinite(size), size.abs(), torch.zeros((), dtype=size.dtype))

        def hook(g):
            u = self._u(g.shape)
            # capped: beyond a relative change of e, the recomputed weights are noise anyway
            return g * torch.exp((self.eps * size * u).clamp(-1, 1)).to(g.dtype)

        x = x + 0  # a fresh node to hook
        x.register_hook(hook)
        return x


EXACT = Rounding()


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b; for float16/bfloat16 operands computed and returned in float32 (P4: the scores of
    half inputs are computed in float32)."""
    if a.dtype in HALF:
        return a.float() @ b.float()
    return a @ b


def plain_attention(scores, v, allowed, bias, r: Rounding = EXACT):
    """softmax(scores + bias, masked) @ v, plain torch (the yardstick for :func:`tolerance`), in
    the dtype of ``scores`` (float32 for half inputs, see :func:`mm`); output and weights are
    rounded once to ``v``'s dtype. ``allowed``: NumPy bool broadcastable to scores, or None;
    ``bias``: a tensor or NumPy array broadcastable to scores, or None; ``r`` rounds every
    intermediate (:class:`Rounding`). Returns (output, weights)."""
    dt, out_dt = scores.dtype, v.dtype
    v = v.to(dt)
    scores = r(scores)
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            bias = torch.from_numpy(np.ascontiguousarray(bias))
        # P5: a finite bias beyond the dtype saturates to -+finfo.max (never becomes -inf)
        top = torch.finfo(dt).max
        b = bias.to(torch.float64)
        # straight-through: the saturated value, with the bias's gradient. (Not b + (clamped -
        # b).detach(): -1e300 + (1e300 - 3.4e38) rounds to 0 or to -1.5e284, not to -3.4e38.)
        b = b.clamp(-top, top).detach() + (b - b.detach())
        scores = r(scores + b.to(dt))
    if allowed is not None:
        ok = torch.from_numpy(np.array(allowed, dtype=bool))
        scores = scores.masked_fill(~ok, -math.inf)
        empty = ~ok.any(-1, keepdim=True)
    else:
        empty = torch.zeros((), dtype=torch.bool)
    if r is EXACT:
        w = torch.softmax(scores, dim=-1)
    else:  # written out, so that r rounds the backward's intermediates too
        m = scores.detach().amax(-1, keepdim=True)
        x = r.recomputed(r(scores - torch.where(torch.isfinite(m), m, 0.0)), scores.detach())
        box: dict = {}  # D's error from the stored output (Rounding's stored_eps), set below
        if r.stored_eps and x.requires_grad:
            x = x + 0
            x.register_hook(lambda g: g - box["w"] * box["d"] if "d" in box else g)
        e = r(torch.exp(x))
        z = r(e.sum(-1, keepdim=True))
        w = r(e / torch.where(z == 0, 1.0, z))
    w = torch.where(empty, torch.zeros((), dtype=dt), w)
    if r is not EXACT:  # the backward's dV uses recomputed weights (see Rounding.recomputed)
        wb = w.detach() * r.recomputed_factor(scores.detach())
        out = r(w @ v.detach() + (wb @ v - (wb @ v).detach()))
        if r.stored_eps and out.requires_grad:
            box["w"], o = w.detach(), out.detach()

            def stored_output(g):  # runs before x's hook: out comes later in the graph
                box["d"] = (g * o * (r.stored_eps * r._u(g.shape)).to(g.dtype)).sum(-1, True)

            out.register_hook(stored_output)
    else:
        out = w @ v
    return out.to(out_dt), w.to(out_dt)


def split_mask(ref_mask_array) -> tuple[np.ndarray | None, np.ndarray | None]:
    """A reference mask (None, bool, or float with -inf) as (allowed, bias) arrays."""
    if ref_mask_array is None:
        return None, None
    m = np.asarray(ref_mask_array)
    if m.dtype == np.bool_:
        return m, None
    ok = m != -np.inf
    return ok, np.where(ok, m, 0.0)
