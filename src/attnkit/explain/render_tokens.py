"""Printing an :class:`~attnkit.explain.token_attention.AllTokensReport` with rich: one row per
token, one column per layer, in each cell the tokens it attends to most (head-averaged) with
their weights. Layers come six to a table so that a row stays readable in 100 columns. Model
vocabularies are untrusted text: shown through :mod:`attnkit.terminal`, never as markup."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnkit.terminal import printable

if TYPE_CHECKING:
    from rich.console import Console

    from attnkit.explain.token_attention import AllTokensReport

__all__ = ["LAYERS_PER_TABLE", "render_all_tokens"]

LAYERS_PER_TABLE = 6


def _name(token: str, index: int, tokens: list[str]) -> str:
    """The token, with its position when its text occurs more than once."""
    return printable(f"{token}#{index}" if tokens.count(token) > 1 else token)


def render_all_tokens(report: AllTokensReport, console: Console) -> None:
    """Print ``report``: a header (text, model, sizes), then per group of layers a table."""
    from rich.table import Table
    from rich.text import Text

    from attnkit.explain.token_attention import AllTokensReport

    if not isinstance(report, AllTokensReport):
        raise TypeError(f"report: expected an AllTokensReport, got {type(report).__name__}")
    toks = report.tokens
    console.print(Text("text:   ", style="bold") + Text(printable(report.text)))
    console.print(
        Text("model:  ", style="bold")
        + Text(f"{printable(report.model)} ({report.num_layers} layers x {report.num_heads} heads)")
    )
    for note in report.notes:
        console.print(Text("note: ", style="yellow") + Text(printable(note)))
    for lo in range(0, report.num_layers, LAYERS_PER_TABLE):
        layers = range(lo, min(lo + LAYERS_PER_TABLE, report.num_layers))
        table = Table(
            title=Text(
                f"what each token attends to most: top {report.top_k}, averaged over the "
                f"{report.num_heads} heads of each layer"
            ),
            title_justify="left",
            show_lines=True,
            expand=False,
        )
        table.add_column("token", no_wrap=True, style="bold")
        for n in layers:
            table.add_column(f"layer {n}", no_wrap=True)
        for i, per_layer in enumerate(report.rows):
            cells = []
            for n in layers:
                cell = Text()
                for r, a in enumerate(per_layer[n]):
                    if r:
                        cell.append("\n")
                    cell.append(_name(a.token, a.index, toks), style="cyan" if a.index == i else "")
                    cell.append(f" {a.weight:.2f}", style="dim")
                cells.append(cell)
            table.add_row(_name(toks[i], i, toks), *cells)
        console.print(table)
    console.print(
        Text(
            "cyan: the token itself; weights are the head average of each layer's softmax rows "
            "(each row sums to 1)",
            style="dim",
        )
    )
