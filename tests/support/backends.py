"""Which backends can serve a call: every backend in ``attnkit.kernels.BACKENDS`` whose reasons
(from ``attnkit.functional.explain_dispatch``) are empty, so new backends are tested as soon as
they are registered."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from attnkit import functional as F
from attnkit.kernels import BACKENDS, dispatch


def serving(
    kind: str, q, k, v, mask, *, rw: bool, scale=None, ignore_speed: bool = True, **kw
) -> list[str]:
    """Names of every backend that can serve this call. With ``ignore_speed`` (the default) a
    backend that ``auto`` passes over only for speed still counts (it can be forced)."""
    args = dict(kind=kind, scale=scale, return_weights=rw, **kw)
    reasons = F.explain_dispatch(q, k, v, mask, **args).reasons  # the backends "auto" considers
    for name in BACKENDS:
        if name not in reasons or (ignore_speed and reasons[name]):  # ask it directly
            reasons[name] = F.explain_dispatch(q, k, v, mask, backend=name, **args).reasons[name]
    return [name for name in BACKENDS if not reasons[name]]


@contextmanager
def chosen_backends() -> Iterator[list[str]]:
    """A list that fills with the name of the backend dispatch selects for each call made in
    the block (calls whose choice is remembered are not selected again)."""
    chosen: list[str] = []
    real = dispatch.select

    def spy(call, backend="auto"):
        b = real(call, backend)
        chosen.append(b.name)
        return b

    dispatch.select = spy
    try:
        yield chosen
    finally:
        dispatch.select = real
