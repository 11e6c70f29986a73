"""Dispatch: which backend runs a validated :class:`~attnkit.kernels.call.base.AttentionCall`.

Selection only (the model is xformers' ``ops/fmha/dispatch.py``): walk the preference order of
the call's score kind and take the first backend whose ``not_supported_reasons`` (and, for
``backend="auto"``, ``speed_reasons``) are empty. What a backend can do is read from its
:class:`~attnkit.kernels.call.backend.Backend` class every time a call is first seen, never restated
here. Reasons are formatted in one place, :meth:`Dispatch.__str__`, which is also the text of
every "cannot serve" error.

Running: :func:`run` is the one caller of ``Backend.run``. It runs the numerics policy once per
call as one stage (:func:`attnkit.kernels.policy.numerics.prepare` / ``finish``, the additive policy
for additive calls), hands the backend the typed decision, and alone does fallbacks: a backend
that refuses the decision (``Backend.decision_reasons``) or hands the call back (a failed
in-kernel check) passes it to its ``fallback``; :func:`fallbacks` says so in words, which
``explain_dispatch`` prints.

Cheap: the per-call cost of choosing is paid once per *call signature*. :class:`ChoiceCache`
remembers the outcome of validation and selection under a key built from everything that
validation and a backend's reasons may read: tensor types, shapes, strides, dtypes, devices,
``requires_grad`` and the grad mode; the mask's identity (a mask object) or identity, version
counter and layout (a mask tensor); the scalar options with their types (``scale=True`` never
matches ``scale=1.0``); the requested backend. A backend whose reasons depend on anything else
(tensor *values*, mutable settings) must call :func:`clear_cache` when that changes.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from torch import Tensor

from attnkit.kernels.call.backend import Backend
from attnkit.kernels.call.base import AttentionCall, ungrouped
from attnkit.kernels.call.layout import ScanPlan
from attnkit.kernels.policy import additive as additive_policy
from attnkit.kernels.policy import numerics
from attnkit.kernels.policy.decision import NumericsDecision
from attnkit.kernels.policy.steady import Steady
from attnkit.kernels.tuning import on_change
from attnkit.masks import Mask
from attnkit.tensor_version import version

__all__ = [
    "PREFERENCE",
    "WEIGHTS_LIMIT",
    "ChoiceCache",
    "Dispatch",
    "check_backend_name",
    "check_weights_limit",
    "clear_cache",
    "explain",
    "fallbacks",
    "mask_key",
    "preference",
    "run",
    "select",
    "tensor_key",
]

PREFERENCE: dict[str, tuple[str, ...]] = {
    "dot": ("decode", "flex", "blocksparse", "dense", "math"),
    "additive": ("additive_fused", "additive_chunked", "math"),
}
"""Per score kind, the order in which ``backend="auto"`` tries the backends."""

WEIGHTS_LIMIT = 2**26
"""Most attention-weight entries (B*H*Lq*Lk) returned by ``return_weights=True`` (256 MiB fp32)."""


_REGISTRY: list[dict[str, Backend]] = []


def backends() -> dict[str, Backend]:
    """The registry (:data:`attnkit.kernels.registry.BACKENDS`), imported at its first use:
    importing dispatch (and the functional API) loads no backend."""
    if not _REGISTRY:
        from attnkit.kernels.registry import BACKENDS

        _REGISTRY.append(BACKENDS)
    return _REGISTRY[0]


def preference(kind: str) -> tuple[str, ...]:
    """Registered backend names in the order ``backend="auto"`` tries them for score ``kind``."""
    registered = backends()
    return tuple(n for n in PREFERENCE[kind] if n in registered)


@dataclass(frozen=True)
class Dispatch:
    """The backend chosen for a call and, for every backend considered, why it was not chosen.

    ``chosen`` is None when nothing can serve the call; ``reasons[name]`` is an empty list for a
    backend that could serve it (but came later in preference order)."""

    chosen: str | None
    reasons: dict[str, list[str]]
    requested: str = "auto"
    notes: tuple[str, ...] = ()
    """Why ``auto`` chose ``chosen`` when a tuned constant decided (:mod:`.tuning`)."""
    fallbacks: tuple[str, ...] = ()
    """Where the chosen backend hands the call under the policy's decision, and why
    (:func:`fallbacks`)."""

    def __str__(self) -> str:
        lines = [f"backend: {self.chosen or 'none'} (requested: {self.requested})"]
        lines += [f"  {self.chosen}: chosen: {n}" for n in self.notes]
        lines += [f"  fallback: {n}" for n in self.fallbacks]
        for name, why in self.reasons.items():
            if name == self.chosen:
                continue
            lines.append(f"  {name}: " + ("; ".join(why) if why else "could serve, lower priority"))
        return "\n".join(lines)

    def error(self) -> ValueError:
        """The ValueError raised when nothing can serve the call."""
        if self.requested != "auto":
            why = "; ".join(self.reasons[self.requested])
            return ValueError(f"backend: {self.requested!r} cannot serve this call: {why}")
        return ValueError(f"backend: no backend can serve this call:\n{self}")


def check_backend_name(backend: object) -> str:
    """``backend`` if it is "auto" or a registered backend name (TypeError / ValueError)."""
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str, got {type(backend).__name__}")
    if backend != "auto" and backend not in (registered := backends()):
        raise ValueError(
            f"backend: expected 'auto' or one of {sorted(registered)}, got {backend!r}"
        )
    return backend


def check_weights_limit(batch_numel: int, q_len: int, kv_len: int) -> None:
    """ValueError (naming ``return_weights``) when the weights would exceed WEIGHTS_LIMIT."""
    n = batch_numel * q_len * kv_len
    if n > WEIGHTS_LIMIT:
        raise ValueError(
            f"return_weights: the weights would have {n:,} entries "
            f"(> {WEIGHTS_LIMIT:,}); ask for fewer: slice the query rows (q[..., rows, :]) or "
            "the heads you want to see and call again, or call without return_weights"
        )


def _reasons(b: Backend, call: AttentionCall, auto: bool) -> list[str]:
    why = b.not_supported_reasons(call)
    return why if why or not auto else b.speed_reasons(call)


def explain(call: AttentionCall, backend: str = "auto") -> Dispatch:
    """Every considered backend's reasons and the choice (nothing is computed or remembered)."""
    backend = check_backend_name(backend)
    if backend != "auto":
        # a forced backend must be able to serve the call; being slower is the user's choice
        reasons = {backend: _reasons(backends()[backend], call, auto=False)}
        return Dispatch(None if reasons[backend] else backend, reasons, backend)
    names, registered = preference(call.kind), backends()
    reasons = {n: _reasons(registered[n], call, auto=True) for n in names}
    chosen = next((n for n in names if not reasons[n]), None)
    notes = () if chosen is None else tuple(registered[chosen].choice_notes(call))
    return Dispatch(chosen, reasons, backend, notes)


