"""Where the checkout's ``../shared`` directory is: the seeds (``seeds/``) and the test data
(``data/``) kept beside the repository, never inside it.

    shared_dir()                  # <checkout>/../shared, whether or not it exists
    shared_path("seeds")          # that path when it exists, else ../shared/seeds (cwd-relative)

``<checkout>`` is the directory holding ``src/attnkit/`` (four levels above this file in a
source checkout). Tests, benchmarks and scripts call these instead of building the path
themselves. Torch-free, no imports beyond the standard library.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["default_seeds_dir", "shared_dir", "shared_path"]


def shared_dir() -> Path:
    """``<checkout>/../shared``: the directory beside the source checkout (may not exist, for
    example in an installed copy of attnkit)."""
    checkout = Path(__file__).resolve().parents[3]
    return checkout.parent / "shared"


def shared_path(*parts: str) -> Path:
    """``shared_dir() / parts`` when it exists, else ``../shared / parts`` relative to the
    working directory (an installed attnkit run from inside a checkout)."""
    candidate = shared_dir().joinpath(*parts)
    if candidate.exists():
        return candidate
    return Path("..", "shared", *parts)


def default_seeds_dir() -> Path:
    """The seed files: ``<checkout>/../shared/seeds`` when it exists, else ``./../shared/seeds``
    relative to the working directory."""
    return shared_path("seeds")
