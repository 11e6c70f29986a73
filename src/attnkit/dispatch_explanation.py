"""What :func:`attnkit.functional.explain_dispatch` returns: which backend would run a call, why
each other one was rejected, and why the overflow policy runs it in float64 when it does
(:class:`Explanation`); nothing is computed but the policy's input scan."""

from __future__ import annotations

from dataclasses import dataclass

from attnkit import checks
from attnkit.calls import parse
from attnkit.kernels import dispatch
from attnkit.kernels.policy import additive as additive_policy
from attnkit.kernels.policy import numerics

__all__ = ["Explanation", "explain"]


@dataclass(frozen=True)
class Explanation(dispatch.Dispatch):
    """What :func:`attnkit.functional.explain_dispatch` returns: the
    :class:`~attnkit.kernels.dispatch.Dispatch` (choice and reasons) and ``precision``, "runs in
    float64 because ..." when the overflow policy computes the call in float64 (None
    otherwise)."""

    precision: str | None = None

    def __str__(self) -> str:
        base = super().__str__()
        return base if self.precision is None else f"{base}\n{self.precision}"


def explain(kind: object, q: object, k: object, v: object, mask: object, **options) -> Explanation:
    """The :class:`Explanation` of the call :func:`attnkit.calls.parse` makes of these arguments
    (``kind`` "dot" or "additive"; ``options`` as parse takes them), without choosing or
    remembering a backend."""
    checks.choice("kind", kind, ("dot", "additive"))
    if kind != "additive":  # additive attention's weights: never silently ignored
        given = [n for n in ("w_q", "w_k", "w_v") if options.get(n) is not None]
        if given:
            raise ValueError(
                f"{given[0]}: the weights of additive attention need kind='additive', "
                f"got kind={kind!r}"
            )
        options = {n: o for n, o in options.items() if n not in ("w_q", "w_k", "w_v")}
    backend = options.get("backend", "auto")
    call = parse(kind, q, k, v, mask, select=False, **options).call  # type: ignore[arg-type]
    d = dispatch.explain(call, backend)
    reason, falls = None, ()
    if d.chosen is not None:
        policy = numerics if kind == "dot" else additive_policy
        decision = policy.prepare(call, warn=False)[1]
        reason, falls = decision.float64_reason, dispatch.fallbacks(call, d.chosen, decision)
    precision = None if reason is None else str(reason)
    return Explanation(d.chosen, d.reasons, d.requested, d.notes, falls, precision=precision)
