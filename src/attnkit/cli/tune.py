"""``attnkit tune``: measure dispatch's constants on this machine and store them.

Runs :func:`attnkit.autotune.tune` (under a minute; ``--quick``: a few seconds, for smoke
tests), prints each constant with its built-in value, the measured one and what was seen, and
stores the result in the user cache directory (:mod:`attnkit.kernels.tuning.store`), where
every later attnkit process on this CPU, torch and attnkit version picks it up.
``attnkit info`` shows the constants in use and where they came from.
"""

from __future__ import annotations

import argparse
from typing import Any

from attnkit.cli.support.common import UsageError, console, print_json
from attnkit.files import check_writable
from attnkit.terminal import markup

NAME = "tune"
EXAMPLES = """\
  tune      measure dispatch's crossovers and tile sizes on this machine (under a minute)
              attnkit tune
              attnkit tune --dry-run          measure and show, store nothing
              attnkit tune --reset            forget the stored measurements
"""

SCHEMA = "attnkit.tune/1"
STORE = (
    "the tuning store (the user cache directory, XDG_CACHE_HOME/attnkit; --dry-run stores nothing)"
)
"""How errors name where ``tune`` stores its measurements (no option sets it)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the verb and its options."""
    p = sub.add_parser(
        NAME,
        help="measure dispatch's constants on this machine and store them",
        description="Measure where blocksparse beats dense, the block and tile sizes and the "
        "thread thresholds on this machine, and store them in the user cache directory "
        "(XDG_CACHE_HOME/attnkit on Linux when set). Later attnkit runs on the same CPU, "
        "torch and attnkit version use them; 'attnkit info' shows them.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, a few seconds (a smoke test; the numbers are only indicative)",
    )
    p.add_argument("--dry-run", action="store_true", help="measure and show; store nothing")
    p.add_argument("--reset", action="store_true", help="delete the stored measurements and exit")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run(ns: argparse.Namespace) -> int:
    """Measure (or reset), print, store; exit code 0."""
    from attnkit.kernels.tuning import store

    if ns.reset:
        if ns.quick or ns.dry_run:
            raise UsageError("--reset: measures nothing; leave out --quick and --dry-run")
        path = store.store_path()
        existed = path.exists()
        if existed:
            check_writable(STORE, path.parent)
        path.unlink(missing_ok=True)
        result = {"schema": SCHEMA, "reset": True, "path": str(path), "deleted": existed}
        if ns.json:
            print_json(result)
        else:
            what = "deleted" if existed else "nothing stored at"
            console().print(f"{what} {markup(str(path))}; the built-in defaults apply")
        return 0
    if not ns.dry_run:  # before a minute of measuring, not after it
        check_writable(STORE, store.store_path().parent)
    from attnkit.autotune import Budget, tune

    out = console()
    budget = Budget.quick() if ns.quick else Budget()
    progress = None if ns.json else (lambda name: out.print(f"measuring: {name.replace('_', ' ')}"))
    tuned = tune(budget, progress)
    path = None if ns.dry_run else store.save(tuned.tuning)
    result = _result(tuned, path)
    if ns.json:
        print_json(result)
    else:
        _render(result)
    return 0


def _result(tuned: Any, path: Any) -> dict[str, Any]:
    from attnkit.kernels.tuning import DEFAULT, constants, describe

    t = tuned.tuning
    seen, lead = {}, {}
    for _, f in tuned.found:
        names = list(f.values)
        lead.update({n: names[0] for n in names})
        seen.update({n: f"{f.detail} ({f.seconds:.1f} s)" for n in names})
    shown = {n: v for n, v, _, _ in describe(t)}
    built_in = {n: v for n, v, _, _ in describe(DEFAULT)}
    return {
        "schema": SCHEMA,
        "seconds": round(tuned.seconds, 1),
        "stored": None if path is None else str(path),
        "measured_on": t.measured_on,
        "constants": [
            {
                "name": f.name,
                "built_in": getattr(DEFAULT, f.name),
                "value": getattr(t, f.name),
                "shown": (built_in[f.name], shown[f.name]),
                "source": t.source(f.name),
                "seen": seen.get(f.name),
                "measured_with": lead.get(f.name),
                "how_sure": t.sure(f.name) if f.name in t.measured else None,
            }
            for f in constants()
        ],
    }


def _render(result: dict[str, Any]) -> None:
    from rich.table import Table

    out = console()
    table = Table(title="attnkit tune", title_justify="left")
    table.add_column("constant", no_wrap=True)
    for col in ("built-in", "this machine", "how sure", "what was measured"):
        table.add_column(col, overflow="fold")
    for c in result["constants"]:
        table.add_row(
            c["name"],
            markup(c["shown"][0]),
            markup(c["shown"][1]) if c["seen"] else "(not measured)",
            markup(c["how_sure"] or ""),
            markup(c["seen"] or "")
            if c["measured_with"] in (None, c["name"])
            else f"with {c['measured_with']}",
        )
    out.print(table)
    where = (
        f"stored in {markup(result['stored'])}" if result["stored"] else "not stored (--dry-run)"
    )
    out.print(f"measured in {result['seconds']:.1f} s; {where}")
