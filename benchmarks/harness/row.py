"""A benchmark row, typed: :class:`Spec` (what a script's ``--list`` declares) and :class:`Row`
(what running it gave), and the rule that judges a row's target."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("ok", "failed", "timeout", "interrupted")


@dataclass
class Spec:
    """One row to run: the script that owns it and what ``--list`` said about it."""

    script: Path
    id: str
    group: str = ""
    case: str = ""
    target: str = ""


@dataclass
class Row:
    """The result of one row (one line of the table, one entry of ``--json``'s ``rows``).

    Times are seconds (medians), memory MiB. ``ratio`` = peer_s / impl_s (> 1: attnkit is
    faster). ``target_met``: None when nothing judges the target. ``cpu``: the CPU it ran on
    (model, torch capability, native bf16). ``load_avg``: the 1-minute load average when the
    row finished (its own threads count: about the torch threads on a quiet machine; more
    means other processes shared the cores and the times measured them too). ``extra``: the
    row's own
    fields (backend, errors against the peer, compile time, per-side memory, ...)."""

    id: str
    group: str = ""
    case: str = ""
    target: str = ""
    script: str = ""
    status: str = "ok"
    impl_s: float | None = None
    peer: str = ""
    peer_s: float | None = None
    ratio: float | None = None
    target_met: bool | None = None
    peak_rss_mib: float | None = None
    startup_rss_mib: float | None = None
    quick: bool | None = None
    torch_threads: int | None = None
    cpu: str | None = None
    wall_s: float | None = None
    load_avg: float | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the row ran to the end and printed its result."""
        return self.status == "ok"

    @classmethod
    def from_spec(cls, spec: Spec, **fields: Any) -> Row:
        """A row with the spec's id, group, case, target and script name, plus ``fields``."""
        return cls(
            id=spec.id,
            group=spec.group,
            case=spec.case,
            target=spec.target,
            script=spec.script.name,
            **fields,
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        """A row from a dict (a child's ``ROW {json}`` line or a saved JSON row). Keys that are
        not fields go into ``extra`` (nothing is lost); a non-dict ``extra`` is kept as
        ``{"value": ...}``."""
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in data.items() if k in names}
        extra = known.pop("extra", None)
        if extra is None:
            extra = {}
        elif not isinstance(extra, dict):
            extra = {"value": extra}
        extra = {**extra, **{k: v for k, v in data.items() if k not in names}}
        if "id" not in known:
            raise ValueError(f"row: expected an 'id', got keys {sorted(data)}")
        return cls(**known, extra=extra)

    def to_json(self) -> dict[str, Any]:
        """The row as a JSON-ready dict (every field)."""
        return dataclasses.asdict(self)


_RATIO_TARGET = re.compile(r"^\s*>=?\s*([0-9]*\.?[0-9]+)\s*x\s*$")


def target_met(row: Row | dict[str, Any]) -> bool | None:
    """Whether the row met its target: the row's own ``target_met`` when it gave one, else
    ``ratio >= N`` for targets of the form ``">=Nx"``; None when there is nothing to judge."""
    d = row.to_json() if isinstance(row, Row) else row
    if isinstance(d.get("target_met"), bool):
        return d["target_met"]
    m = _RATIO_TARGET.match(d.get("target") or "")
    ratio = d.get("ratio")
    if not m or isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
        return None
    return ratio >= float(m.group(1))
