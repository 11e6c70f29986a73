"""attnkit.explain.printed_values: every printed value's snippet is exact seed text, found in
the seed file (skipped, with the reason, when ../shared/seeds is absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnkit import explain as ex
from attnkit.explain.shared import shared_dir

SEEDS = shared_dir() / "seeds"


@pytest.mark.skipif(not SEEDS.is_dir(), reason=f"seed files not found at {SEEDS} (../shared)")
@pytest.mark.parametrize("name", sorted(ex.EXAMPLES))
def test_snippets_occur_in_the_seed_files(name):
    prefix = {"bahdanau-vs-dot": "004_", "softmax": "002_"}[name]
    (seed_file,) = sorted(SEEDS.glob(prefix + "*.txt"))
    text = seed_file.read_text(encoding="utf-8")
    result = ex.seed_example(name, SEEDS)
    assert result.seed_file_found and Path(result.seed_file) == seed_file
    for c in result.comparisons:
        assert c.printed.snippet in text, c.printed.key
        if "√" not in c.printed.printed:  # a number as printed is part of its snippet
            assert c.printed.printed in c.printed.snippet, c.printed.key
        assert c.snippet_found is True
        assert text.splitlines()[c.seed_line - 1].find(c.printed.snippet) >= 0


@pytest.mark.skipif(not SEEDS.is_dir(), reason=f"seed files not found at {SEEDS} (../shared)")
@pytest.mark.parametrize("name", sorted(ex.EXAMPLES))
def test_packaged_texts_are_the_seed_files(name):
    """The tutorial texts shipped in the package are byte-for-byte the seed files."""
    prefix = {"bahdanau-vs-dot": "004_", "softmax": "002_"}[name]
    (seed_file,) = sorted(SEEDS.glob(prefix + "*.txt"))
    result = ex.seed_example(name)
    assert result.seeds_dir is None and result.seed_file_found
    assert Path(result.seed_file).read_bytes() == seed_file.read_bytes()
    assert all(c.snippet_found for c in result.comparisons)


def test_catalog_lists_every_example():
    from attnkit.explain import catalog

    assert set(catalog.EXAMPLES) == set(ex.EXAMPLES)
