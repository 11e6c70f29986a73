"""The contention monitor: the team size of a short parallel region from the run-queue wait of
the process's threads (injected samples and clock), and that the decode step's result does not
depend on the team size."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from attnkit.kernels.numba import contention
from attnkit.kernels.numba.contention import ENTER, HOLD_S, SAMPLE_S, Monitor

DT = 1.5 * SAMPLE_S
"""One step of the fake clock: a sample apart, with room for rounding."""


class Feed:
    """A fake clock and schedstat: ``step(dt, busy)`` advances the clock by dt seconds, during
    which the threads ran dt and waited ``busy`` times as long."""

    def __init__(self) -> None:
        self.t, self.ran, self.waited = 100.0, 0, 0

    def step(self, dt: float, busy: float) -> None:
        self.t += dt
        self.ran += int(dt * 1e9)
        self.waited += int(dt * 1e9 * busy)

    def monitor(self) -> Monitor:
        return Monitor(read=lambda: (self.ran, self.waited), clock=lambda: self.t)


def test_quiet_machine_keeps_every_thread():
    f = Feed()
    m = f.monitor()
    for _ in range(50):
        assert m.team(4) == 4
        f.step(DT, 0.01)


def test_contended_machine_gets_one_thread_until_a_probe_says_otherwise():
    f = Feed()
    m = f.monitor()
    assert m.team(2) == 2  # first sample: a baseline, no verdict
    f.step(DT, 2 * ENTER)
    assert m.team(2) == 1
    # on one thread the wait falls, but the verdict holds for HOLD_S
    n = 0
    while (n + 2) * DT < HOLD_S:
        f.step(DT, 0.0)
        assert m.team(2) == 1, n
        n += 1
    f.step(2 * DT, 0.0)
    assert m.team(2) == 2  # the probe: the full team for one sample
    f.step(DT, 3 * ENTER)  # still contended
    assert m.team(2) == 1
    f.step(HOLD_S, 0.0)
    assert m.team(2) == 2  # probe again
    f.step(DT, 0.0)  # the machine is free now
    assert m.team(2) == 2
    f.step(DT, 0.0)
    assert m.team(2) == 2


def test_samples_closer_than_sample_s_change_nothing():
    f = Feed()
    m = f.monitor()
    m.team(2)
    f.step(SAMPLE_S / 10, 100.0)
    assert m.team(2) == 2


def test_no_schedstat_means_every_thread_and_one_thread_stays_one():
    m = Monitor(read=lambda: None, clock=lambda: 0.0)
    assert m.team(8) == 8
    assert Monitor().team(1) == 1


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.exists("/proc/self/task"),
    reason="schedstat is Linux's",
)
def test_read_schedstat_counts_this_process_running():
    first = contention.read_schedstat()
    if first is None:
        pytest.skip("this kernel has no schedstat files")
    sum(i * i for i in range(200_000))
    second = contention.read_schedstat()
    assert second[0] > first[0] and second[1] >= first[1]


def test_decode_result_does_not_depend_on_the_team(monkeypatch):
    """Grouped heads with more splits than blocks: the same units, claimed by one thread or by
    every thread, give bit-identical outputs (and match float64)."""
    from attnkit.kernels.decode import split_k

    if split_k.numba_missing():
        pytest.skip(split_k.numba_missing())
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 4, 1, 64, generator=g)
    k, v = (torch.randn(1, 2, 1, 4099, 64, generator=g) for _ in range(2))
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(contention, "team", lambda threads: threads)
        full = split_k.attend_split_k(q, k, v, 0.125, 1e30)
        monkeypatch.setattr(contention, "team", lambda threads: 1)
        one = split_k.attend_split_k(q, k, v, 0.125, 1e30)
    finally:
        torch.set_num_threads(old)
    assert split_k.splits_for(2, 4099, 2) > 1
    assert torch.equal(full, one)
    s = torch.einsum("bhgqd,bhxkd->bhgqk", q.double(), k.double()) * 0.125
    want = torch.einsum("bhgqk,bhxkd->bhgqd", s.softmax(-1), v.double())
    assert (full.double() - want).abs().max() < 1e-5
