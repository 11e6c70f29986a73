"""The tuning as a value: :class:`Tuning` (every machine-dependent constant of dispatch and the
kernels' plans, with its default, range and source), :data:`DEFAULT`, :func:`constants` and
:func:`describe`. Below both :mod:`attnkit.kernels.tuning` (which one is in use) and
:mod:`attnkit.kernels.tuning.store` (the stored one), which read it; see
:mod:`attnkit.kernels.tuning` for what the constants decide and how to add one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from attnkit.kernels.tuning import ranges as tuning_ranges
from attnkit.kernels.tuning.sureness import Sureness

__all__ = ["BUILT_IN", "DEFAULT", "Tuning", "constants", "describe"]

BUILT_IN = "built-in default"


def _doc(text: str, lo: float, hi: float, multiple: int = 1) -> dict[str, Any]:
    """Field metadata: what the constant decides, the range a stored value must lie in, and
    (integers) what it must be a multiple of."""
    return {"doc": text, "range": (lo, hi), "multiple": multiple}


@dataclass(frozen=True)
class Tuning:
    """The constants in use (see the module docstring). Each field's metadata holds ``doc``
    (what it decides) and ``range`` (the values a stored tuning may hold).

    ``measured``: the names of the fields ``attnkit tune`` measured (kept in declaration
    order); ``measured_on``: when
    (ISO date, UTC), None for the built-in defaults."""

    blocksparse_min_empty: float = field(
        default=0.25,
        metadata=_doc(
            "least fraction of empty blocks for auto to prefer blocksparse over dense", 0.0, 1.0
        ),
    )
    blocksparse_dropout_min_empty: float = field(
        default=0.6,
        metadata=_doc("the same with dropout (explicit tiles, slower per entry)", 0.0, 1.0),
    )
    blocksparse_element_call_entries: int = field(
        default=3 * 2**15,
        metadata=_doc(
            "least score entries each per-batch-element SDPA call must skip for auto to "
            "count blocks empty in only some elements",
            1,
            2**40,
        ),
    )
    blocksparse_block_q: int = field(
        default=128, metadata=_doc("query rows per blocksparse SDPA call", 16, 4096)
    )
    blocksparse_band_block_q: int = field(
        default=32,
        metadata=_doc(
            "query rows per block of a band mask (sliding or causal window) in the forward, "
            "with or without gradients (the backward's: blocksparse_band_backward_block_q)",
            8,
            4096,
        ),
    )
    blocksparse_band_backward_block_q: int = field(
        default=64,
        metadata=_doc(
            "query rows per block of a band mask (sliding or causal window) whose call needs "
            "gradients: the backward's blocks (a block of B rows computes B + width keys)",
            8,
            4096,
        ),
    )
    blocksparse_block_kv: int = field(
        default=64, metadata=_doc("key granularity of blocksparse's key ranges", 16, 4096)
    )
    planner_flops: float = field(
        default=60e9,
        metadata=_doc("SDPA throughput (flop/s) in the blocksparse planner's cost", 1e8, 1e14),
    )
    planner_call_s: float = field(
        default=60e-6,
        metadata=_doc("fixed cost of one SDPA call (s) in the planner's cost", 1e-7, 1e-2),
    )
    scan_threaded_min: int = field(
        default=2**22,
        metadata=_doc(
            "entries of q, k and v from which the input scan uses torch's threads", 1, 2**40
        ),
    )
    numba_parts_per_thread: int = field(
        default=4, metadata=_doc("work parts per thread of a numba kernel launch", 1, 64)
    )
    additive_block_q: int = field(
        default=32,
        metadata=_doc("query rows per tile of the fused additive kernels", 4, 512, multiple=4),
    )
    additive_block_k: int = field(
        default=128, metadata=_doc("keys per tile of the fused additive kernels", 8, 2048)
    )
    decode_split_k_ranges: tuple[tuple[int, str], ...] = field(
        default=((tuning_ranges.TOP, tuning_ranges.SPLIT_K),),
        metadata={
            **_doc(
                "which float32 decode steps run on the numba split-K kernel and which on torch "
                "ops, per range of k and v bytes",
                0,
                tuning_ranges.TOP,
            ),
            "ranges": True,
        },
    )
    measured: tuple[str, ...] = ()
    measured_on: str | None = None
    sureness: tuple[tuple[str, Sureness], ...] = ()

    def __post_init__(self) -> None:
        for f in constants():
            value = getattr(self, f.name)
            if f.metadata.get("ranges"):
                object.__setattr__(self, f.name, tuning_ranges.checked(f.name, value))
                continue
            kind = int if f.type in ("int", int) else float
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{f.name}: expected {kind.__name__}, got {type(value).__name__}")
            if kind is int and not float(value).is_integer():
                raise TypeError(f"{f.name}: expected an integer, got {value!r}")
            lo, hi = f.metadata["range"]
            if not lo <= value <= hi:
                raise ValueError(f"{f.name}: expected a value in [{lo:g}, {hi:g}], got {value!r}")
            if kind is int and int(value) % f.metadata["multiple"]:
                raise ValueError(
                    f"{f.name}: expected a multiple of {f.metadata['multiple']}, got {value!r}"
                )
            object.__setattr__(self, f.name, kind(value))
        names = [f.name for f in constants()]
        unknown = sorted(set(self.measured) - set(names))
        if unknown:
            raise ValueError(f"measured: unknown constants {unknown}")
        measured = tuple(n for n in names if n in self.measured)  # declaration order
        object.__setattr__(self, "measured", measured)
        sure = dict(self.sureness)
        if not set(sure) <= set(measured) or not all(
            isinstance(v, Sureness) for v in sure.values()
        ):
            raise ValueError(
                "sureness: expected (measured constant, Sureness) pairs, "
                f"got {sorted(sure)} for measured {list(measured)}"
            )
        object.__setattr__(self, "sureness", tuple((n, sure[n]) for n in measured if n in sure))

    def sure(self, name: str) -> str:
        """How sure ``attnkit tune`` was of constant ``name``, in words."""
        if name not in self.measured:
            return "not measured on this machine"
        for n, s in self.sureness:
            if n == name:
                return s.words()
        return "not recorded (tuned by an older attnkit)"

    def decode_split_k_at(self, nbytes: int) -> bool:
        """Whether a float32 decode step holding ``nbytes`` of k and v runs on the split-K
        kernel (``decode_split_k_ranges``)."""
        return tuning_ranges.route_at(self.decode_split_k_ranges, nbytes) == tuning_ranges.SPLIT_K

    def source(self, name: str) -> str:
        """Where the value of constant ``name`` came from, in words."""
        if name in self.measured:
            return f"measured by attnkit tune on {self.measured_on or 'an unknown date'}"
        return BUILT_IN

    def cite(self, name: str) -> str:
        """``name = value (source)``, the form explanations quote a constant in."""
        return f"{name} = {_fmt(getattr(self, name))} ({self.source(name)})"


def constants() -> tuple[dataclasses.Field, ...]:
    """The tunable fields of :class:`Tuning` (those with a ``range``), in declaration order."""
    return tuple(f for f in dataclasses.fields(Tuning) if "range" in f.metadata)


def _fmt(value: Any) -> str:
    if isinstance(value, tuple):
        return tuning_ranges.words(value)
    if isinstance(value, int) and value >= 2**10 and value & (value - 1) == 0:
        return f"{value:,} (2**{value.bit_length() - 1})"
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def describe(t: Tuning) -> list[tuple[str, str, str, str]]:
    """(name, value, source, what it decides) per constant, for ``attnkit info``."""
    return [
        (f.name, _fmt(getattr(t, f.name)), t.source(f.name), f.metadata["doc"]) for f in constants()
    ]


DEFAULT = Tuning()
"""The built-in defaults: safe on CPUs the project was not measured on."""
