"""A worked example from a tutorial (the project's "seed" texts) computed by the library, next
to each value the tutorial prints (:mod:`attnkit.explain.printed_values`), with the exact text it
comes from, its line in the tutorial and whether it agrees; and its JSON form.

* ``"bahdanau-vs-dot"``: additive (Bahdanau), scaled and unscaled dot-product attention on
  Q = [[1,0],[0,1]], K = [[1,2],[3,4]], V = [[5,6],[7,8]] (row Q_1);
* ``"softmax"``: the softmax of [2.0, 1.0, 0.1].

The tutorial texts ship inside the package (``explain/texts/NAME.txt``), so the examples work
after ``pip install``. ``seeds_dir`` overrides them with a directory of the original seed files
(``004_*.txt``, ``002_*.txt``, as in a checkout's ``../shared/seeds``); when it holds no such
file the comparison still runs on the embedded values. The JSON schema is documented in
:mod:`attnkit.explain`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from attnkit import reference
from attnkit.explain import printed_values
from attnkit.explain.printed_values import PrintedValue
from attnkit.explain.steps import SCHEMA

__all__ = ["EXAMPLES", "Comparison", "SeedExample", "example_to_dict", "seed_example"]


@dataclass(frozen=True)
class Comparison:
    """A printed value next to the computed ones: ``computed`` and ``agrees`` by column."""

    printed: PrintedValue
    computed: dict[str, float]
    agrees: dict[str, bool]
    snippet_found: bool | None
    seed_line: int | None


@dataclass(frozen=True)
class SeedExample:
    """A worked example computed by the library and compared with what its tutorial prints.

    ``seed_file``: the tutorial text read (None when ``seeds_dir`` held none); ``seeds_dir``:
    the override directory, or None for the text shipped with attnkit."""

    name: str
    title: str
    seed_file: str | None
    seed_file_found: bool
    seeds_dir: str | None
    inputs: dict[str, np.ndarray]
    cases: dict[str, dict[str, np.ndarray]]
    comparisons: tuple[Comparison, ...]
    notes: tuple[str, ...] = field(default=())
    source: str = ""


@dataclass(frozen=True)
class _ExampleSpec:
    title: str
    source: str
    file_glob: str
    compute: Callable[[], tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]]
    values: tuple[PrintedValue, ...]
    notes: Callable[[dict[str, dict[str, np.ndarray]]], list[str]]


def _fields(tr: Any) -> dict[str, np.ndarray]:
    out = {}
    for name in ("scores", "scaled", "weights", "output"):
        val = getattr(tr, name, None)
        if val is not None:
            out[name] = np.asarray(val, dtype=np.float64)
    if "scaled" not in out:
        out["scaled"] = out["scores"]
    return out


# --- seed 004 --------------------------------------------------------------------------------
def _seed004_compute() -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    q = np.array(printed_values.SEED004_Q)
    k = np.array(printed_values.SEED004_K)
    v = np.array(printed_values.SEED004_V)
    eye, w_v = np.eye(2), np.ones(2)
    inputs = {"Q": q, "K": k, "V": v, "W_q": eye, "W_k": eye, "w_v": w_v}
    cases = {
        "scaled": _fields(reference.scaled_dot_product(q, k, v)),
        "unscaled": _fields(reference.dot_product(q, k, v)),
        "additive": _fields(reference.additive(q, k, v, eye, eye, w_v)),
    }
    # re-doing the seed's later steps from its own printed earlier numbers (row Q_1 only)
    cases["seed_additive"] = {
        "weights": reference.softmax_rows(np.array([printed_values.SEED004_ADDITIVE_E])),
        "output": np.array(printed_values.SEED004_ADDITIVE_WEIGHTS)[None, :] @ v,
    }
    cases["seed_dot"] = {"output": np.array(printed_values.SEED004_DOT_WEIGHTS)[None, :] @ v}
    return inputs, cases


def _seed004_notes(cases: dict[str, dict[str, np.ndarray]]) -> list[str]:
    add, sc, un = cases["additive"], cases["scaled"], cases["unscaled"]
    own_w = cases["seed_additive"]["weights"][0]
    own_dot = cases["seed_dot"]["output"][0]
    return [
        "additive e11: v^T tanh(W_q q_1 + W_k k_1) = [1, 1]·tanh([2, 2]) = 2·tanh(2) = "
        f"{add['scores'][0, 0]:.6f}; the tutorial prints 1.",
        "additive e12: [1, 1]·tanh([4, 4]) = 2·tanh(4) = "
        f"{add['scores'][0, 1]:.6f}; the tutorial prints 0.999 = tanh(4), one component only.",
        f"additive α11, α12 from the tutorial's own e11 = 1, e12 = 0.999 are {own_w[0]:.5f}, "
        f"{own_w[1]:.5f}, not 0.5001, 0.4999; from the computed e they are "
        f"{add['weights'][0, 0]:.4f}, {add['weights'][0, 1]:.4f}.",
        "dot-product α11, α12: the tutorial prints softmax of the UNscaled scores [1, 3] "
        f"({un['weights'][0, 0]:.4f}, {un['weights'][0, 1]:.4f}) although its formula divides "
        f"by √2, which gives {sc['weights'][0, 0]:.4f}, {sc['weights'][0, 1]:.4f}.",
        f"dot-product output: 0.1192·[5, 6] + 0.8808·[7, 8] = [{own_dot[0]:.4f}, "
        f"{own_dot[1]:.4f}], not the printed [6.7624, 7.7624]; the scaled attention gives "
        f"[{sc['output'][0, 0]:.4f}, {sc['output'][0, 1]:.4f}], the unscaled "
        f"[{un['output'][0, 0]:.4f}, {un['output'][0, 1]:.4f}].",
    ]


# --- seed 002 --------------------------------------------------------------------------------
def _seed002_compute() -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    scores = np.array([printed_values.SEED002_SCORES])
    return {"scores": scores}, {"softmax": {"weights": reference.softmax_rows(scores)}}


def _seed002_notes(cases: dict[str, dict[str, np.ndarray]]) -> list[str]:
    w = cases["softmax"]["weights"][0]
    return [
        f"softmax([2.0, 1.0, 0.1]) = [{w[0]:.4f}, {w[1]:.4f}, {w[2]:.4f}], i.e. "
        f"[{w[0]:.2f}, {w[1]:.2f}, {w[2]:.2f}] to two decimals; the tutorial prints "
        "[0.65, 0.24, 0.11] (which sums to 1.00, but the first and last entries are off)."
    ]


EXAMPLES: dict[str, _ExampleSpec] = {
    "bahdanau-vs-dot": _ExampleSpec(
        title="Additive (Bahdanau) vs dot-product attention, worked numbers (row Q_1)",
        source="a blog post (in Chinese) on the two common forms of attention, additive and "
        "dot-product",
        file_glob="004_*.txt",
        compute=_seed004_compute,
        values=printed_values.SEED004_VALUES,
        notes=_seed004_notes,
    ),
    "softmax": _ExampleSpec(
        title="The softmax of the scores [2.0, 1.0, 0.1]",
        source="a blog post (in Chinese) on the core ideas of self-attention",
        file_glob="002_*.txt",
        compute=_seed002_compute,
        values=printed_values.SEED002_VALUES,
        notes=_seed002_notes,
    ),
}


def _packaged_text(name: str) -> Path:
    """The tutorial text of example ``name`` shipped inside the package."""
    return Path(str(resources.files("attnkit.explain") / "texts" / f"{name}.txt"))


def _find_seed_file(seeds_dir: Path | None, pattern: str) -> Path | None:
    if seeds_dir is None or not seeds_dir.is_dir():
        return None
    hits = sorted(seeds_dir.glob(pattern))
    return hits[0] if hits else None


def _read_seed(path: Path) -> str:
    """The UTF-8 text of a seed file; ValueError naming it when it is not a readable file."""
    if not path.is_file():
        raise ValueError(f"seeds_dir: {path} is not a regular file (expected the seed text)")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"seeds_dir: {path} is not UTF-8 text (byte offset {e.start})") from None
    except OSError as e:
        raise ValueError(f"seeds_dir: {path} cannot be read ({e.strerror or e})") from None


def seed_example(name: str = "bahdanau-vs-dot", seeds_dir: Path | str | None = None) -> SeedExample:
    """Compute example ``name`` (a key of :data:`EXAMPLES`) and compare with its tutorial.

    ``seeds_dir``: None for the tutorial text shipped with attnkit, else a directory of the
    original seed files (override). When it holds no such file the comparison still runs on
    the embedded values and snippets; ``snippet_found`` / ``seed_line`` are then None.
    """
    if not isinstance(name, str) or name not in EXAMPLES:
        raise ValueError(f"example: expected one of {sorted(EXAMPLES)}, got {name!r}")
    spec = EXAMPLES[name]
    if seeds_dir is not None and not isinstance(seeds_dir, (str, Path)):
        raise TypeError(f"seeds_dir: expected a directory path, got {type(seeds_dir).__name__}")
    if seeds_dir is None:
        seeds_path, seed_file = None, _packaged_text(name)
    else:
        seeds_path = Path(seeds_dir)
        seed_file = _find_seed_file(seeds_path, spec.file_glob)
    text = _read_seed(seed_file) if seed_file is not None else None
    inputs, cases = spec.compute()

    comparisons = []
    for pv in spec.values:
        computed, agrees = {}, {}
        for column, case, fld, index in pv.compare:
            val = float(cases[case][fld][index])
            computed[column] = val
            agrees[column] = bool(abs(val - pv.value) <= pv.tolerance)
        found, line = None, None
        if text is not None:
            at = text.find(pv.snippet)
            found = at >= 0
            line = text.count("\n", 0, at) + 1 if found else None
        comparisons.append(Comparison(pv, computed, agrees, found, line))
    return SeedExample(
        name=name,
        title=spec.title,
        seed_file=str(seed_file) if seed_file is not None else None,
        seed_file_found=seed_file is not None,
        seeds_dir=None if seeds_path is None else str(seeds_path),
        inputs=inputs,
        cases=cases,
        comparisons=tuple(comparisons),
        notes=tuple(spec.notes(cases)),
        source=spec.source,
    )


def example_to_dict(ex: SeedExample) -> dict:
    """The example as a JSON-ready dict (schema ``attnkit.explain/1``, documented in
    :mod:`attnkit.explain`)."""
    return {
        "schema": SCHEMA,
        "mode": "example",
        "example": ex.name,
        "title": ex.title,
        "source": ex.source,
        "seed_file": ex.seed_file,
        "seed_file_found": ex.seed_file_found,
        "seeds_dir": ex.seeds_dir,
        "inputs": {k: np.asarray(a).tolist() for k, a in ex.inputs.items()},
        "cases": {
            c: {f: np.asarray(a).tolist() for f, a in flds.items()} for c, flds in ex.cases.items()
        },
        "values": [
            {
                "key": c.printed.key,
                "section": c.printed.section,
                "label": c.printed.label,
                "printed": c.printed.printed,
                "printed_value": c.printed.value,
                "digits": c.printed.digits,
                "tolerance": c.printed.tolerance,
                "snippet": c.printed.snippet,
                "snippet_found": c.snippet_found,
                "seed_line": c.seed_line,
                "computed": c.computed,
                "agrees": c.agrees,
            }
            for c in ex.comparisons
        ],
        "notes": list(ex.notes),
    }
