"""Which backends can serve a call: every backend in ``attnkit.kernels.BACKENDS`` whose reasons
(from ``attnkit.functional.explain_dispatch``) are empty, so new backends are tested as soon as
they are registered."""

from __future__ import annotations

from attnkit import functional as F
from attnkit.kernels import BACKENDS


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
