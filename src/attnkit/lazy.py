"""Names a package exports, imported on first use (PEP 562), so that importing the package (and
``attnkit --help``) does not pay for torch or numpy. No attnkit dependencies.

    # in a package's __init__.py
    __getattr__ = lazy_exports(__name__, {"walkthrough": "attnkit.explain.steps"})

``from package import name`` and ``package.name`` then import the module on first use and keep
the value in the package's namespace. A name mapped to ``f"{package}.{name}"`` is that submodule.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``names`` maps each exported name to the module
    that defines it (or, for a submodule, to the submodule's own full name)."""
    table = dict(names)

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(table[name])
        value = module if table[name] == f"{package}.{name}" else getattr(module, name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
