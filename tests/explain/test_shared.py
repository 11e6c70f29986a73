"""attnkit.explain.shared: the one place that finds the checkout's ``../shared`` directory."""

from __future__ import annotations

from pathlib import Path

import attnkit
from attnkit.explain.shared import default_seeds_dir, shared_dir, shared_path

# this test file is <checkout>/tests/explain/test_shared.py
CHECKOUT = Path(__file__).resolve().parents[2]


def test_shared_dir_is_beside_the_checkout():
    assert (CHECKOUT / "src" / "attnkit").is_dir()
    if Path(attnkit.__file__).resolve().parents[2] == CHECKOUT:  # attnkit runs from this checkout
        assert shared_dir() == CHECKOUT.parent / "shared"
    assert shared_dir().name == "shared"


def test_shared_path_prefers_the_checkout_and_falls_back_to_the_working_directory():
    missing = "no-such-entry-" + "x" * 12
    assert shared_path("data", missing) == Path("..", "shared", "data", missing)
    assert not shared_path("data", missing).is_absolute()
    if (shared_dir() / "seeds").exists():
        assert shared_path("seeds") == shared_dir() / "seeds"
        assert default_seeds_dir() == shared_dir() / "seeds"
    else:
        assert default_seeds_dir() == Path("..", "shared", "seeds")
