"""The layers of ``attnkit.train``, from the import graph of every module (module level and
inside functions, as ``tests/test_import_circles.py`` builds it): the floor (recipes, config,
loss, checkpoint, best) imports no package of train; ``data`` imports neither ``inference`` nor
``loop``; ``inference`` does not import ``loop``; and the loss imports no tokenizer (the padding
id is its argument)."""

from __future__ import annotations

import pytest

from tests.test_import_circles import import_graph

FLOOR = ["recipes", "config", "loss", "checkpoint", "best"]
ABOVE = {"data": ("inference", "loop"), "inference": ("loop",), "loop": ()}


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def _imports_of(graph, prefix: str) -> set[str]:
    return {t for m in graph if m == prefix or m.startswith(prefix + ".") for t in graph[m]}


def test_the_floor_imports_no_package_of_train(graph):
    for name in FLOOR:
        bad = {t for t in graph[f"attnkit.train.{name}"] if t.startswith("attnkit.train.")}
        assert bad <= {f"attnkit.train.{f}" for f in FLOOR}, (name, bad)
    assert not any("tokenizer" in t for t in graph["attnkit.train.loss"])


@pytest.mark.parametrize("package", sorted(ABOVE))
def test_each_package_imports_only_below_it(graph, package):
    targets = _imports_of(graph, f"attnkit.train.{package}")
    for above in ABOVE[package]:
        assert {t for t in targets if t.startswith(f"attnkit.train.{above}")} == set(), above


def test_the_graph_sees_the_layers(graph):
    """The check can fail: the edges it relies on are there."""
    assert graph.has_edge("attnkit.train.loop.run", "attnkit.train.inference.session")
    assert graph.has_edge("attnkit.train.inference.metrics", "attnkit.train.data.batches")
