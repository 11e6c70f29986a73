"""Hypothesis settings for the fuzz suite: "ci" (default) and "fuzz" (``make fuzz``).

Select with the environment variable ``HYPOTHESIS_PROFILE`` (``ci`` or ``fuzz``). The profiles
are applied per test through :func:`budget` (not loaded globally, so other hypothesis tests in
the suite keep their own settings).

- ``ci``: derandomized (the same examples on every run, no example database), a bounded number
  of examples per test (660 in all) so that the whole ``tests/fuzz`` share of ``make test``
  stays under ~90 s on one thread; failures are not shrunk (bounded time).
- ``fuzz``: random examples (derandomize=False; failures are saved in ``.hypothesis/`` and
  replayed first next time), 20,000 examples in total, divided as in :data:`EXAMPLES`.

``FUZZ_SHARDS=n`` (fuzz profile only, default 1) gives each test ceil(1/n) of its examples, so
that n processes started at once (each drawing its own random examples, sharing the example
database) run the same 20,000 in all: ``make fuzz`` spread over the cores of a busy machine.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")

_NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target)
_COMMON = dict(
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILES = {
    # no shrinking in CI: a failure is reported as drawn (reproducible, derandomized) and the
    # run stays bounded; `make fuzz` shrinks failures to minimal examples
    "ci": settings(derandomize=True, database=None, phases=_NO_SHRINK, **_COMMON),
    "fuzz": settings(derandomize=False, **_COMMON),
}
if PROFILE not in PROFILES:
    raise ValueError(f"HYPOTHESIS_PROFILE: expected one of {sorted(PROFILES)}, got {PROFILE!r}")

# examples per test: (ci, fuzz); the fuzz column sums to 20,000. Four tests draw from small
# finite spaces and stop once every case has run ("nothing left to do"): invalid_masks (~70
# cases), refused_or_clamped (1,944), invalid_nn (~380), reorder (72).
EXAMPLES = {
    "sdpa": (120, 5000),
    "dot": (30, 1500),
    "general": (30, 1500),
    "additive": (50, 2500),
    "mha": (30, 2000),
    "nonfinite": (40, 1000),
    "invalid_functional": (150, 3900),
    "invalid_masks": (60, 100),
    "refused_or_clamped": (60, 2000),
    "invalid_nn": (60, 400),
    "reorder": (30, 100),
}
assert sum(f for _, f in EXAMPLES.values()) == 20_000

SHARDS = int(os.environ.get("FUZZ_SHARDS", "1"))
if SHARDS < 1:
    raise ValueError(f"FUZZ_SHARDS: expected a positive int, got {SHARDS}")


def budget(name: str) -> settings:
    """The settings of test ``name`` under the selected profile."""
    ci, fuzz = EXAMPLES[name]
    n = -(-fuzz // SHARDS) if PROFILE == "fuzz" else ci
    return settings(PROFILES[PROFILE], max_examples=n)
