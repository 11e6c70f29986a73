"""The machine-dependent constants of dispatch and of the kernels' plans, as one typed value.

:class:`Tuning` holds every number that chooses between two ways of computing the same thing
and whose best value depends on the CPU: where ``blocksparse`` starts to beat ``dense``, the
block sizes of its plans, the planner's cost model, when the input scan goes multi-threaded,
how finely numba work is split, and the tile of the fused additive kernels. The built-in
defaults (:data:`DEFAULT`) are conservative (when unsure they keep the backend that loses
least); ``attnkit tune`` measures them on the user's machine and stores them
(:mod:`attnkit.kernels.tuning.store`).

Readers call :func:`current` (one global read after the first call, never file I/O per call).
The first call loads the stored tuning when its key (CPU model, torch and attnkit versions)
matches this process, else :data:`DEFAULT`. :func:`use` installs another one (tests inject a
:class:`Tuning` this way) and tells the listeners registered with :func:`on_change` (dispatch
forgets its remembered choices).

The values (:class:`Tuning`, :data:`DEFAULT`) are defined in :mod:`attnkit.kernels.tuning.values`,
below this module and the store, and re-exported here. Adding a constant: one field there, with
its default and ``_doc(...)`` metadata; readers use
``current().<field>``; ``attnkit tune`` fills it when a measurement in
:mod:`attnkit.autotune` returns it (a field it does not measure keeps the built-in default,
and says so in ``attnkit info``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from attnkit.kernels.tuning.values import BUILT_IN, DEFAULT, Tuning, constants, describe

__all__ = [
    "BUILT_IN",
    "DEFAULT",
    "Tuning",
    "constants",
    "current",
    "describe",
    "on_change",
    "use",
]

_state: dict[str, Tuning] = {}
_listeners: list[Callable[[], None]] = []
_lock = threading.Lock()


def current() -> Tuning:
    """The tuning in use: the stored one for this machine (loaded on the first call, when its
    key matches), else :data:`DEFAULT`; or what :func:`use` installed."""
    t = _state.get("t")
    if t is None:
        with _lock:
            if "t" not in _state:
                from attnkit.kernels.tuning.store import load  # file I/O once per process

                _state["t"] = load().tuning
            t = _state["t"]
    return t


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener()`` whenever :func:`use` installs a tuning (e.g. to forget choices)."""
    _listeners.append(listener)


def _install(t: Tuning | None) -> None:
    if t is None:
        _state.pop("t", None)  # reload from the store on next use
    else:
        _state["t"] = t
    for listener in _listeners:
        listener()


@contextmanager
def use(t: Tuning | None) -> Iterator[Tuning | None]:
    """Run the block with ``t`` as the tuning in use (None: the stored one / defaults, loaded
    again), then restore the previous one."""
    if t is not None and not isinstance(t, Tuning):
        raise TypeError(f"tuning: expected a Tuning or None, got {type(t).__name__}")
    before = _state.get("t")
    _install(t)
    try:
        yield t
    finally:
        _install(before)
