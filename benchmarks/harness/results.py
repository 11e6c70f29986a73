"""What a run leaves: the ``--json`` file (rows + machine, rewritten atomically after every row,
``"partial": true`` until the run ends) and the plain-text summary printed after the table."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.row import Row
from harness.table import fmt_ratio


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path`` atomically (temporary file + fsync + os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def payload(
    rows: Sequence[Row],
    machine: dict[str, Any],
    *,
    quick: bool,
    only: list[str],
    timeout_s: float,
    total_s: float,
    partial: bool,
) -> dict[str, Any]:
    """The JSON record of a run."""
    return dict(
        machine=machine,
        quick=quick,
        only=only,
        timeout_s=timeout_s,
        total_s=total_s,
        partial=partial,
        rows=[r.to_json() for r in rows],
    )


def summary(rows: Sequence[Row], quick: bool, interrupted: bool) -> str:
    """After the table: how many rows ran, the missed targets, and each failure with the end of
    its stderr."""
    missed = [r for r in rows if r.target_met is False]
    failed = [r for r in rows if not r.ok]
    lines = [f"\n{len(rows) - len(failed)} of {len(rows)} rows ran"]
    if interrupted:
        lines[0] += " (interrupted)"
    if missed:
        note = " (--quick: small sizes, the targets are for full sizes)" if quick else ""
        lines.append(f"targets missed{note}:")
        lines += [f"  {r.id}: {fmt_ratio(r.ratio)}, target {r.target}" for r in missed]
    for r in failed:
        lines.append(f"\n{r.status.upper()} {r.id} ({r.script}):")
        lines.append("  " + (r.error or "").replace("\n", "\n  "))
    return "\n".join(lines)
