"""``attnkit tune``'s measurements: the constants of :class:`~attnkit.kernels.tuning.Tuning`
timed on this machine, in well under a minute.

Each measurement is a function in :data:`MEASUREMENTS` that takes the :class:`Budget` and
returns a :class:`Found`: the constants it settles and what it saw, in words. Every timing
compares ways of computing the same call in one process, alternately (A B A B ...). A choice
between candidates decides on the median of the per-pair ratios and keeps their spread
(:func:`attnkit.kernels.tuning.rules.choose`): a candidate replaces the value in use only when it is
faster beyond the spread, and the decision's :class:`~attnkit.kernels.tuning.sureness.Sureness`
is stored (``attnkit info`` shows it). Cost measurements keep the fastest of a few repeats
(noise from other processes only adds time). When unsure (the candidates within ``Budget.margin``
of each other), a measurement keeps the choice that loses least: dense over blocksparse, the
built-in value over a new one.

Adding a constant: a field in :class:`~attnkit.kernels.tuning.Tuning` and a function here,
appended to :data:`MEASUREMENTS`, that returns it in ``Found.values``.

Shape legend: ``B`` batch, ``H`` heads, ``L`` sequence length, ``d`` head width.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from datetime import datetime, timezone

import torch

from attnkit import masks as M
from attnkit.calls import parse
from attnkit.functional import additive_attention, scaled_dot_product_attention
from attnkit.kernels.blocksparse.emptiness import empty_blocks
from attnkit.kernels.policy import scan
from attnkit.kernels.tuning import DEFAULT, Tuning, current, use
from attnkit.kernels.tuning.results import Budget, Found, Tuned
from attnkit.kernels.tuning.rules import (
    choose,
    element_rule,
    least_empty,
    near_margin,
    ratio_stats,
    split_k_ranges,
)
from attnkit.kernels.tuning.sureness import Sureness
from attnkit.kernels.tuning.timing import best_times, median_time, pairs, race_times

__all__ = ["MEASUREMENTS", "Budget", "Found", "Tuned", "tune"]


def _qkv(b: int, h: int, lq: int, d: int = 64, lk: int | None = None) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    lk = lq if lk is None else lk
    q = torch.randn((b, h, lq, d), generator=g)
    return q, torch.randn((b, h, lk, d), generator=g), torch.randn((b, h, lk, d), generator=g)


def _empty_fraction(mask: M.Mask, lq: int, lk: int, bq: int, bkv: int) -> float:
    """Fraction of (bq x bkv) blocks empty in every element of an unbatched mask."""
    return float((mask.block_map(lq, lk, bq, bkv) == M.EMPTY).float().mean())


def _race(q, k, v, mask, reps: int, backends=("dense", "blocksparse")) -> dict[str, list]:
    """Seconds of every alternate repeat of each backend on one call."""
    fns = {
        b: (lambda b=b: scaled_dot_product_attention(q, k, v, mask, backend=b)) for b in backends
    }
    with torch.inference_mode():
        return race_times(fns, reps)


def _dense_ratio(r: dict[str, list]) -> tuple[float, float]:
    """(median, spread) of dense time / blocksparse time over the raced pairs."""
    median, spread, _ = ratio_stats(r["dense"], r["blocksparse"])
    return median, spread


# ---------------------------------------------------------------------------------------------
# the measurements
# ---------------------------------------------------------------------------------------------
def crossover(budget: Budget) -> Found:
    """``blocksparse_min_empty``: the least empty-block fraction from which auto takes
    blocksparse, as :func:`~attnkit.kernels.tuning.rules.least_empty` sets it from the median
    times of sliding windows raced on both backends (B=1, H=8, d=64, L = budget.length and
    half of it; forward): the threshold of least summed time over the measured calls."""
    t = current()
    bq, bkv = t.blocksparse_block_q, t.blocksparse_block_kv
    seen, points, races = [], [], []
    for length in sorted({budget.length, max(256, budget.length // 2)}):
        q, k, v = _qkv(1, 8, length)
        for keep in (0.7, 0.5, 0.3):  # fraction of the keys a window reaches
            mask = M.sliding_window(max(1, int(keep * length / 2)))
            frac = round(_empty_fraction(mask, length, length, bq, bkv), 3)
            if frac == 0.0:
                continue
            r = _race(q, k, v, mask, pairs(budget.reps))
            ratio, spread = _dense_ratio(r)
            points.append((frac, median_time(r["dense"]), median_time(r["blocksparse"])))
            races.append((ratio, spread))
            seen.append(f"L={length} {frac:.0%} empty {ratio:.2f}x +/- {spread:.2f}")
    sure = {"blocksparse_min_empty": Sureness(1.0, 0.0, 0, "nothing raced: default kept")}
    least = DEFAULT.blocksparse_min_empty
    if points:
        least = least_empty(points, DEFAULT.blocksparse_min_empty, budget.margin)
        sure["blocksparse_min_empty"] = near_margin(
            races, budget.margin, pairs(budget.reps), "summed times decided"
        )
    return Found(
        {"blocksparse_min_empty": least},
        "blocksparse/dense speed by empty blocks: " + ", ".join(seen),
        sureness=sure,
    )


def _padded(b: int, h: int, length: int, d: int, lengths: torch.Tensor):
    """(q, k, v, key padding mask, skipped entries per per-element call as dispatch counts
    them, or None when dispatch would not consult the threshold for this call)."""
    q, k, v = _qkv(b, h, length, d)
    mask = M.key_padding(lengths)
    t = current()
    call = parse("dot", q, k, v, mask, scale=d**-0.5, select=False).call
    e = empty_blocks(call, t.blocksparse_block_q, t.blocksparse_block_kv)
    decides = e.every < t.blocksparse_min_empty <= e.each
    return q, k, v, mask, (e.skipped_per_call if decides else None)


def element_calls(budget: Budget) -> Found:
    """``blocksparse_element_call_entries``: blocksparse (one SDPA call per batch element and
    query block) against dense on key padding that varies per element, at the sizes real calls
    have: BERT-like batches (B=32, d=32, lengths L/16..L, H = 4, 8, 12 at L = 256, and H = 12
    at L = 512) and, with the full budget, two elements of full and quarter length (H=8, d=64,
    the lengths of :func:`crossover`). Sizes are the skipped score entries per call as
    dispatch counts them (:func:`~attnkit.kernels.blocksparse.emptiness.empty_blocks`). Every
    case is raced in two passes (the second in reverse order; their difference widens the
    spread); the threshold follows :func:`~attnkit.kernels.tuning.rules.element_rule` (unsure
    sizes keep the built-in default)."""
    g = torch.Generator().manual_seed(0)
    cases = [(32, h, 256, 32) for h in (4, 8, 12)]
    if budget.length >= 1024:
        cases.append((32, 12, 512, 32))
    for length in sorted({budget.length // 2, budget.length}):
        if length >= 1024:
            cases.append((2, 8, length, 64))
    raced: list[tuple[str, float, tuple]] = []  # (shape, skipped per call, (q, k, v, mask))
    for b, h, length, d in cases:
        if b == 2:
            lengths = torch.tensor([length, length // 4])
        else:
            lengths = torch.randint(length // 16, length + 1, (b,), generator=g)
            lengths[0] = length  # a batch is padded to its longest element
        q, k, v, mask, per_call = _padded(b, h, length, d, lengths)
        if per_call is not None:  # forced: no speed reason applies
            raced.append((f"({b},{h},{length},{d})", per_call, (q, k, v, mask)))
    if not raced:
        return Found({}, "no measured call reached the per-element threshold")
    # two passes, the second in reverse order: a drift of the machine between the cases shows
    # as a difference between the passes and widens the spread
    reps = pairs(budget.reps)
    runs = {name: [_race(*args, reps)] for name, _, args in raced}
    for name, _, args in reversed(raced):
        runs[name].append(_race(*args, reps))
    seen, points, spreads = [], [], []
    default = DEFAULT.blocksparse_element_call_entries
    for name, per_call, _ in raced:
        first, second = runs[name]
        both = {n: first[n] + second[n] for n in first}
        ratio, spread = _dense_ratio(both)
        drift = abs(_dense_ratio(first)[0] - _dense_ratio(second)[0]) / 2
        spread = max(spread, drift)
        points.append((per_call, ratio, spread))
        spreads.append((ratio, spread))
        seen.append(f"{name} {per_call:,.0f}/call {ratio:.2f}x +/- {spread:.2f}")
    sure = near_margin(spreads, budget.margin, 2 * reps, "the built-in default kept")
    return Found(
        {"blocksparse_element_call_entries": element_rule(points, default, budget.margin)},
        "per-element calls against dense (two passes): " + ", ".join(seen),
        sureness={"blocksparse_element_call_entries": sure},
    )


def blocks(budget: Budget) -> Found:
    """``blocksparse_block_q`` / ``blocksparse_block_kv``: the fastest of a few block sizes on
    a sliding window leaving about half the blocks empty (B=1, H=8, L = budget.length)."""
    length = budget.length
    q, k, v = _qkv(1, 8, length)
    mask = M.sliding_window(length // 4)
    t0 = current()
    cands = [(128, 64), (64, 64), (256, 64), (128, 128)]
    tunings = {  # the band block follows the block: this mask is a band too
        (bq, bkv): dataclasses.replace(
            t0, blocksparse_block_q=bq, blocksparse_block_kv=bkv, blocksparse_band_block_q=bq
        )
        for bq, bkv in cands
    }
    fns = {c: (lambda t=t: _with(t, q, k, v, mask)) for c, t in tunings.items()}
    with torch.inference_mode():
        raced = race_times(fns, pairs(budget.reps))
    best, sure = choose(raced, (t0.blocksparse_block_q, t0.blocksparse_block_kv), budget.margin)
    shown = ", ".join(f"{a}x{b} {median_time(raced[(a, b)]) * 1e3:.1f} ms" for a, b in raced)
    return Found(
        {"blocksparse_block_q": best[0], "blocksparse_block_kv": best[1]},
        f"window L/4, L={length}: {shown}",
        sureness={"blocksparse_block_q": sure, "blocksparse_block_kv": sure},
    )


def band_block(budget: Budget) -> Found:
    """``blocksparse_band_block_q``: the fastest query block of a narrow band's forward
    (sliding window 128: 257 keys per query; B=1, H=8, L = 4 * budget.length), and
    ``blocksparse_band_backward_block_q``, its backward's (:func:`_band_backward_block`)."""
    q, k, v = _qkv(1, 8, 4 * budget.length)
    mask, t0 = M.sliding_window(128), current()
    tunings = {bq: dataclasses.replace(t0, blocksparse_band_block_q=bq) for bq in (16, 32, 64, 128)}
    fns = {bq: (lambda t=t: _with(t, q, k, v, mask)) for bq, t in tunings.items()}
    with torch.inference_mode():
        raced = race_times(fns, pairs(budget.reps))
    best, sure = choose(raced, t0.blocksparse_band_block_q, budget.margin)
    shown = ", ".join(f"{bq} rows {median_time(s) * 1e3:.1f} ms" for bq, s in raced.items())
    back, back_sure, back_shown = _band_backward_block(budget, mask, t0)
    return Found(
        {"blocksparse_band_block_q": best, "blocksparse_band_backward_block_q": back},
        f"window 128, L={4 * budget.length}: {shown}; forward+backward, "
        f"L={2 * budget.length}: {back_shown}",
        sureness={"blocksparse_band_block_q": sure, "blocksparse_band_backward_block_q": back_sure},
    )