def select(call: AttentionCall, backend: str = "auto") -> Backend:
    """The backend that runs ``call``: the first in preference order that can serve it (for
    "auto"), or the forced one; ValueError with every reason when there is none."""
    if backend == "auto":
        registered = backends()
        for n in preference(call.kind):
            b = registered[n]
            if not _reasons(b, call, auto=True):
                return b
    else:
        b = backends()[check_backend_name(backend)]
        if not b.not_supported_reasons(call):
            return b
    raise explain(call, backend).error()


# ---------------------------------------------------------------------------------------------
# running: the policy stage and the fallbacks
# ---------------------------------------------------------------------------------------------
def _accepting(
    b: Backend, call: AttentionCall, d: NumericsDecision
) -> tuple[Backend, AttentionCall]:
    """The first of ``b`` and its fallbacks that runs ``call`` under ``d``, with the call it runs
    (k and v repeated to q's heads for a backend without ``supports_gqa``)."""
    if not b.decision_reasons(call, d):  # the common case: at once, the call itself
        return b, (call if b.supports_gqa else ungrouped(call))
    registered = backends()
    for _ in range(len(registered)):
        if b.fallback is None:
            break
        b = registered[b.fallback]
        if not b.decision_reasons(call, d):
            return b, (call if b.supports_gqa else ungrouped(call))
    raise RuntimeError(f"backend: no fallback accepts the policy's decision {d}")


