"""The results table: named columns (:data:`COLUMNS`), each a header and a function from a
:class:`~harness.row.Row` to its cell text, rendered as Markdown or as a rich table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.row import Row

COMPILE_KEYS = ("flex_compile_s", "compile_fwd_s")
BLOCK_MASK_KEYS = ("create_block_mask_s", "plan_s")
"""Keys of a row's ``extra`` shown in their own columns: the peer's (or our kernel's) compile
time, and the time to build the block mask (FlexAttention) or the block plan (attnkit)."""


def fmt_time(s: object) -> str:
    """Seconds as µs / ms / s; "-" when absent."""
    if isinstance(s, bool) or not isinstance(s, (int, float)) or s <= 0:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1.0:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def fmt_ratio(r: object) -> str:
    """A ratio as ``1.23x``; "-" when absent."""
    return f"{r:.2f}x" if isinstance(r, (int, float)) and not isinstance(r, bool) else "-"


def fmt_value(v: object) -> str:
    """A note's value: large floats with thousands separators, others to 3 significant digits."""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}={fmt_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def fmt_mem(row: Row) -> str:
    """Peak RSS of the row process and, in parentheses, how much above the RSS after imports."""
    peak, base = row.peak_rss_mib, row.startup_rss_mib
    if not isinstance(peak, (int, float)):
        return "-"
    if isinstance(base, (int, float)):
        return f"{peak:,.0f} (+{max(0.0, peak - base):,.0f})"
    return f"{peak:,.0f}"


def fmt_extra_time(row: Row, keys: tuple[str, ...]) -> str:
    """The times of ``keys`` in the row's extra, each followed by its name."""
    parts = [f"{fmt_time(row.extra[k])} ({k.removesuffix('_s')})" for k in keys if k in row.extra]
    return ", ".join(parts)


def fmt_notes(row: Row) -> str:
    """The row's extra (without the keys that have their own column); for a row that did not
    run, its status and the last line of its error."""
    if not row.ok:
        last = [ln for ln in (row.error or "").splitlines() if ln.strip()]
        return f"{row.status.upper()}: " + (last[-1] if last else "")
    shown = COMPILE_KEYS + BLOCK_MASK_KEYS
    return ", ".join(f"{k}={fmt_value(v)}" for k, v in row.extra.items() if k not in shown)


def fmt_met(row: Row) -> str:
    """yes / NO / - (nothing to judge)."""
    return "-" if row.target_met is None else ("yes" if row.target_met else "NO")


@dataclass(frozen=True)
class Column:
    """One column of the table: its header, its cell text, and right alignment for numbers."""

    name: str
    cell: Callable[[Row], str]
    right: bool = False


COLUMNS: tuple[Column, ...] = (
    Column("group", lambda r: r.group),
    Column("case", lambda r: r.case),
    Column("attnkit", lambda r: fmt_time(r.impl_s), right=True),
    Column("peer", lambda r: r.peer or ""),
    Column("peer time", lambda r: fmt_time(r.peer_s), right=True),
    Column("ratio", lambda r: fmt_ratio(r.ratio), right=True),
    Column("target", lambda r: r.target or ""),
    Column("met", fmt_met),
    Column("peak MiB (+row)", fmt_mem, right=True),
    Column("load", lambda r: "-" if r.load_avg is None else f"{r.load_avg:.1f}", right=True),
    Column("compile", lambda r: fmt_extra_time(r, COMPILE_KEYS)),
    Column("block mask / plan", lambda r: fmt_extra_time(r, BLOCK_MASK_KEYS)),
    Column("notes", fmt_notes),
)


def cells(row: Row) -> dict[str, str]:
    """The row's cell texts, by column name."""
    return {c.name: c.cell(row) for c in COLUMNS}


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[Row]) -> str:
    """The table as GitHub Markdown: a header, a separator and one line per row."""
    lines = ["| " + " | ".join(c.name for c in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(_md_escape(t) for t in cells(r).values()) + " |")
    return "\n".join(lines)


def rich_table(rows: list[Row], title: str):
    """The table as a ``rich.table.Table`` (met in green / red, failures in red). Cell text is
    escaped, so brackets in notes or errors print as themselves."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title, show_lines=False)
    for c in COLUMNS:
        t.add_column(c.name, justify="right" if c.right else "left", overflow="fold")
    for r in rows:
        texts = {k: escape(v) for k, v in cells(r).items()}
        if not r.ok:
            texts["notes"] = f"[red]{texts['notes']}[/red]"
        if r.target_met is False:
            texts["met"] = "[bold red]NO[/bold red]"
        elif r.target_met:
            texts["met"] = "[green]yes[/green]"
        t.add_row(*texts.values())
    return t