def _band_backward_block(budget: Budget, mask, t0: Tuning):
    """(``blocksparse_band_backward_block_q``, how sure, what was measured): the fastest
    backward block of the same band, forward and backward (B=1, H=8, L = 2 * budget.length)."""
    q, k, v = (t.requires_grad_() for t in _qkv(1, 8, 2 * budget.length))
    go = torch.ones_like(q)

    def step(t: Tuning) -> None:
        _with(t, q, k, v, mask).backward(go)
        q.grad = k.grad = v.grad = None

    cands = {
        bq: dataclasses.replace(t0, blocksparse_band_backward_block_q=bq) for bq in (32, 64, 128)
    }
    raced = race_times({bq: (lambda t=t: step(t)) for bq, t in cands.items()}, pairs(budget.reps))
    best, sure = choose(raced, t0.blocksparse_band_backward_block_q, budget.margin)
    shown = ", ".join(f"{bq} rows {median_time(s) * 1e3:.1f} ms" for bq, s in raced.items())
    return best, sure, shown


def _with(t: Tuning, q, k, v, mask):
    """blocksparse attention under the tuning ``t``."""
    with use(t):
        return scaled_dot_product_attention(q, k, v, mask, backend="blocksparse")


def planner_costs(budget: Budget) -> Found:
    """``planner_flops`` / ``planner_call_s``: one SDPA call's throughput at (1, 8, 512, 64)
    and the time of a tiny call (1, 8, 16, 64), the planner's two cost terms."""
    big, tiny = _qkv(1, 8, 512), _qkv(1, 8, 16)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with torch.inference_mode():
        times = best_times({"big": lambda: sdpa(*big)}, max(3, budget.reps))
        times.update(best_times({"tiny": lambda: sdpa(*tiny)}, 50))
    flops = 4 * 8 * 512 * 512 * 64 / max(times["big"] - times["tiny"], 1e-9)
    flops = min(max(flops, 1e8), 1e14)
    cost = Sureness(1.0, 0.0, 0, "a measured cost, not a choice: the fastest of its repeats")
    call_s = min(max(times["tiny"], 1e-7), 1e-2)
    return Found(
        {"planner_flops": float(f"{flops:.3g}"), "planner_call_s": float(f"{call_s:.3g}")},
        f"SDPA {flops / 1e9:.1f} Gflop/s, {call_s * 1e6:.0f} us per call",
        sureness={n: cost for n in ("planner_flops", "planner_call_s")},
    )


