"""No import circles in ``src/attnkit``: the graph of every import (module level, under
``TYPE_CHECKING`` and inside functions alike) has no cycle. Two files that need each other are
one concept split badly; the shared piece belongs a layer below both.

``from pkg import name`` counts as an import of the submodule ``pkg.name`` when there is one,
else of the package ``pkg`` (its ``__init__``). The root package's lazy re-exports
(``attnkit/__init__.py``, resolved on first use) are not edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for p in sorted((SRC / "attnkit").rglob("*.py")):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        is_pkg = p.name == "__init__.py"
        out[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return out


def _imports(name: str, path: Path, is_pkg: bool, mods: dict) -> set[str]:
    """The attnkit modules ``name`` imports anywhere in its file."""
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    targets = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                mod = ".".join(here[: len(here) - node.level + 1] + ([mod] if mod else []))
            targets += [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names]
    out = set()
    for t in targets:
        while t and t not in mods:
            t = t.rpartition(".")[0]
        if t.startswith("attnkit") and t != name:
            out.add(t)
    return out


def import_graph() -> nx.DiGraph:
    mods = _modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, (path, is_pkg) in mods.items():
        if name != "attnkit":  # the root's lazy re-exports
            g.add_edges_from((name, t) for t in _imports(name, path, is_pkg, mods))
    return g


def test_the_graph_sees_every_kind_of_import():
    g = import_graph()
    assert g.has_edge("attnkit.kernels.tuning", "attnkit.kernels.tuning.store")  # in a function
    assert g.has_edge("attnkit.kernels.dispatch", "attnkit.kernels.policy.numerics")  # top level
    assert g.has_edge(
        "attnkit.kernels.blocksparse", "attnkit.kernels.blocksparse.plans"
    )  # __init__
    assert g.number_of_edges() > 200


def test_no_import_circles():
    g = import_graph()
    circles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert circles == [], f"modules that import each other (directly or around a loop): {circles}"