def run(call: AttentionCall, backend: Backend) -> tuple[Tensor, Tensor | None]:
    """(output, weights or None) of ``call`` on ``backend`` (chosen by :func:`select`), under
    the numerics policy run once as a stage (``kernels/call/base.py`` describes the four steps).
    A call of a remembered signature with a :class:`~attnkit.kernels.policy.steady.Steady`
    check whose inputs pass it runs on the plain decision at once (the same decision the stage
    would reach); every other call, and one that fails the check, takes the stage in full."""
    steady = call.memo.steady  # a remembered signature of the policy's common case
    if steady is not None and (plain := steady.decide(call.q, call.k, call.v)) is not None:
        res = backend.run(call, plain)  # the backend accepts the plain decision (steady_for)
        if res is not None:
            return numerics.finish(call, plain, *res)
    policy = numerics if call.kind == "dot" else additive_policy
    work, d = policy.prepare(call, backend.kernel_checks)
    b, work = _accepting(backend, work, d)
    res = b.run(work, d)
    if res is None:  # the kernel's own check failed: redo the call under the scanned policy
        work, d = policy.prepare(call)
        b, work = _accepting(backends()[b.fallback or "math"], work, d)
        res = b.run(work, d)
        if res is None:
            raise RuntimeError(f"backend: {b.name} handed back a call of a scanned decision")
    return policy.finish(call, d, *res)


def fallbacks(call: AttentionCall, chosen: str, d: NumericsDecision) -> tuple[str, ...]:
    """In words: where backend ``chosen`` hands ``call`` under decision ``d``
    (``decision_reasons`` along the fallback chain) or may hand it at run time
    (``fallback_notes``)."""
    registered = backends()
    out, b = [], registered[chosen]
    out += [f"{b.name}: {n}" for n in b.fallback_notes(call)]
    for _ in range(len(registered)):
        why = b.decision_reasons(call, d)
        if not why or b.fallback is None:
            break
        out.append(f"{b.name} hands the call to {b.fallback}: " + "; ".join(why))
        b = registered[b.fallback]
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# remembered choices
# ---------------------------------------------------------------------------------------------
def tensor_key(t: Tensor) -> tuple:
    """What validation and backend reasons may read from a tensor, as a hashable tuple."""
    return (type(t), t.shape, t.stride(), t.dtype, t.device, t.requires_grad)


def mask_key(mask: object, grad: bool) -> tuple | None:
    """The signature part of a mask argument (None, a mask object or a mask tensor), or None
    when the mask cannot be remembered (e.g. an inference tensor has no version counter).

    With grad mode on, a mask object's part includes which of its bias tensors require grad
    (a backend may lack a bias backward)."""
    if mask is None:
        return ()
    if isinstance(mask, Tensor):
        v = version(mask)
        return None if v is None else ("tensor", id(mask), v, *tensor_key(mask))
    try:
        weakref.ref(mask)
    except TypeError:
        return None
    if grad and isinstance(mask, Mask):
        return ("object", id(mask), type(mask), *(t.requires_grad for t in mask.bias_tensors()))
    return ("object", id(mask), type(mask))


@dataclass(frozen=True)
class Choice:
    """A remembered outcome: the backend, the normalised options, a weak reference to the
    mask argument (its id is in the key; the reference proves it is still the same object) and
    what the policy's input scan can read of q, k and v (a function of the signature)."""

    backend: Backend
    options: tuple
    mask_ref: weakref.ref | None
    scan_plan: ScanPlan | None = None
    """:func:`attnkit.kernels.policy.scan.plan3` of the signature's q, k and v (None: none)."""
    steady: Steady | None = None
    """:func:`attnkit.kernels.policy.steady.steady_for` the signature on the backend (None:
    not of the policy's common case)."""


class ChoiceCache:
    """A bounded map from call signature to :class:`Choice` (oldest entries evicted first)."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._entries: dict[tuple, Choice] = {}
        self._backends: dict[str, Backend] = {}  # the registry, from the first put

    def get(self, key: tuple, mask: object) -> Choice | None:
        c = self._entries.get(key)
        if c is None:
            return None
        if c.mask_ref is not None and c.mask_ref() is not mask:
            return None  # the id now belongs to another object
        if self._backends.get(c.backend.name) is not c.backend:
            return None  # the registry changed
        return c

    def put(
        self,
        key: tuple,
        backend: Backend,
        options: tuple,
        mask: object,
        scan_plan: ScanPlan | None = None,
        steady: Steady | None = None,
    ) -> None:
        self._backends = backends()
        ref = None if mask is None else weakref.ref(mask)
        self._entries[key] = Choice(backend, options, ref, scan_plan, steady)
        while len(self._entries) > self.size:
            try:
                del self._entries[next(iter(self._entries))]
            except (KeyError, StopIteration, RuntimeError):  # another thread evicted it
                break

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


CACHE = ChoiceCache()


def clear_cache() -> None:
    """Forget every remembered choice (after changing a backend's settings or the registry)."""
    CACHE.clear()


on_change(clear_cache)  # a new tuning (attnkit.kernels.tuning.use) may change speed reasons