def scan_threads(budget: Budget) -> Found:
    """``scan_threaded_min``: with torch's threads, from how many entries (q, k and v
    together) torch's threaded max beats the serial bit scan; the built-in value on one
    thread or without numba."""
    if torch.get_num_threads() < 2:
        return Found({}, "one torch thread: the threaded scan never runs")
    sizes = [2**20, 2**22, 2**24] if budget.length >= 1024 else [2**18, 2**20]
    seen, least, points = [], None, []
    for n in sizes:
        x = torch.randn(n // 3)
        if scan.absmax_bits(x) is None:
            return Found({}, "numba is not usable: the bit scan never runs")
        raced = race_times(
            {
                "bits": lambda x=x: scan.absmax_bits(x),
                "torch": lambda x=x: scan.absmax_torch(x),
            },
            5 * budget.reps,
        )
        ratio, spread, _ = ratio_stats(raced["bits"], raced["torch"])
        points.append((ratio, spread))
        seen.append(f"{n:,} entries: threaded {ratio:.2f}x +/- {spread:.2f}")
        if ratio - spread >= budget.margin and least is None:
            least = n
        elif ratio - spread < budget.margin:
            least = None  # must win beyond the noise at every larger size
    found = {"scan_threaded_min": least if least is not None else 2 * sizes[-1]}
    sure = near_margin(points, budget.margin, 5 * budget.reps, "the serial scan kept")
    return Found(
        found,
        "threaded torch max against the bit scan: " + ", ".join(seen),
        sureness={"scan_threaded_min": sure},
    )


def additive_tiles(budget: Budget) -> Found:
    """``additive_block_q`` / ``additive_block_k`` / ``numba_parts_per_thread``: the fastest
    tile of the fused additive kernels (forward and backward, B=2, H=4, L = budget.length / 4,
    causal), then the fastest work split with that tile."""
    from attnkit.kernels.numba.runtime import numba_missing

    if numba_missing():
        return Found({}, numba_missing() or "numba is not usable")
    n = max(128, budget.length // 4)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn((2, 4, n, 32), generator=g).requires_grad_() for _ in range(3))
    wq, wk = torch.randn((32, 32), generator=g) / 6, torch.randn((32, 32), generator=g) / 6
    wv = torch.randn((32,), generator=g)
    mask = M.causal()

    def timed(t: Tuning) -> Callable[[], None]:
        def run():
            with use(t):
                additive_attention(q, k, v, wq, wk, wv, mask).sum().backward()

        return run

    t0 = current()
    tiles = [(32, 128), (16, 128), (64, 128), (32, 256)]
    fns = {
        c: timed(dataclasses.replace(t0, additive_block_q=c[0], additive_block_k=c[1]))
        for c in tiles
    }
    times = race_times(fns, pairs(budget.reps))
    best, sure = choose(times, (t0.additive_block_q, t0.additive_block_k), budget.margin)
    tile = dataclasses.replace(t0, additive_block_q=best[0], additive_block_k=best[1])
    parts = {p: timed(dataclasses.replace(tile, numba_parts_per_thread=p)) for p in (2, 4, 8)}
    ptimes = race_times(parts, pairs(budget.reps))
    bp, psure = choose(ptimes, t0.numba_parts_per_thread, budget.margin)
    shown = ", ".join(f"{a}x{b} {median_time(times[(a, b)]) * 1e3:.0f} ms" for a, b in times)
    shown += "; parts/thread " + ", ".join(
        f"{p}: {median_time(s) * 1e3:.0f} ms" for p, s in ptimes.items()
    )
    return Found(
        {"additive_block_q": best[0], "additive_block_k": best[1], "numba_parts_per_thread": bp},
        f"additive fwd+bwd, L={n}: {shown}",
        sureness={
            "additive_block_q": sure,
            "additive_block_k": sure,
            "numba_parts_per_thread": psure,
        },
    )


def decode_split_k(budget: Budget) -> Found:
    """``decode_split_k_ranges``: per range of k and v bytes, whether a float32 decode step
    (q (1, 8, 1, 64)) runs on the numba split-K kernel or on torch ops. Both are raced
    alternately at each size; :func:`~attnkit.kernels.tuning.rules.split_k_ranges` gives torch ops
    the sizes where they are faster beyond the spread of the races (ties keep the kernel: both read
    the same bytes). Without numba: not measured."""
    from attnkit.kernels.decode.kernel import attend
    from attnkit.kernels.decode.split_k import numba_missing

    if numba_missing():
        return Found({}, numba_missing() or "numba is not usable")
    sizes = [512, 2048, 8192, 32768] if budget.length >= 1024 else [512, 2048]
    reps = 10 * budget.reps
    seen, points = [], []
    for lk in sizes:
        q, k, v = _qkv(1, 8, 1, lk=lk)
        fns = {s: (lambda s=s, x=(q, k, v): attend(*x, None, 0.125, s)) for s in (False, True)}
        with torch.inference_mode():
            raced = race_times(fns, reps)
        ratio, spread, _ = ratio_stats(raced[False], raced[True])
        points.append((2 * k.numel() * k.element_size(), ratio, spread))
        seen.append(f"Lk {lk}: split-K {ratio:.2f}x +/- {spread:.2f}")
    ranges, sure = split_k_ranges(points, budget.margin, reps)
    return Found(
        {"decode_split_k_ranges": ranges},
        "float32 decode, split-K kernel against torch ops: " + ", ".join(seen),
        sureness={"decode_split_k_ranges": sure},
    )


MEASUREMENTS: tuple[Callable[[Budget], Found], ...] = (
    planner_costs,
    blocks,
    band_block,
    crossover,
    element_calls,
    scan_threads,
    additive_tiles,
    decode_split_k,
)
"""What ``attnkit tune`` measures, in order (later ones use the constants earlier ones set)."""


def tune(budget: Budget | None = None, progress: Callable[[str], None] | None = None) -> Tuned:
    """Run every measurement in :data:`MEASUREMENTS` under ``budget`` (default: the full one)
    and return the tuning they settle, each measured field marked with today's date. Nothing
    is stored (``attnkit tune`` does that); the tuning in use is restored afterwards."""
    budget = Budget() if budget is None else budget
    if not isinstance(budget, Budget):
        raise TypeError(f"budget: expected a Budget, got {type(budget).__name__}")
    start = time.perf_counter()
    t, found, sure = DEFAULT, [], {}
    with use(DEFAULT):
        for measure in MEASUREMENTS:
            if progress is not None:
                progress(measure.__name__)
            t0 = time.perf_counter()
            with use(t):
                f = measure(budget)
            f = dataclasses.replace(f, seconds=time.perf_counter() - t0)
            t = dataclasses.replace(t, **f.values)
            sure.update(f.sureness)
            found.append((measure.__name__, f))
    names = tuple(n for _, f in found for n in f.values)
    date = datetime.now(timezone.utc).date().isoformat()
    t = dataclasses.replace(t, measured=names, measured_on=date, sureness=tuple(sure.items()))
    return Tuned(t, tuple(found), time.perf_counter() - start)
