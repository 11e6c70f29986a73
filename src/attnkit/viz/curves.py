"""Training curves as one image (matplotlib, Agg: no display needed): training and held-out
loss (top) and the learning rate (bottom) against the optimiser step, one colour per run.

    write_curves([Curve.from_rows("runs/fra", rows), ...], "curves.png")

Run names are drawn as plain text (``$`` is not maths; control characters are shown escaped).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from attnkit.viz.weights import check_output_path, write_atomic

__all__ = ["FORMATS", "Curve", "write_curves"]

FORMATS = (".png", ".svg", ".pdf")


@dataclass(frozen=True)
class Curve:
    """One run's numbers: ``steps``/``loss``/``lr`` of its logging rows and
    ``val_steps``/``val_loss`` of its evaluations (each pair of tuples of equal length)."""

    name: str
    steps: tuple[int, ...]
    loss: tuple[float, ...]
    lr: tuple[float, ...]
    val_steps: tuple[int, ...]
    val_loss: tuple[float, ...]

    @classmethod
    def from_rows(cls, name: str, rows: Iterable[dict]) -> Curve:
        """From the rows of a run's ``log.jsonl`` (training rows carry ``loss`` and ``lr``,
        evaluation rows ``val_loss``)."""
        rows = list(rows)
        train = [r for r in rows if "loss" in r and "lr" in r]
        val = [r for r in rows if "val_loss" in r]
        return cls(
            name,
            tuple(int(r["step"]) for r in train),
            tuple(float(r["loss"]) for r in train),
            tuple(float(r["lr"]) for r in train),
            tuple(int(r["step"]) for r in val),
            tuple(float(r["val_loss"]) for r in val),
        )


def _plain(text: str) -> str:
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return text.replace("$", r"\$")


def write_curves(curves: list[Curve], path: str | os.PathLike) -> None:
    """Draw ``curves`` into ``path`` (.png, .svg or .pdf, written atomically). ValueError
    naming the argument for no curves, a curve without points, or a bad path."""
    out = check_output_path("path", path, FORMATS)
    if not curves:
        raise ValueError("curves: expected at least one run, got none")
    for c in curves:
        if not c.steps and not c.val_steps:
            raise ValueError(f"curves: the run {c.name!r} has no logged steps yet")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 6.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax_loss, ax_lr = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    colours = [f"C{i % 10}" for i in range(len(curves))]
    for c, colour in zip(curves, colours):
        name = _plain(c.name)
        if c.steps:
            ax_loss.plot(c.steps, c.loss, color=colour, lw=1.2, label=f"{name}: training")
            ax_lr.plot(c.steps, c.lr, color=colour, lw=1.2, label=name)
        if c.val_steps:
            ax_loss.plot(
                c.val_steps, c.val_loss, color=colour, ls="--", marker="o", ms=3,
                label=f"{name}: held-out",
            )  # fmt: skip
    ax_loss.set_ylabel("loss (nats per token)")
    ax_loss.set_title("training (solid) and held-out (dashed) loss")
    ax_loss.legend(fontsize=8)
    ax_loss.grid(alpha=0.3)
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("optimiser step")
    ax_lr.grid(alpha=0.3)
    fmt = out.suffix.lower()[1:]
    write_atomic(out, lambda f: fig.savefig(f, format=fmt, dpi=100))
