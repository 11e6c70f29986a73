"""Masks from user data: :class:`Predicate` (a vectorised function), :class:`TensorMask` (an
explicit bool or additive float tensor), torch-style key-padding masks, and :func:`normalize`,
the one place a user's ``mask=`` argument becomes a mask object."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import torch
from torch import Tensor

from attnkit import checks, tensor_checks
from attnkit.masks.base import Mask
from attnkit.masks.blocks import Alignment, check_alignment, classify_tile, offset

__all__ = [
    "Predicate",
    "TensorMask",
    "as_mask",
    "from_additive",
    "from_key_padding_mask",
    "normalize",
]


def _check_arity(fn: Callable[..., Tensor]) -> None:
    """TypeError naming ``fn`` when its signature cannot take the four index arguments (a
    callable whose signature Python cannot read is left to its first call)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(0, 0, 0, 0)
    except TypeError:
        raise TypeError(
            f"fn: expected a predicate fn(b, h, q_idx, kv_idx) of four arguments (FlexAttention's "
            f"mask_mod form), got a callable with signature {sig}"
        ) from None


class Predicate(Mask):
    """A mask from a predicate ``fn(b, h, q_idx, kv_idx) -> bool tensor`` (FlexAttention's
    ``mask_mod`` form, True = may attend).

    ``fn`` must be vectorised: it is called with broadcastable int64 index tensors ``q_idx``
    (n, 1) and ``kv_idx`` (1, m); ``b`` is ``arange(batch_size)`` shaped (B, 1, 1) -- (B, 1, 1, 1)
    when ``num_heads`` is also given -- or a 0-d zero; ``h`` is ``arange(num_heads)`` shaped
    (H, 1, 1), or a 0-d zero. The result must broadcast to ``([B,] [H,] n, m)``; the mask's
    batch_shape is (B,), (B or 1, H) or (). ``q_idx`` counts from the first query
    (``alignment="top_left"``) or is shifted by Lk - Lq so the last query has the last key's
    index (``"bottom_right"``, for decoding with a KV cache).
    ``from_predicate(lambda b, h, q, k: (q + k) % 2 == 0)`` on 3 x 3::

        1 0 1
        0 1 0
        1 0 1

    Block maps evaluate the predicate in rows of blocks (O(block_q x Lk) memory per row, Lq x Lk
    work), so prefer the named masks when one fits.
    """

    def __init__(
        self,
        fn: Callable[..., Tensor],
        batch_size: int | None = None,
        num_heads: int | None = None,
        alignment: Alignment = "top_left",
    ) -> None:
        if not callable(fn):
            raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
        _check_arity(fn)
        if batch_size is not None:
            batch_size = checks.positive_int("batch_size", batch_size)
        if num_heads is not None:
            num_heads = checks.positive_int("num_heads", num_heads)
        self.fn = fn
        self.batch_size, self.num_heads = batch_size, num_heads
        self.alignment = check_alignment(alignment)
        if num_heads:
            self.batch_shape = (batch_size or 1, num_heads)
        else:
            self.batch_shape = (batch_size,) if batch_size else ()

    def _allowed(self, qi, kj, q_len, kv_len):
        zero = torch.zeros((), dtype=torch.long, device="cpu")
        nb = len(self.batch_shape)
        b = (
            torch.arange(self.batch_size, device="cpu").reshape((-1,) + (1,) * (nb + 1))
            if self.batch_size
            else zero
        )
        h = torch.arange(self.num_heads, device="cpu")[:, None, None] if self.num_heads else zero
        out = self.fn(b, h, qi + offset(self.alignment, q_len, kv_len), kj)
        if not isinstance(out, Tensor) or out.dtype != torch.bool:
            got = out.dtype if isinstance(out, Tensor) else type(out).__name__
            raise TypeError(f"fn: expected the predicate to return a bool tensor, got {got}")
        want = self.batch_shape + (qi.shape[0], kj.shape[1])
        try:
            return torch.broadcast_to(out, want)
        except RuntimeError:
            raise ValueError(
                f"fn: expected the predicate's result to broadcast to {want}, "
                f"got shape {tuple(out.shape)}"
            ) from None

    def _repr_fields(self):
        return {"fn": getattr(self.fn, "__name__", "fn"), "alignment": self.alignment}


