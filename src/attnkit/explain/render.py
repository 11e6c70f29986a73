"""Printing the explanations on a terminal with rich: the walkthrough, a seed example, a model
attention report. The only module of :mod:`attnkit.explain` that imports rich (inside the
functions, so importing attnkit stays light); untrusted text (the user's words, paths, a model's
vocabulary) goes through :mod:`attnkit.terminal`, never straight into rich markup.

Every function takes a ``rich.console.Console``; output fits 100 columns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from attnkit.terminal import markup, printable

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from attnkit.explain.model_attention import Attended, ModelAttentionReport
    from attnkit.explain.seed_examples import Comparison, SeedExample
    from attnkit.explain.steps import Walkthrough

__all__ = ["fmt_vector", "render_example", "render_model_attention", "render_walkthrough"]


# ---------------------------------------------------------------------------------------------
# seed 000's walkthrough and the seed examples
# ---------------------------------------------------------------------------------------------
def fmt_vector(a: Sequence[float] | np.ndarray, decimals: int = 4, head: int = 3) -> str:
    """``[v0, v1, v2, ..., v_last] (n)`` for long vectors, all entries for short ones."""
    a = np.asarray(a, dtype=np.float64).ravel()
    f = [f"{x:.{decimals}f}" for x in a] if a.size <= head + 3 else None
    if f is not None:
        return "[" + ", ".join(f) + "]"
    parts = [f"{x:.{decimals}f}" for x in a[:head]] + ["...", f"{a[-1]:.{decimals}f}"]
    return "[" + ", ".join(parts) + f"] ({a.size})"


def _shape(a: np.ndarray) -> str:
    return "(" + " × ".join(str(s) for s in np.shape(a)) + ")"


def _matrix_table(
    title: str, m: np.ndarray, rows: Sequence[str], cols: Sequence[str] | None
) -> Any:
    """A rich Table of ``m`` (rows, cols): one column per entry when ``cols`` are given, else
    one :func:`fmt_vector` per row."""
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    t.add_column("", style="bold")
    if cols is not None:
        for c in cols:
            t.add_column(c, justify="right")
        for r, vals in zip(rows, m, strict=True):
            t.add_row(r, *[f"{x:.4f}" for x in vals])
    else:
        t.add_column("row")
        for r, vals in zip(rows, m, strict=True):
            t.add_row(r, fmt_vector(vals))
    return t


_MAX_TABLE_WORDS = 8  # a (n × n) matrix is shown as a table up to this n, else row by row


def _square(console: Console, title: str, m: np.ndarray, words: Sequence[str]) -> None:
    cols = list(words) if len(words) <= _MAX_TABLE_WORDS else None
    console.print(_matrix_table(title, m, words, cols))


def render_walkthrough(w: Walkthrough, console: Console) -> None:
    """Print the walkthrough to a ``rich.console.Console``, shapes at every step."""
    from rich.panel import Panel
    from rich.table import Table

    tr, n = w.trace, len(w.words)
    words = [markup(x) for x in w.words]  # the user's words: no markup, no control characters
    labels = [f"{i + 1} {wd}" for i, wd in enumerate(words)]
    console.print(
        Panel(
            f'[bold]Self-attention, step by step:[/] [cyan]"{markup(w.sentence)}"[/]'
            f"   n = {n} words\n"
            f"d_model = {w.d_model}, d_k = {w.d_k}, d_v = {w.d_v}\n"
            f"[dim]random inputs: numpy.random.default_rng({w.seed}); one N(0, 1) "
            "embedding per distinct word; W ~ N(0, 1)/sqrt(d_model)[/]",
            expand=False,
        )
    )
    console.rule("[bold]1. Embeddings and projections")
    console.print(f"X = embeddings, one row per word {_shape(w.x)}")
    console.print(_matrix_table("", w.x, labels, None))
    console.print(
        f"W^Q {_shape(w.w_q)}   W^K {_shape(w.w_k)}   W^V {_shape(w.w_v)}   (seeded, fixed)"
    )
    for name, mat, wmat in (("Q", tr.q, w.w_q), ("K", tr.k, w.w_k), ("V", tr.v, w.w_v)):
        console.print(f"{name} = X W^{name}   {_shape(w.x)} @ {_shape(wmat)} -> {_shape(mat)}")
        console.print(_matrix_table("", mat, labels, None))

    p, wd = w.position, markup(w.word)
    console.rule(f"[bold]2. One word: '{wd}' (word {p + 1} of {n})")
    sq = math.sqrt(w.d_k)
    t = Table(show_edge=False, pad_edge=False)
    t.add_column("key word")
    t.add_column(f"Q_{wd} · K_j", justify="right")
    t.add_column(f"÷ √d_k = ÷ {sq:.4f}", justify="right")
    t.add_column("softmax weight", justify="right")
    t.add_column("(without ÷ √d_k)", justify="right", style="dim")
    for j in range(n):
        t.add_row(
            labels[j],
            f"{w.row_scores[j]:.4f}",
            f"{w.row_scaled[j]:.4f}",
            f"{w.row_weights[j]:.6f}",
            f"{w.row_weights_unscaled[j]:.6f}",
        )
    console.print(
        f"scores: Q_{wd} {_shape(tr.q[p])} · each K_j {_shape(tr.k[0])} -> {n} numbers; "
        f"÷ √d_k; softmax"
    )
    console.print(t)
    s = float(w.row_weights.sum())
    console.print(f"weights sum to {s:.15f} (|sum - 1| = {abs(s - 1):.1e})")
    console.print(
        f"output_{wd} = Σ_j w_j V_j   {n} weights × V {_shape(tr.v)} -> {_shape(w.row_output)}"
    )
    console.print(f"  {fmt_vector(w.row_output)}")

    console.rule("[bold]3. Matrix form, all words at once")
    console.print(f"scores = Q Kᵀ   {_shape(tr.q)} @ {_shape(tr.k.T)} -> {_shape(tr.scores)}")
    _square(console, "", tr.scores, words)
    console.print(f"scaled = scores / √d_k   {_shape(tr.scaled)}")
    _square(console, "", tr.scaled, words)
    console.print(f"weights = softmax(scaled), row by row   {_shape(tr.weights)}")
    _square(console, "", tr.weights, words)
    sums = tr.weights.sum(axis=-1)
    console.print(f"row sums: {fmt_vector(sums, decimals=12)}")
    shapes = f"{_shape(tr.weights)} @ {_shape(tr.v)} -> {_shape(tr.output)}"
    console.print(f"output = weights V   {shapes}")
    console.print(_matrix_table("", tr.output, labels, None))

    console.rule("[bold]4. Checks")
    ok = "[green]ok[/]"
    bad = "[red]MISMATCH[/]"
    tol = 1e-10 * max(1.0, float(np.max(np.abs(tr.output))))
    console.print(
        f"row {p + 1} of the matrix form vs the one-word computation: max abs diff "
        f"{w.check_row_vs_matrix:.2e} {ok if w.check_row_vs_matrix <= tol else bad}"
    )
    for what, d in (("output", w.check_functional_output), ("weights", w.check_functional_weights)):
        console.print(
            f"functional.scaled_dot_product_attention (torch, float64) vs reference, {what}: "
            f"max abs diff {d:.2e} {ok if d <= tol else bad}"
        )


def render_example(ex: SeedExample, console: Console) -> None:
    """Print a worked example: per section a table of printed vs computed values."""
    from rich.table import Table

    console.rule(f"[bold]{ex.title}")
    if ex.seeds_dir is None:
        console.print(
            f"source: {markup(ex.source or 'the tutorial this example comes from')} (its text "
            "ships with attnkit); 'line' is where the tutorial prints each value"
        )
    elif ex.seed_file_found:
        console.print(f"source: {markup(ex.seed_file)}")
    else:
        console.print(
            f"[yellow]no tutorial text found[/] in {markup(ex.seeds_dir)}; comparing with the "
            "values and text snippets embedded in attnkit"
        )
    for name, a in ex.inputs.items():
        console.print(f"{name} = {np.asarray(a).tolist()}")
    sections: dict[str, list[Comparison]] = {}
    for c in ex.comparisons:
        sections.setdefault(c.printed.section, []).append(c)
    for section, comps in sections.items():
        columns = list(dict.fromkeys(col for c in comps for col in c.computed))
        t = Table(title=section, title_justify="left", show_edge=False, pad_edge=False)
        t.add_column("value")
        t.add_column("tutorial prints", justify="right")
        for col in columns:
            t.add_column(col, justify="right")
        t.add_column("line", justify="right", style="dim")
        for c in comps:
            cells = []
            for col in columns:
                if col not in c.computed:
                    cells.append("")
                    continue
                mark = "[green]✓[/]" if c.agrees[col] else "[red]✗[/]"
                cells.append(f"{c.computed[col]:.6f} {mark}")
            if c.snippet_found is None:
                where = "—"
            else:
                where = str(c.seed_line) if c.snippet_found else "[red]not found[/]"
            t.add_row(c.printed.label, c.printed.printed, *cells, where)
        console.print(t)
    console.print(
        "[dim]✓ = agrees within half a unit of the last digit the tutorial prints "
        "(exact values: 1e-12)[/]"
    )
    if ex.notes:
        console.rule("[bold]Findings")
        for note in ex.notes:
            console.print(f"• {note}")


# ---------------------------------------------------------------------------------------------
# model attention report
# ---------------------------------------------------------------------------------------------
def _label(a: Attended, tokens: list[str]) -> str:
    """Token text, with its position when the same text occurs more than once."""
    label = f"{a.token}#{a.index}" if tokens.count(a.token) > 1 else a.token
    return printable(label)


def _cell(items: list[Attended], tokens: list[str], query: int) -> Text:
    """One line of attended tokens with their weights; the query token highlighted."""
    from rich.text import Text

    t = Text()
    for n, a in enumerate(items):
        if n:
            t.append("  ")
        style = "bold cyan" if a.index == query else ("bold" if a.weight >= 0.3 else "")
        t.append(_label(a, tokens), style=style)
        t.append(f" {a.weight:.2f}", style="dim")
    return t


def render_model_attention(report: ModelAttentionReport, console: Console) -> None:
    """Print ``report`` as rich tables readable in 100 columns: per layer one row with every
    head's top tokens (one line per head) and the head-averaged top tokens."""
    from rich.table import Table
    from rich.text import Text

    from attnkit.explain.model_attention import ModelAttentionReport

    if not isinstance(report, ModelAttentionReport):
        raise TypeError(f"report: expected a ModelAttentionReport, got {type(report).__name__}")
    toks = report.tokens
    head = Text()
    for i, tok in enumerate(toks):
        if i:
            head.append(" ")
        head.append(printable(tok), style="bold reverse" if i == report.query_index else "")
    console.print(Text("text:   ", style="bold") + Text(printable(report.text)))
    console.print(Text("tokens: ", style="bold") + head)
    console.print(
        Text("query:  ", style="bold")
        + Text(
            f"token {report.query_index} ({printable(repr(toks[report.query_index]))}); "
            f"{report.num_layers} layers x {report.num_heads} heads"
        )
    )
    console.print(Text("model:  ", style="bold") + Text(printable(report.model or "?")))
    for note in report.notes:
        console.print(Text("note: ", style="yellow") + Text(printable(note)))

    table = Table(
        title=Text(f"what {printable(repr(report.word))} attends to: top {report.top_k} per head"),
        show_lines=True,
        expand=False,
    )
    table.add_column("layer", justify="right", no_wrap=True)
    table.add_column("head: top tokens (weight)", overflow="fold")
    for layer, per_head in enumerate(report.heads):
        cell = Text()
        for h, items in enumerate(per_head):
            if h:
                cell.append("\n")
            cell.append(f"h{h:<3}", style="dim")
            cell.append_text(_cell(items, toks, report.query_index))
        table.add_row(str(layer), cell)
    console.print(table)

    avg = Table(
        title=Text(f"head-averaged attention of {printable(repr(report.word))} per layer"),
        expand=False,
    )
    avg.add_column("layer", justify="right", no_wrap=True)
    avg.add_column(f"top {report.top_k} (weight)", overflow="fold")
    avg.add_column("on special tokens", justify="right", no_wrap=True)
    for layer, items in enumerate(report.averaged):
        avg.add_row(
            str(layer),
            _cell(items, toks, report.query_index),
            f"{report.special_weight[layer]:.2f}",
        )
    console.print(avg)
