"""Size ranges as a tuned value: which route serves a call of a given size, per range of sizes.

A value is a sorted tuple of ``(upper bound in bytes, route)`` pairs: a size goes to the first
range whose bound is above it (each range covers ``[previous bound, bound)``, the first from 0),
and the last bound is :data:`TOP` (sizes from there keep the last route). One threshold ("the
kernel from N bytes on") cannot say "the kernel below N bytes, torch ops above"; ranges can.
Used by :class:`~attnkit.kernels.tuning.values.Tuning`'s ``decode_split_k_ranges``.
"""

from __future__ import annotations

__all__ = ["ROUTES", "SPLIT_K", "TOP", "TORCH", "checked", "from_min_bytes", "route_at", "words"]

SPLIT_K = "split-k"
"""The route of the numba split-K decode kernel."""

TORCH = "torch"
"""The route of torch ops (a GEMV-like matmul per step)."""

ROUTES = (SPLIT_K, TORCH)

TOP = 2**40
"""The last range's bound: every size a call can hold lies below it."""

Ranges = tuple[tuple[int, str], ...]


def checked(name: str, value: object) -> Ranges:
    """``value`` as ranges (lists from JSON become tuples), adjacent ranges with the same route
    merged; ValueError/TypeError naming ``name`` when it is not a valid one."""
    if not isinstance(value, (tuple, list)) or not value:
        raise TypeError(f"{name}: expected a non-empty sequence of (bound, route), got {value!r}")
    out: list[tuple[int, str]] = []
    for item in value:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise TypeError(f"{name}: expected (bound in bytes, route) pairs, got {item!r}")
        bound, route = item
        if isinstance(bound, bool) or not isinstance(bound, int) or not 0 < bound <= TOP:
            raise ValueError(f"{name}: expected bounds as integers in (0, 2**40], got {bound!r}")
        if route not in ROUTES:
            raise ValueError(f"{name}: expected a route in {ROUTES}, got {route!r}")
        if out and bound <= out[-1][0]:
            raise ValueError(f"{name}: expected increasing bounds, got {bound} after {out[-1][0]}")
        if out and out[-1][1] == route:
            out[-1] = (bound, route)
        else:
            out.append((bound, route))
    if out[-1][0] != TOP:
        raise ValueError(f"{name}: expected the last bound to be 2**40, got {out[-1][0]}")
    return tuple(out)


def route_at(ranges: Ranges, nbytes: int) -> str:
    """The route of a call holding ``nbytes``."""
    for bound, route in ranges:
        if nbytes < bound:
            return route
    return ranges[-1][1]


def from_min_bytes(least: int) -> Ranges:
    """The ranges of an old single threshold "split-K from ``least`` bytes on"."""
    if least <= 0:
        return ((TOP, SPLIT_K),)
    if least >= TOP:
        return ((TOP, TORCH),)
    return ((int(least), TORCH), (TOP, SPLIT_K))


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def words(ranges: Ranges) -> str:
    """The ranges in words, e.g. ``"split-K below 4 MiB, torch ops from there"``."""
    name = {SPLIT_K: "split-K", TORCH: "torch ops"}
    if len(ranges) == 1:
        return f"{name[ranges[0][1]]} at every size"
    parts, low = [], 0
    for bound, route in ranges:
        if bound == TOP:
            parts.append(f"{name[route]} from {_size(low)}")
        elif low == 0:
            parts.append(f"{name[route]} below {_size(bound)}")
        else:
            parts.append(f"{name[route]} from {_size(low)} to {_size(bound)}")
        low = bound
    return ", ".join(parts)
