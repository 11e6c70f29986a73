"""Masks built from integer data: :class:`KeyPadding` (valid-key counts), :class:`Document`
(document ids) and :class:`PrefixLM` (prefix lengths)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit import checks
from attnkit.masks.band import Causal
from attnkit.masks.base import Mask
from attnkit.masks.blocks import (
    EMPTY,
    EVAL_ELEMENTS,
    FULL,
    Alignment,
    block_edges,
    check_alignment,
    classify,
    offset,
)

__all__ = ["Document", "KeyPadding", "PrefixLM"]


def _has_huge_int(x: object) -> bool:
    if isinstance(x, (list, tuple)):
        return any(_has_huge_int(y) for y in x)
    return isinstance(x, int) and not isinstance(x, bool) and abs(x) > checks.MAX_INT


def as_index_tensor(x: object, name: str, ndim: tuple[int, ...]) -> Tensor:
    """``x`` (ints, a sequence or an integer tensor) as a new int64 CPU tensor with one of the
    dims in ``ndim``; TypeError for non-integers, ValueError for a wrong shape or values beyond
    +-2**62 (the int64 index arithmetic of the kernels cannot represent them)."""
    if isinstance(x, Tensor):
        t = x
    else:
        try:
            t = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError, OverflowError) as e:
            if _has_huge_int(x):
                raise ValueError(
                    f"{name}: expected ints in [-2**62, 2**62], got {checks.show(x)}"
                ) from None
            raise TypeError(f"{name}: expected integers, got {type(x).__name__} ({e})") from None
    if 0 in t.shape:
        raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(t.shape)}")
    if t.is_floating_point() or t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"{name}: expected integers, got dtype {t.dtype}")
    if t.dim() not in ndim:
        want = " or ".join(map(str, ndim))
        raise ValueError(f"{name}: expected {want} dims, got shape {tuple(t.shape)}")
    t = t.detach().to(device="cpu", dtype=torch.long).clone()
    if bool(((t > checks.MAX_INT) | (t < -checks.MAX_INT)).any()):
        raise ValueError(f"{name}: expected ints in [-2**62, 2**62], got {checks.show(t.tolist())}")
    return t


def _counts(x: object, name: str, what: str) -> Tensor:
    t = as_index_tensor(x, name, (1,))
    if bool((t < 0).any()):
        raise ValueError(f"{name}: expected {what} >= 0, got {checks.show(t.tolist())}")
    return t


class KeyPadding(Mask):
    """Key padding: in batch element ``b`` only keys ``j < lengths[b]`` are valid.

    ``lengths``: (B,) integer valid-key counts in [0, 2**62]. A count of 0 leaves the rows
    without any key (they give output 0); a count larger than Lk means every key is valid
    (counts are clamped to Lk, so one mask built for the whole sequence serves every step of
    cached decoding, where Lk grows). ``key_padding([3, 1])`` with Lq = 2, Lk = 4::

        b=0: 1 1 1 0      b=1: 1 0 0 0
             1 1 1 0           1 0 0 0
    """

    def __init__(self, lengths: Tensor | list[int]) -> None:
        self.lengths = _counts(lengths, "lengths", "counts")
        self.batch_shape = (int(self.lengths.shape[0]),)

    def _allowed(self, qi, kj, q_len, kv_len):
        return kj[None] < self.lengths[:, None, None]

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        ks, ke = block_edges(kv_len, block_kv)
        n = self.lengths[:, None]
        any_in = ks[None, :] < n
        all_in = ke[None, :] < n
        return classify(all_in, any_in)[:, None, :]

    def _repr_fields(self):
        return {"lengths": self.lengths.tolist()}


def _presence(x: Tensor, block: int, n_ids: int) -> Tensor:
    """(R, L) ids in [0, n_ids) -> (R, ceil(L / block), n_ids) float32: 1 where the id occurs
    in the block."""
    r, length = x.shape
    nb = math.ceil(length / block)
    p = torch.zeros(r * nb * n_ids, dtype=torch.float32, device="cpu")
    blk = torch.arange(length, device="cpu") // block
    idx = (torch.arange(r, device="cpu")[:, None] * nb + blk[None, :]) * n_ids + x
    p[idx.flatten()] = 1.0
    return p.reshape(r, nb, n_ids)


class Document(Mask):
    """Document (block-diagonal) mask: attend only within the same document.

    ``ids``: integer document id per position, (L,) or (B, L); ``kv_ids`` for the keys when they
    differ from the queries (defaults to ``ids``; same batch layout). Ids need not be sorted;
    they must cover exactly Lq queries and Lk keys (ValueError otherwise). ids
    ``[0, 0, 1, 1, 1]`` and ids ``[0, 1, 0]``::

        [0, 0, 1, 1, 1]   [0, 1, 0]
        1 1 0 0 0         1 0 1
        1 1 0 0 0         0 1 0
        0 0 1 1 1         1 0 1
        0 0 1 1 1
        0 0 1 1 1

    Block maps are exact for any ids and cost O(L + nq * nk * n_docs), never Lq x Lk.
    """

    def __init__(self, ids: Tensor | list, kv_ids: Tensor | list | None = None) -> None:
        self.ids = as_index_tensor(ids, "ids", (1, 2))
        self.kv_ids = self.ids if kv_ids is None else as_index_tensor(kv_ids, "kv_ids", (1, 2))
        if self.ids.dim() != self.kv_ids.dim() or (
            self.ids.dim() == 2 and self.ids.shape[0] != self.kv_ids.shape[0]
        ):
            raise ValueError(
                f"kv_ids: expected the same batch layout as ids {tuple(self.ids.shape)}, "
                f"got {tuple(self.kv_ids.shape)}"
            )
        self.batch_shape = (int(self.ids.shape[0]),) if self.ids.dim() == 2 else ()

    def _check_len(self, q_len: int, kv_len: int) -> None:
        if self.ids.shape[-1] != q_len or self.kv_ids.shape[-1] != kv_len:
            raise ValueError(
                f"document: ids cover {self.ids.shape[-1]} queries and {self.kv_ids.shape[-1]} "
                f"keys, but the attention has Lq={q_len}, Lk={kv_len}"
            )

    def _allowed(self, qi, kj, q_len, kv_len):
        self._check_len(q_len, kv_len)
        a = self.ids[..., qi[:, 0]][..., :, None]
        b = self.kv_ids[..., kj[0, :]][..., None, :]
        return a == b

    def is_sorted(self) -> bool:
        """True when ids and kv_ids are non-decreasing (packed sequences)."""
        return bool((self.ids[..., 1:] >= self.ids[..., :-1]).all()) and bool(
            (self.kv_ids[..., 1:] >= self.kv_ids[..., :-1]).all()
        )

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        self._check_len(q_len, kv_len)
        qids = self.ids.reshape(-1, q_len)
        kids = self.kv_ids.reshape(-1, kv_len)
        both = torch.cat([qids.flatten(), kids.flatten()])
        lo, hi = int(both.min()), int(both.max())
        if hi - lo < both.numel():  # small id range: use the ids themselves (no sort)
            inv, n_ids = both - lo, hi - lo + 1
        else:
            uniq, inv = torch.unique(both, return_inverse=True)
            n_ids = len(uniq)
        rows = qids.shape[0]
        nq, nk = math.ceil(q_len / block_q), math.ceil(kv_len / block_kv)
        if rows * max(nq, nk) * n_ids > 4 * EVAL_ELEMENTS:  # many distinct ids: evaluate
            return super()._block_map(q_len, kv_len, block_q, block_kv)
        pq = _presence(inv[: qids.numel()].reshape(qids.shape), block_q, n_ids)
        pk = _presence(inv[qids.numel() :].reshape(kids.shape), block_kv, n_ids)
        any_in = (pq @ pk.transpose(1, 2)) > 0  # a shared id exists (exact: sums of 0/1)
        single_q = pq.sum(-1) == 1
        single_k = pk.sum(-1) == 1
        all_in = any_in & single_q[:, :, None] & single_k[:, None, :]
        out = classify(all_in, any_in)
        return out if self.batch_shape else out[0]

    def spans(self, which: str = "ids") -> list[list[tuple[int, int, int]]]:
        """Runs of equal ids per batch row: ``[[(id, start, end), ...], ...]`` (end exclusive);
        one list per batch row (a single one for (L,) ids). ``which`` is "ids" or "kv_ids"."""
        checks.choice("which", which, ("ids", "kv_ids"))
        t = self.ids if which == "ids" else self.kv_ids
        t = t.reshape(-1, t.shape[-1])
        out = []
        for row in t:
            change = (row[1:] != row[:-1]).nonzero().flatten() + 1
            starts = [0] + change.tolist()
            ends = change.tolist() + [row.shape[0]]
            out.append([(int(row[s]), s, e) for s, e in zip(starts, ends, strict=True)])
        return out

    def _repr_fields(self):
        return {"ids": tuple(self.ids.shape)}


class PrefixLM(Mask):
    """Prefix-LM mask: keys ``j < prefix_len`` are visible to all queries, the rest causally
    (``j <= i`` after alignment, as in :class:`Causal`).

    ``prefix_len``: an int in [0, 2**62], or (B,) ints per batch element; a prefix longer than
    Lk covers every key (clamped to Lk, as :class:`KeyPadding` counts). Key indices count from
    the first key in both alignments, so with a KV cache (``alignment="bottom_right"``) the
    prefix stays the first ``prefix_len`` positions of the sequence. ``prefix_lm(2)`` on 4 x 4,
    and ``prefix_lm(2, "bottom_right")`` on 2 x 5 (the last two steps of a cached decode)::

        top_left   bottom_right
        1 1 0 0    1 1 1 1 0
        1 1 0 0    1 1 1 1 1
        1 1 1 0
        1 1 1 1
    """

    def __init__(self, prefix_len: int | Tensor | list[int], alignment: Alignment = "top_left"):
        per_batch = isinstance(prefix_len, (list, tuple)) or getattr(prefix_len, "ndim", 0) > 0
        if isinstance(prefix_len, Tensor) and prefix_len.dim() == 0:
            prefix_len = prefix_len.reshape(1)
        elif not per_batch:
            prefix_len = [checks.nonnegative_int("prefix_len", prefix_len)]
        self.prefix = _counts(prefix_len, "prefix_len", "prefix lengths")
        self.batch_shape = (int(self.prefix.shape[0]),) if per_batch else ()
        self.alignment = check_alignment(alignment)

    def _p(self) -> Tensor:
        return self.prefix[:, None, None] if self.batch_shape else self.prefix[0]

    def _allowed(self, qi, kj, q_len, kv_len):
        return (kj < self._p()) | (kj <= qi + offset(self.alignment, q_len, kv_len))

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        c = Causal(self.alignment)._block_map(q_len, kv_len, block_q, block_kv)
        ks, ke = block_edges(kv_len, block_kv)
        p = self._p()
        pre_full = ke[None, :] < p  # (1, nk) or (B, 1, nk): the block's keys are all prefix
        pre_any = ks[None, :] < p
        # exact: a block is full iff causal-full or all its keys are in the prefix; empty iff
        # causal-empty and none of its keys is in the prefix
        full = (c == FULL) | pre_full
        empty = (c == EMPTY) & ~pre_any
        return classify(full, ~empty)

    def _repr_fields(self):
        p = self.prefix.tolist()
        return {"prefix_len": p if self.batch_shape else p[0], "alignment": self.alignment}
