"""One mask catalogue for every test, and its reference computed without attnkit.

A :class:`Spec` describes a mask by its parameters. ``spec.mask`` is what a user passes as
``mask=`` (an attnkit mask object, a plain tensor, or None), built once; ``ref_mask(spec, batch,
Lq, Lk)`` is the same mask as the NumPy array :mod:`attnkit.reference` takes (bool, or float64
with -inf where disallowed), computed from the parameters with NumPy one-liners, never through
attnkit's own ``materialize``. Specs mirror attnkit's constructors and combine with ``&``/``|``::

    spec = S.sliding_window(4) & S.causal("bottom_right")
    out = F.scaled_dot_product_attention(q, k, v, spec.mask)
    ref = R.scaled_dot_product(q_np, k_np, v_np, ref_mask(spec, batch, Lq, Lk))

``make_case(name, batch, Lq, Lk, seed)`` builds the catalogue entry ``name`` (every mask kind
and combination, see ``CATALOGUE``) for inputs with batch dims ``batch``, or returns None when
the kind does not apply to that batch shape (it needs a batch or a heads dim). ``EMPTY_BLOCKS``
hints which kinds leave empty blocks at long lengths (for tests of block skipping);
``MASK_SHAPES`` and ``block_diag`` are plain-tensor masks of the peers' suites.

Batch alignment: mask objects line their batch dims up with the *leading* batch dims of q (so
singletons are inserted after them); plain tensors (``S.raw``) broadcast right-aligned.
Float mask tensors made with ``grad=True`` are leaves that require grad; ``spec.leaves()`` lists
them with the shape they broadcast from, for checking their gradients (:func:`reduce_grad`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import torch

from attnkit import masks as M


def _ij(lq: int, lk: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(lq)[:, None], np.arange(lk)[None, :]


def _lift(a: np.ndarray, nb: int, to: int) -> np.ndarray:
    """Insert singleton dims after the first ``nb`` (leading-aligned batch dims)."""
    return a.reshape(a.shape[:nb] + (1,) * (to - nb) + a.shape[nb:])


def _np(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    return t.numpy() if t.dtype == torch.bool else t.double().numpy()


class Spec:
    """A mask by its parameters: ``mask`` (built once) and ``dense(Lq, Lk)``."""

    nb = 0  # batch dims of the mask, aligned with the leading batch dims of q
    raw = False  # a plain tensor passed as ``mask=`` (right-aligned broadcasting)

    def build(self):
        raise NotImplementedError

    def dense(self, lq: int, lk: int) -> tuple[np.ndarray, np.ndarray | None]:
        """(allowed bool, bias float64 or None), each with ``nb`` batch dims + (Lq, Lk)."""
        raise NotImplementedError

    def leaves(self) -> list[tuple[torch.Tensor, tuple[int, ...], int]]:
        """Float mask tensors that require grad: (tensor, its shape as (b.., Lq, Lk), nb)."""
        return []

    @functools.cached_property
    def mask(self):
        return self.build()

    def __and__(self, other: Spec) -> Spec:
        return _Combo(self, other, "&")

    def __or__(self, other: Spec) -> Spec:
        return _Combo(self, other, "|")


class _Fn(Spec):
    """A spec from a builder and a dense function (most kinds)."""

    def __init__(self, build: Callable, dense: Callable, nb: int = 0, leaves=()) -> None:
        self._build, self._dense, self.nb, self._leaves = build, dense, nb, list(leaves)

    def build(self):
        return self._build()

    def dense(self, lq, lk):
        return self._dense(lq, lk)

    def leaves(self):
        return self._leaves


class _Combo(Spec):
    def __init__(self, a: Spec, b: Spec, op: str) -> None:
        self.a, self.b, self.op, self.nb = a, b, op, max(a.nb, b.nb)

    def build(self):
        return self.a.mask & self.b.mask if self.op == "&" else self.a.mask | self.b.mask

    def dense(self, lq, lk):
        (aa, ab), (ba, bb) = self.a.dense(lq, lk), self.b.dense(lq, lk)
        aa, ba = _lift(aa, self.a.nb, self.nb), _lift(ba, self.b.nb, self.nb)
        ab = None if ab is None else _lift(ab, self.a.nb, self.nb)
        bb = None if bb is None else _lift(bb, self.b.nb, self.nb)
        if self.op == "|":
            return aa | ba, None  # attnkit refuses | with a bias
        bias = bb if ab is None else ab if bb is None else ab + bb
        return aa & ba, bias

    def leaves(self):
        return self.a.leaves() + self.b.leaves()


class _Raw(Spec):
    raw = True

    def __init__(self, t: torch.Tensor | None) -> None:
        self.t = t

    def build(self):
        return self.t

    def leaves(self):
        t = self.t
        return [(t, tuple(t.shape), -1)] if t is not None and t.requires_grad else []


def _float_dense(a: np.ndarray):
    allowed = a != -np.inf
    return allowed, np.where(allowed, a, 0.0)


# --- constructors mirroring attnkit.masks ---------------------------------------------------
def none() -> Spec:
    return _Raw(None)


def raw(t: torch.Tensor) -> Spec:
    """A plain bool/float tensor passed as ``mask=`` (right-aligned)."""
    return _Raw(t)


def causal(alignment: str = "top_left") -> Spec:
    def dense(lq, lk):
        i, j = _ij(lq, lk)
        return j <= i + (lk - lq if alignment == "bottom_right" else 0), None

    return _Fn(lambda: M.causal(alignment), dense)


def sliding_window(left: int, right: int | None = None, alignment: str = "top_left") -> Spec:
    r = left if right is None else right

    def dense(lq, lk):
        i, j = _ij(lq, lk)
        d = j - i - (lk - lq if alignment == "bottom_right" else 0)
        return (d >= -left) & (d <= r), None

    return _Fn(lambda: M.sliding_window(left, right, alignment), dense)


def key_padding(lengths) -> Spec:
    n = np.asarray(lengths)
    return _Fn(
        lambda: M.key_padding(lengths),
        lambda lq, lk: (np.broadcast_to(_ij(lq, lk)[1] < n[:, None, None], (len(n), lq, lk)), None),
        nb=1,
    )


def document(ids, kv_ids=None) -> Spec:
    a = np.asarray(ids)
    b = a if kv_ids is None else np.asarray(kv_ids)
    return _Fn(
        lambda: M.document(ids, kv_ids),
        lambda lq, lk: (a[..., :, None] == b[..., None, :], None),
        nb=a.ndim - 1,
    )


def prefix_lm(prefix_len) -> Spec:
    p = np.asarray(prefix_len)
    pb = p[:, None, None] if p.ndim else p

    def dense(lq, lk):
        i, j = _ij(lq, lk)
        return np.broadcast_to((j < pb) | (j <= i), p.shape + (lq, lk)), None

    return _Fn(lambda: M.prefix_lm(prefix_len), dense, nb=p.ndim)


def predicate(fn: Callable, batch_size: int | None = None, num_heads: int | None = None) -> Spec:
    """``fn(b, h, q_idx, kv_idx)`` written with operators only, so it runs on NumPy arrays too."""
    shape = (batch_size or 1, num_heads) if num_heads else (batch_size,) if batch_size else ()

    def dense(lq, lk):
        nb = len(shape)
        b = np.arange(batch_size).reshape((-1,) + (1,) * (nb + 1)) if batch_size else 0
        h = np.arange(num_heads)[:, None, None] if num_heads else 0
        return np.broadcast_to(fn(b, h, *_ij(lq, lk)), shape + (lq, lk)), None

    return _Fn(lambda: M.from_predicate(fn, batch_size, num_heads), dense, nb=len(shape))


def tensor(t: torch.Tensor, grad: bool = False) -> Spec:
    """``M.from_tensor(t)``: bool (True = may attend) or float (added; -inf disallows)."""
    if grad:
        t = t.detach().clone().requires_grad_()
    nb = t.dim() - 2
    a = _np(t)
    dense = (
        (lambda lq, lk: (a, None)) if t.dtype == torch.bool else (lambda lq, lk: _float_dense(a))
    )
    leaves = [(t, tuple(t.shape), nb)] if grad else []
    return _Fn(lambda: M.from_tensor(t), dense, nb=nb, leaves=leaves)


def additive(t: torch.Tensor, grad: bool = False) -> Spec:
    """``M.from_additive(t)``: a float mask added to the scores."""
    s = tensor(t, grad)
    t = s._leaves[0][0] if grad else t
    return _Fn(lambda: M.from_additive(t), s._dense, nb=s.nb, leaves=s._leaves)


def key_padding_mask(m: torch.Tensor, grad: bool = False) -> Spec:
    """``M.from_key_padding_mask(m)``, m (B, Lk): bool True = *ignore*, or float added."""
    if grad:
        m = m.detach().clone().requires_grad_()
    a = _np(m)[:, None, :]

    def dense(lq, lk):
        if a.dtype == np.bool_:
            return np.broadcast_to(~a, (a.shape[0], lq, lk)), None
        al, bias = _float_dense(a)
        return np.broadcast_to(al, (a.shape[0], lq, lk)), np.broadcast_to(
            bias, al.shape[:1] + (lq, lk)
        )

    leaves = [(m, (m.shape[0], 1, m.shape[1]), 1)] if grad else []
    return _Fn(lambda: M.from_key_padding_mask(m), dense, nb=1, leaves=leaves)


def alibi(slope: float) -> Spec:
    def dense(lq, lk):
        i, j = _ij(lq, lk)
        return np.ones((lq, lk), bool), -slope * np.abs(j - (i + lk - lq)).astype(np.float64)

    return _Fn(lambda: M.alibi(slope), dense)


# --- the reference ---------------------------------------------------------------------------
def ref_mask(spec: Spec | torch.Tensor | None, batch: tuple[int, ...], lq: int, lk: int):
    """``spec`` as the reference's NumPy mask for inputs with batch dims ``batch``: None, a bool
    array, or float64 (bias, -inf where disallowed); a plain tensor is converted as is."""
    if spec is None or isinstance(spec, torch.Tensor):
        return None if spec is None else _np(spec)
    if spec.raw:
        return None if spec.t is None else _np(spec.t)
    allowed, bias = spec.dense(lq, lk)
    allowed = _lift(np.asarray(allowed), spec.nb, len(batch))
    if bias is None:
        return allowed
    return np.where(allowed, _lift(np.asarray(bias, np.float64), spec.nb, len(batch)), -np.inf)


def reduce_grad(full: np.ndarray, shape: tuple[int, ...], nb: int) -> np.ndarray:
    """The gradient of a mask leaf from the score gradient ``full`` (batch + (Lq, Lk)): summed
    over the dims the leaf broadcasts along. ``shape`` is the leaf as (b.., Lq|1, Lk) with
    ``nb`` leading-aligned batch dims, or nb = -1 for a right-aligned plain tensor."""
    nbatch = full.ndim - 2
    if nb < 0:
        lifted = (1,) * (full.ndim - len(shape)) + tuple(shape)
    else:
        lifted = tuple(shape[:nb]) + (1,) * (nbatch - nb) + tuple(shape[nb:])
    axes = tuple(a for a, (n, f) in enumerate(zip(lifted, full.shape)) if n == 1 and f != 1)
    return full.sum(axis=axes, keepdims=True).reshape(lifted)


# --- plain tensor masks: broadcast shapes and block-diagonal references ----------------------
MASK_SHAPES = [
    lambda b, h, lq, lk: (b, 1, 1, lk),
    lambda b, h, lq, lk: (1, 1, lq, lk),
    lambda b, h, lq, lk: (lq, lk),
    lambda b, h, lq, lk: (1, lk),
    lambda b, h, lq, lk: (b, h, lq, lk),
    lambda b, h, lq, lk: (1, h, 1, lk),
    lambda b, h, lq, lk: (b, 1, lq, 1),
]
"""The shapes a plain bool/float mask tensor broadcasts from to (b, h, Lq, Lk) (PyTorch's SDPA
tests): per key, per query, per head, full."""


def block_diag(q_seqlens, kv_seqlens, causal=None) -> torch.Tensor:
    """The (Lq, Lk) bool mask of packed sequences (xformers' BlockDiagonalMask): query run i
    attends to key run i only; ``causal`` "top_left" or "bottom_right" within each block."""
    lq, lk = sum(q_seqlens), sum(kv_seqlens)
    m = torch.zeros(lq, lk, dtype=torch.bool)
    q0 = k0 = 0
    for a, b in zip(q_seqlens, kv_seqlens):
        blk = torch.ones(a, b, dtype=torch.bool)
        if causal == "top_left":
            blk = blk.tril()
        elif causal == "bottom_right":
            blk = blk.tril(diagonal=b - a)
        m[q0 : q0 + a, k0 : k0 + b] = blk
        q0, k0 = q0 + a, k0 + b
    return m


def ids(seqlens) -> torch.Tensor:
    """Document ids of packed sequences of lengths ``seqlens`` (0 for the first, 1, ...)."""
    return torch.cat([torch.full((n,), i) for i, n in enumerate(seqlens)])


# --- the catalogue ---------------------------------------------------------------------------
def sorted_ids(gen: torch.Generator, b: int, n: int) -> torch.Tensor:
    """(b, n) sorted document ids, 1-3 documents per row."""
    return torch.sort(torch.randint(0, 3, (b, n), generator=gen), dim=-1).values


def _key_padding(batch, lq, lk, g):
    lengths = torch.randint(0, lk + 1, (batch[0],), generator=g)
    lengths[0] = 0  # one batch element without any valid key
    return key_padding(lengths)


def _tensor_bool(batch, lq, lk, g):
    t = torch.rand((lq, lk), generator=g) < 0.6
    t[0] = False  # a fully masked row
    return tensor(t)


def _tensor_float(batch, lq, lk, g, grad=False):
    t = torch.randn((batch[0], lq, lk), generator=g, dtype=torch.float64)
    drop = torch.rand((batch[0], lq, lk), generator=g) < 0.3
    return tensor(t.masked_fill(drop, -math.inf), grad)


def _kpm(batch, lq, lk, g):
    m = torch.rand((batch[0], lk), generator=g) < 0.4  # True = ignore
    m[-1] = True  # the last batch element ignores every key
    return key_padding_mask(m)


def _kpm_float(batch, lq, lk, g, grad=False):
    m = torch.randn((batch[0], lk), generator=g, dtype=torch.float64)
    return key_padding_mask(m.masked_fill(torch.rand(m.shape, generator=g) < 0.3, -math.inf), grad)


def _additive(batch, lq, lk, g, grad=False):
    t = torch.randn((lq, lk), generator=g, dtype=torch.float64)
    return additive(torch.where(torch.rand((lq, lk), generator=g) < 0.2, -math.inf, t), grad)


def _extreme(batch, lq, lk, g):
    """A float mask of huge but finite negative biases (P2: never a sentinel): entries of -1e30,
    one row all -1e300 (beyond float32: saturates, P5) and one all -inf (masked, P1)."""
    t = torch.randn((lq, lk), generator=g, dtype=torch.float64)
    t = torch.where(torch.rand((lq, lk), generator=g) < 0.3, -1e30, t)
    t[0] = -1e300
    t[-1] = -math.inf if lq > 1 else t[-1]
    return additive(t)


def _raw_float_heads(batch, lq, lk, g, grad=False):
    # right-aligned (last batch dim, 1, Lk): differs from the mask objects' leading alignment
    shape = (batch[-1], 1, lk) if batch else (1, lk)
    t = torch.randn(shape, generator=g, dtype=torch.float64)
    t = t.masked_fill(torch.rand(shape, generator=g) < 0.3, -math.inf)
    return raw(t.requires_grad_() if grad else t)


def _document(batch, lq, lk, g, sort=True):
    ids, kv = sorted_ids(g, batch[0], lq), sorted_ids(g, batch[0], lk)
    if not sort:
        ids, kv = ids[:, torch.randperm(lq, generator=g)], kv[:, torch.randperm(lk, generator=g)]
    return document(ids, kv)


def _pred(b, h, qi, kj):
    return (qi * 3 + kj) % 5 != 0


def _pred_bh(b, h, qi, kj):
    return ((qi + 2 * kj + b + 3 * h) % 4) != 0


# name -> (factory(batch, lq, lk, gen) -> Spec, batch dims the kind needs)
CATALOGUE: dict[str, tuple[Callable, int]] = {
    "none": (lambda *a: none(), 0),
    "causal_tl": (lambda *a: causal(), 0),
    "causal_br": (lambda *a: causal("bottom_right"), 0),
    "window": (lambda *a: sliding_window(3), 0),
    "window_asym": (lambda *a: sliding_window(1, 4), 0),
    "window_br": (lambda *a: sliding_window(2, 0, "bottom_right"), 0),
    "window&causal": (lambda *a: sliding_window(4) & causal(), 0),
    "key_padding": (_key_padding, 1),
    "key_padding_b1": (lambda b, lq, lk, g: key_padding([max(1, lk // 2)]), 1),
    "document": (_document, 1),
    "document_1d": (
        lambda b, lq, lk, g: document(sorted_ids(g, 1, lq)[0], sorted_ids(g, 1, lk)[0]),
        0,
    ),
    "document_unsorted": (lambda b, lq, lk, g: _document(b, lq, lk, g, sort=False), 1),
    "prefix_lm": (lambda *a: prefix_lm(3), 0),
    "prefix_lm_batch": (
        lambda b, lq, lk, g: prefix_lm(torch.randint(0, lk + 1, (b[0],), generator=g)),
        1,
    ),
    "predicate": (lambda *a: predicate(_pred), 0),
    "predicate_bh": (lambda b, lq, lk, g: predicate(_pred_bh, batch_size=b[0], num_heads=b[1]), 2),
    "tensor_bool": (_tensor_bool, 0),
    "tensor_float": (_tensor_float, 1),
    "tensor_float_grad": (lambda b, lq, lk, g: _tensor_float(b, lq, lk, g, grad=True), 1),
    "key_padding_mask": (_kpm, 1),
    "key_padding_mask_float": (lambda b, lq, lk, g: _kpm_float(b, lq, lk, g, grad=True), 1),
    "additive": (_additive, 0),
    "additive_grad": (lambda b, lq, lk, g: _additive(b, lq, lk, g, grad=True), 0),
    "additive_extreme": (_extreme, 0),
    "alibi": (lambda *a: alibi(0.3), 0),
    "alibi&causal": (lambda *a: alibi(0.3) & causal("bottom_right"), 0),
    "causal&additive_grad": (lambda b, lq, lk, g: causal() & _additive(b, lq, lk, g, grad=True), 0),
    "window&tensor_grad": (
        lambda b, lq, lk, g: sliding_window(5) & _tensor_float(b, lq, lk, g, grad=True),
        1,
    ),
    "causal|window": (lambda *a: causal() | sliding_window(0, 2), 0),
    "key_padding|prefix": (lambda b, lq, lk, g: _key_padding(b, lq, lk, g) | prefix_lm(2), 1),
    "document&causal": (lambda b, lq, lk, g: _document(b, lq, lk, g) & causal("bottom_right"), 1),
    "raw_bool": (lambda b, lq, lk, g: raw(torch.rand((lq, lk), generator=g) < 0.5), 0),
    "raw_float_heads": (_raw_float_heads, 0),
    "raw_float_grad": (lambda b, lq, lk, g: _raw_float_heads(b, lq, lk, g, grad=True), 0),
    "all_masked": (lambda b, lq, lk, g: raw(torch.zeros((lq, lk), dtype=torch.bool)), 0),
    # combinations the block-skipping backends need (empty blocks of every pattern)
    "window_asym_br": (lambda *a: sliding_window(3, 11, alignment="bottom_right"), 0),
    "alibi&window": (lambda *a: alibi(0.1) & sliding_window(4), 0),
    "key_padding&window": (lambda b, lq, lk, g: _key_padding(b, lq, lk, g) & sliding_window(6), 1),
    "document|key_padding": (
        lambda b, lq, lk, g: (
            _document(b, lq, lk, g) | key_padding(torch.randint(0, 3, (b[0],), generator=g))
        ),
        1,
    ),
    "prefix&causal|window": (
        lambda b, lq, lk, g: (
            (prefix_lm(torch.randint(0, 4, (b[0],), generator=g)) & causal()) | sliding_window(2)
        ),
        1,
    ),
}
KINDS = tuple(CATALOGUE)

EMPTY_BLOCKS = (
    "causal_br",
    "window",
    "window_asym_br",
    "window&causal",
    "key_padding&window",
    "document",
    "document_1d",
    "document&causal",
    "prefix_lm_batch",
    "alibi&window",
)
"""Hint: the kinds that leave most blocks empty at long lengths (Lq, Lk of about 1000, blocks
of 16 to 128) whatever their random draws, so a block-skipping backend's plans (bands,
documents, rows) are exercised there; the other kinds leave few or no blocks to skip at length
and are tested at short lengths with small blocks."""


def make_case(name: str, batch: tuple[int, ...], lq: int, lk: int, seed) -> Spec | None:
    """Catalogue entry ``name`` for batch dims ``batch`` (None when it needs more batch dims);
    ``seed`` is an int or a ``torch.Generator`` to draw from."""
    factory, needs = CATALOGUE[name]
    if len(batch) < needs:
        return None
    gen = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
    return factory(tuple(batch), lq, lk, gen)
