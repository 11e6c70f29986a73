"""The decision rules of ``attnkit tune``: from measured points (a size, a speed ratio) to the
value a :class:`~attnkit.kernels.tuning.Tuning` field takes, without timing anything (so they
are tested on injected points, :mod:`attnkit.autotune` does the measuring)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Mapping, Sequence

from attnkit.kernels.tuning import ranges as tuning_ranges
from attnkit.kernels.tuning.sureness import Sureness

__all__ = [
    "choose",
    "element_points",
    "element_rule",
    "element_threshold",
    "least_empty",
    "near_margin",
    "ratio_stats",
    "split_k_ranges",
]


def ratio_stats(base: Sequence[float], other: Sequence[float]) -> tuple[float, float, int]:
    """(median, spread, pairs) of the per-pair ratios ``base[i] / other[i]`` of two candidates
    raced alternately (> 1: ``other`` faster). The spread is half the interquartile range
    (0 with fewer than 4 pairs' worth of quartiles: then the min-max half range)."""
    n = min(len(base), len(other))
    if n == 0:
        raise ValueError("times: expected at least one raced pair, got none")
    ratios = sorted(b / max(o, 1e-12) for b, o in zip(base[:n], other[:n], strict=True))
    if n >= 4:
        q = statistics.quantiles(ratios, n=4, method="inclusive")
        spread = (q[2] - q[0]) / 2
    else:
        spread = (ratios[-1] - ratios[0]) / 2
    return float(statistics.median(ratios)), float(spread), n


def near_margin(
    points: Sequence[tuple[float, float]], margin: float, repeats: int, kept: str
) -> Sureness:
    """How sure a threshold set from measured (median ratio, spread) points is: the point
    whose median lies closest to ``margin`` in units of its spread gives the ratio and spread;
    the verdict says whether every point was clear of the margin beyond its spread, or which
    value (``kept``, in words) the rule fell back on where it was not."""
    if not points:
        raise ValueError("points: expected at least one (ratio, spread), got none")

    def closeness(p: tuple[float, float]) -> float:
        return abs(p[0] - margin) / max(p[1], 1e-9)

    ratio, spread = min(points, key=closeness)
    if closeness((ratio, spread)) > 1.0:
        return Sureness(ratio, spread, repeats, "clear at every measured size")
    return Sureness(ratio, spread, repeats, f"close at some sizes: {kept} where unsure")


def choose(
    times: Mapping[Hashable, Sequence[float]], base: Hashable, margin: float
) -> tuple[Hashable, Sureness]:
    """The candidate to use among raced ``times`` (candidate -> seconds per repeat, repeats
    taken alternately) and how sure that is. ``base`` (the value in use) is kept unless a
    candidate is clearly faster: its median per-pair ratio against ``base``, less the spread,
    at least ``margin``; among those, the one of highest median ratio. Without ``base`` in
    ``times``, the fastest median."""
    if base not in times:
        best = min(times, key=lambda c: statistics.median(times[c]))
        return best, Sureness(1.0, 0.0, 0, "the built-in value was not raced: fastest median")
    stats = {c: ratio_stats(times[base], t) for c, t in times.items() if c != base}
    clear = {c: st for c, st in stats.items() if st[0] - st[1] >= margin}
    if clear:
        best = max(clear, key=lambda c: clear[c][0])
        r, spread, n = clear[best]
        return best, Sureness(r, spread, n, "clear: faster beyond the noise")
    if not stats:
        return base, Sureness(1.0, 0.0, 0, "only the built-in value was raced")
    nearest = max(stats, key=lambda c: stats[c][0])
    r, spread, n = stats[nearest]
    if _verdict(r, spread, margin) is False:  # every challenger slower beyond the noise
        verdict = "clear: the built-in is fastest"
    elif r - spread < margin <= r or r < 1.0:
        verdict = "tie within the noise: kept the built-in default"
    else:
        verdict = "tie: kept the built-in default"
    return base, Sureness(r, spread, n, verdict)


def least_empty(
    points: Sequence[tuple[float, float, float]], default: float, margin: float
) -> float:
    """``blocksparse_min_empty`` from measured points (empty-block fraction, dense seconds,
    blocksparse seconds: medians of alternate races of one call each), without timing anything.

    The threshold sends every call with at least that fraction of empty blocks to blocksparse,
    so each candidate (every measured fraction, 1.0 for "only fully empty masks", and
    ``default``) gives the measured calls a summed time; the rule takes the candidate of least
    sum. A fraction's verdict thus weighs by how long its calls take: a long call that
    blocksparse halves outweighs a short one it slows by a few percent, where a per-fraction
    vote at every size let the short call decide. ``default`` stays unless the best candidate's
    sum is below the default's by ``margin`` (noise keeps the value in use). At least 0.05."""
    if not points:
        raise ValueError("points: expected at least one (fraction, dense s, blocksparse s)")

    def total(t: float) -> float:
        return sum(b if f >= t else d for f, d, b in points)

    floor = 0.05
    default = max(float(default), floor)
    candidates = sorted({max(float(f), floor) for f, _, _ in points} | {1.0, default})
    best = min(candidates, key=lambda t: (total(t), -t))  # ties: the larger (dense kept)
    return default if total(default) <= total(best) * margin else best


def _verdict(ratio: float, spread: float, margin: float) -> bool | None:
    """True: blocksparse clearly wins (ratio less spread at least ``margin``); False: it
    clearly loses (ratio plus spread below 1); None: the races cannot tell."""
    if ratio - spread >= margin:
        return True
    if ratio + spread < 1.0:
        return False
    return None


def element_points(
    points: Sequence[tuple[float, float, float]], default: float, margin: float
) -> list[tuple[float, float]]:
    """The (size, score) points :func:`element_threshold` reads, from measured (skipped
    entries per call, median ratio dense / blocksparse, spread) points: a clear win (ratio less
    spread at least ``margin``) scores its ratio less spread, a clear loss (ratio plus spread
    below 1) its ratio plus spread; an unsure point votes for the side the ``default``
    threshold puts it on (``margin`` at or above it, 0 below): when the measurement cannot
    tell, the value in use decides, as in :func:`choose`."""
    out = []
    for size, ratio, spread in points:
        v = _verdict(ratio, spread, margin)
        if v is None:
            out.append((size, margin if size >= default else 0.0))
        else:
            out.append((size, ratio - spread if v else ratio + spread))
    return out


def element_rule(points: Sequence[tuple[float, float, float]], default: int, margin: float) -> int:
    """``blocksparse_element_call_entries`` from measured (skipped entries per call, median
    ratio dense / blocksparse, spread) points: :func:`element_threshold` of
    :func:`element_points`, except where an unsure point sits next to the crossing: there the
    measurement cannot place it, so the ``default`` stays, moved only as far as needed to keep
    every clear loss below it and the nearest clear win above it."""
    t = element_threshold(element_points(points, default, margin), margin)
    verdicts = {e: _verdict(r, s, margin) for e, r, s in points}
    below = [e for e in verdicts if e < t]
    above = [e for e in verdicts if e >= t]
    if not (below and verdicts[max(below)] is None) and not (
        above and verdicts[min(above)] is None
    ):
        return t
    lo = max((e for e, v in verdicts.items() if v is False and e < t), default=0.0)
    hi = min((e for e, v in verdicts.items() if v is True and e >= t), default=float(2**40))
    return int(min(max(float(default), math.floor(lo) + 1), hi))


def element_threshold(points: Sequence[tuple[float, float]], margin: float) -> int:
    """``blocksparse_element_call_entries`` from measured points (skipped score entries per
    per-element SDPA call, dense time / blocksparse time), without timing anything.

    Per-element calls must beat dense by ``margin`` at every measured size from the threshold
    up. When they do at every size, the threshold is the smallest measured one (nothing below
    it was measured, so smaller calls keep dense); when they lose at the largest size, it is
    4x that size (auto keeps dense on every measured size); otherwise the crossover lies
    between the largest losing size and the next (winning) one, and the threshold is their
    geometric mean."""
    if not points:
        raise ValueError("points: expected at least one (entries per call, ratio), got none")
    pts = sorted((float(e), float(r)) for e, r in points)
    first = len(pts)
    while first > 0 and pts[first - 1][1] >= margin:
        first -= 1
    if first == len(pts):
        return int(min(2**40, 4 * pts[-1][0]))
    if first == 0:
        return max(1, math.ceil(pts[0][0]))
    return max(1, math.ceil(math.sqrt(pts[first - 1][0] * pts[first][0])))


def split_k_ranges(
    points: Sequence[tuple[int, float, float]], margin: float, repeats: int = 0
) -> tuple[tuple[tuple[int, str], ...], Sureness]:
    """``decode_split_k_ranges`` from measured points (k and v bytes, median per-pair ratio
    torch-ops time / split-K time, its spread), without timing anything, and how sure.

    Split-K is the built-in route, so a size goes to torch ops only where torch is clearly
    faster: the ratio plus its spread below ``1 / margin``; ties keep split-K. Between two
    measured sizes of different routes the bound is their geometric mean; below the smallest
    and above the largest measured size the nearest point's route holds. ``repeats``: the
    races behind each point (recorded in the :class:`Sureness`)."""
    if not points:
        raise ValueError("points: expected at least one (bytes, ratio, spread), got none")
    pts = sorted((int(b), float(r), float(s)) for b, r, s in points)
    routes = [
        tuning_ranges.TORCH if r + s < 1.0 / margin else tuning_ranges.SPLIT_K for _, r, s in pts
    ]
    ranges: list[tuple[int, str]] = []
    for i in range(len(pts) - 1):
        if routes[i] != routes[i + 1]:
            bound = max(1, math.ceil(math.sqrt(pts[i][0] * pts[i + 1][0])))
            if not ranges or bound > ranges[-1][0]:
                ranges.append((bound, routes[i]))
    ranges.append((tuning_ranges.TOP, routes[-1]))
    ranges = list(tuning_ranges.checked("decode_split_k_ranges", ranges))
    torch_pts = [
        (r, s) for (_, r, s), w in zip(pts, routes, strict=True) if w == tuning_ranges.TORCH
    ]
    if torch_pts:  # the least clear of the torch wins: how sure the change from split-K is
        r, s = max(torch_pts)
        sure = Sureness(1.0 / r, s / r**2, repeats, "clear: torch ops faster in some ranges")
    else:
        r, s = min((r, s) for _, r, s in pts)
        sure = Sureness(r, s, repeats, "split-K never clearly slower: kept at every size")
    return tuple(ranges), sure