class TensorMask(Mask):
    """A mask from an explicit tensor ``t``.

    A bool tensor is True = may attend. A float tensor is *added* to the scores (seed 001's
    ``M``); ``-inf`` entries disallow a key, every finite value (however negative) is a real
    bias. Shape (..., Lq, Lk): its leading dims line up with the *leading* batch dims of the
    inputs (each 1 or equal). ``attnkit.functional`` first right-aligns a tensor given as
    ``mask=`` (torch broadcasting, e.g. (Lq, Lk) or (B, 1, Lq, Lk) for (B, H, Lq, d) inputs) and
    then wraps it here (see :func:`normalize`). The bool tensor ``[[1, 0, 1], [0, 1, 1]]`` is
    simply::

        1 0 1
        0 1 1
    """

    def __init__(self, t: Tensor) -> None:
        if not isinstance(t, Tensor):
            raise TypeError(f"mask (t): expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.bool and not t.is_floating_point():
            raise TypeError(f"mask (t): expected a bool or floating tensor, got dtype {t.dtype}")
        if t.dim() < 2:
            raise ValueError(
                f"mask (t): expected a tensor of shape (..., Lq, Lk), got {tuple(t.shape)}"
            )
        self.t = t
        self.batch_shape = tuple(t.shape[:-2])
        self.has_bias = t.is_floating_point()

    def _check_len(self, q_len, kv_len):
        if tuple(self.t.shape[-2:]) != (q_len, kv_len):
            raise ValueError(
                f"mask: expected (Lq, Lk) = ({q_len}, {kv_len}) in the last two dims, "
                f"got shape {tuple(self.t.shape)}"
            )

    def _sel(self, qi, kj):
        t = self.t.index_select(-2, qi[:, 0].to(self.t.device))
        return t.index_select(-1, kj[0, :].to(self.t.device)).cpu()

    def _allowed(self, qi, kj, q_len, kv_len):
        self._check_len(q_len, kv_len)
        s = self._sel(qi, kj)
        return s if s.dtype == torch.bool else s != -math.inf

    def _bias(self, qi, kj, q_len, kv_len):
        s = self._sel(qi, kj)
        return torch.where(s == -math.inf, torch.zeros((), dtype=s.dtype, device="cpu"), s)

    def _repr_fields(self):
        return {"shape": tuple(self.t.shape), "dtype": self.t.dtype}


def from_key_padding_mask(m: Tensor) -> Mask:
    """Convert a ``torch.nn.MultiheadAttention``-style ``key_padding_mask`` (B, Lk), where
    **True means ignore**, into an attnkit mask (True = may attend). A float (B, Lk) mask is
    added to the scores of every query (``-inf`` ignores the key), as in torch.

    ``[[False, False, True]]`` (ignore the last key) becomes, for Lq = 2::

        1 1 0
        1 1 0
    """
    if not isinstance(m, Tensor):
        raise TypeError(f"key_padding_mask: expected a torch.Tensor, got {type(m).__name__}")
    if m.dtype != torch.bool and not m.is_floating_point():
        raise TypeError(f"key_padding_mask: expected bool or float, got dtype {m.dtype}")
    if m.dim() != 2 or 0 in m.shape:
        raise ValueError(f"key_padding_mask: expected (B, Lk), got shape {tuple(m.shape)}")
    return KeyColumns(m if m.is_floating_point() else ~m)


class KeyColumns(Mask):
    """Per-batch key columns: bool (B, Lk) True = may attend, or float (B, Lk) added to the
    scores of every query (built by :func:`from_key_padding_mask`)."""

    def __init__(self, cols: Tensor) -> None:
        self.cols = cols.cpu()
        self.batch_shape = (int(cols.shape[0]),)
        self.has_bias = cols.is_floating_point()

    def _check_len(self, kv_len):
        if self.cols.shape[1] != kv_len:
            raise ValueError(
                f"key_padding_mask: expected (B, Lk) with Lk={kv_len}, got {tuple(self.cols.shape)}"
            )

    def _ok(self) -> Tensor:
        c = self.cols
        return c if c.dtype == torch.bool else c != -math.inf

    def _allowed(self, qi, kj, q_len, kv_len):
        self._check_len(kv_len)
        c = self._ok()[:, kj[0, :]][:, None, :]
        return c.expand(-1, qi.shape[0], -1)

    def _bias(self, qi, kj, q_len, kv_len):
        c = self.cols[:, kj[0, :]][:, None, :]
        c = torch.where(c == -math.inf, torch.zeros((), dtype=c.dtype, device="cpu"), c)
        return c.expand(-1, qi.shape[0], -1)

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        self._check_len(kv_len)
        return classify_tile(self._ok()[:, None, :], 1, block_kv)  # (B, 1, nk)

    def _repr_fields(self):
        return {"shape": tuple(self.cols.shape), "dtype": self.cols.dtype}


def from_additive(m: Tensor) -> Mask:
    """Convert an additive float mask (added to the scores; ``-inf`` disallows, seed 001's
    ``M``) of shape (Lq, Lk) or (B, Lq, Lk) into a mask object. ``[[0, -inf], [0.5, 0]]``
    allows::

        1 0
        1 1
    """
    if not isinstance(m, Tensor) or not m.is_floating_point():
        got = m.dtype if isinstance(m, Tensor) else type(m).__name__
        raise TypeError(f"m: expected a floating tensor (additive mask), got {got}")
    if m.dim() < 2:
        raise ValueError(
            f"m: expected an additive mask (Lq, Lk) or (B, Lq, Lk), got {tuple(m.shape)}"
        )
    return TensorMask(m)


def as_mask(mask: Mask | Tensor | None) -> Mask | None:
    """A user's ``mask`` argument as a mask object: a Mask as is, a tensor wrapped in
    :class:`TensorMask` (its leading dims are the batch dims), or None. For right-aligned torch
    broadcasting against known shapes use :func:`normalize`."""
    if mask is None or isinstance(mask, Mask):
        return mask
    if isinstance(mask, Tensor):
        return TensorMask(mask)
    raise TypeError(
        "mask: expected a Mask object, a bool/float torch.Tensor or None, "
        f"got {type(mask).__name__}"
    )


def normalize(
    mask: object,
    batch_shape: tuple[int, ...],
    q_len: int,
    kv_len: int,
    device: torch.device | str | None = None,
) -> Mask | None:
    """A user's ``mask`` argument checked against attention inputs of shape
    ``batch_shape + (Lq, d)`` and ``batch_shape + (Lk, d)``, as a mask object or None.

    A tensor is right-aligned with torch broadcasting against ``batch_shape + (Lq, Lk)`` (so
    (Lq, Lk) or (B, 1, Lq, Lk) for (B, H, ...) inputs), must be bool or floating and on
    ``device``. A mask object's batch_shape must line up with the *leading* dims of
    ``batch_shape``. Lengths the mask carries (document ids, tensors, torch key-padding masks)
    are checked now, before any work. TypeError / ValueError name ``mask``.
    """
    if mask is None:
        return None
    batch_shape = tuple(batch_shape)
    target = batch_shape + (q_len, kv_len)
    if isinstance(mask, Tensor):
        if mask.dtype != torch.bool and not mask.is_floating_point():
            raise TypeError(f"mask: expected a bool or floating tensor, got dtype {mask.dtype}")
        dev = tensor_checks.device("device", device)
        if dev is not None and mask.device != dev:
            raise ValueError(f"mask: expected device {dev} like q, got {mask.device}")
        if (
            mask.dim() < 2
            or mask.dim() > len(target)
            or any(m not in (1, t) for m, t in zip(mask.shape[::-1], target[::-1]))
        ):
            raise ValueError(
                f"mask: expected a shape broadcastable to (..., Lq, Lk) = {target}, "
                f"got {tuple(mask.shape)}"
            )
        full = mask.reshape((1,) * (len(target) - mask.dim()) + tuple(mask.shape))
        return TensorMask(full.expand(full.shape[:-2] + (q_len, kv_len)))
    if not isinstance(mask, Mask):
        raise TypeError(
            "mask: expected a Mask object, a bool/float torch.Tensor or None, "
            f"got {type(mask).__name__}"
        )
    mb = mask.batch_shape
    if len(mb) > len(batch_shape) or any(m not in (1, b) for m, b in zip(mb, batch_shape)):
        raise ValueError(
            f"mask: its batch shape {mb} does not line up with the leading batch dims "
            f"{batch_shape} of the inputs"
        )
    mask.tile(0, 1, 0, 1, q_len, kv_len)  # lets the mask check its own lengths now
    return mask
