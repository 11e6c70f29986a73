"""Streams of small SDPA calls (kernels/blocksparse/streams.py): a plan's calls shared out
between torch's threads, each on one thread. The results must be those of the calls run one
after the other and of the float64 reference, in every mode a caller can be in; the workers must
not change the caller's threads; a job's error must reach the caller."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnkit
from attnkit.kernels.blocksparse import streams, tiles
from attnkit.reference import scaled_dot_product
from tests.support import masks as S
from tests.support.numerics import max_rel_err, to_np

needs_streams = pytest.mark.skipif(not streams.available(), reason="streams need torch on OpenMP")


@pytest.fixture(autouse=True)
def two_threads():
    """The suite runs on one torch thread (tests/conftest.py); streams need two."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


_G = torch.Generator().manual_seed(7)


def _reference(q, k, v, spec):
    batch = tuple(q.shape[:-2])
    ref = scaled_dot_product(
        to_np(q), to_np(k), to_np(v), S.ref_mask(spec, batch, q.shape[-2], k.shape[-2])
    )
    return np.nan_to_num(ref.output)  # rows with no allowed key give 0 (policy P1)


def _qkv(b, h, lq, lk, d, seed, grad=False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g).requires_grad_(grad) for n in (lq, lk, lk)]


@needs_streams
@settings(max_examples=12, deadline=None)
@given(
    b=st.integers(2, 7),
    lq=st.integers(1, 300),
    lk=st.integers(1, 300),
    zero=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_per_element_padding_matches_float64(b, lq, lk, zero, seed):
    """Key padding varying per element (a zero length: every row of that element is empty)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0 if zero else 1, lk + 1, (b,), generator=g)
    lengths[0] = lk
    spec = S.key_padding(lengths)
    q, k, v = _qkv(b, 3, lq, lk, 16, seed)
    with torch.inference_mode():
        out = attnkit.scaled_dot_product_attention(q, k, v, spec.mask, backend="blocksparse")
    assert max_rel_err(out, _reference(q, k, v, spec)) < 1e-5


@needs_streams
@pytest.mark.parametrize("mode", ["inference", "no_grad", "grad"])
@pytest.mark.parametrize(
    ("spec", "lq"),
    [
        (S.key_padding(torch.tensor([301, 3, 130, 0, 64, 200])), 257),
        (S.document(torch.sort(torch.randint(0, 5, (6, 301), generator=_G), -1).values), 301),
        (S.causal("bottom_right") & S.key_padding(torch.tensor([301, 3, 130, 0, 64, 200])), 257),
    ],
    ids=["padding", "documents", "causal-bottom-right-and-padding"],
)
def test_streams_in_every_mode_match_sequential_and_float64(monkeypatch, mode, spec, lq):
    q, k, v = _qkv(6, 5, lq, 301, 24, 3, grad=mode == "grad")
    seen = []
    real = streams.run_streams

    def spy(jobs, costs, n):
        seen.append(n)
        return real(jobs, costs, n)

    monkeypatch.setattr(tiles, "run_streams", spy)

    def run(force_one: bool):
        if force_one:
            monkeypatch.setattr(tiles, "streams_for", lambda n: 1)
        ctx = {"inference": torch.inference_mode, "no_grad": torch.no_grad}.get(mode)
        with ctx() if ctx else torch.enable_grad():
            out = attnkit.scaled_dot_product_attention(q, k, v, spec.mask, backend="blocksparse")
        assert out.requires_grad == (mode == "grad")
        return out

    out = run(False)
    assert max(seen) > 1, "the calls did not run in streams"
    ref = _reference(q, k, v, spec)
    assert max_rel_err(out, ref) < 1e-5
    if mode == "grad":
        before = len(seen)
        grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        assert max(seen[before:]) > 1, "the backward's calls did not run in streams"
    one = run(True)  # the calls one after the other, each on every thread
    # the fused kernel's blocking follows the thread count: rounding may differ, nothing else
    assert max_rel_err(out, one) < 1e-6
    if mode == "grad":
        for a, b in zip(grads, torch.autograd.grad(one, (q, k, v), torch.ones_like(one))):
            assert max_rel_err(a, b) < 1e-5


def test_disjoint_rows():
    C = tiles.Call
    assert tiles.disjoint_rows([C(0, 4, 0, 9, p=0), C(4, 8, 0, 9, p=0), C(0, 8, 0, 9, p=1)])
    assert tiles.disjoint_rows([C(0, 4, 0, 9), C(4, 8, 0, 9)])
    assert not tiles.disjoint_rows([C(0, 5, 0, 9, p=0), C(4, 8, 0, 9, p=0)])
    assert not tiles.disjoint_rows([C(0, 4, 0, 9), C(2, 3, 0, 9, p=1)])
    assert not tiles.disjoint_rows([C(0, 4, 0, 9), C(3, 8, 5, 9)])


@needs_streams
def test_workers_run_one_thread_and_leave_the_caller_alone():
    seen = streams.run_streams([torch.get_num_threads] * 8, [1.0] * 8, 2)
    assert seen == [1] * 8
    before = torch.get_num_threads()
    assert before >= 2 and torch.get_num_threads() == before


def test_results_in_order_errors_raised_and_bad_costs_refused():
    jobs = [lambda i=i: i * i for i in range(9)]
    assert streams.run_streams(jobs, [9 - i for i in range(9)], 3) == [i * i for i in range(9)]
    assert streams.run_streams(jobs, [1.0] * 9, 1) == [i * i for i in range(9)]

    def boom():
        raise ValueError("job failed 4321")

    with pytest.raises(ValueError, match="job failed 4321"):
        streams.run_streams([*jobs, boom], [1.0] * 10, 2)
    with pytest.raises(ValueError, match="costs: expected one per job"):
        streams.run_streams(jobs, [1.0], 2)


def test_shares_balance_by_cost_and_keep_order():
    """Longest first, each to the least loaded stream; each stream in the original order."""
    assert streams.share_out([5, 1, 1, 1, 1, 1], 2) == [[0], [1, 2, 3, 4, 5]]
    assert streams.share_out([1, 2, 3, 4], 2) == [[0, 3], [1, 2]]
    assert streams.share_out([1.0], 3) == [[0]]  # no empty stream


def test_streams_for_counts():
    assert streams.streams_for(1) == 1
    n = streams.streams_for(1000)
    assert 1 <= n <= max(1, torch.get_num_threads())


@needs_streams
def test_forked_child_runs_streams():
    """A child forked after the parent ran streams has none of its workers: it builds its own."""
    script = textwrap.dedent(
        """
        import os, sys, torch, attnkit
        from attnkit import masks as M
        torch.set_num_threads(2)
        q = torch.randn(4, 2, 200, 16)
        lengths = torch.tensor([200, 5, 90, 130])
        with torch.inference_mode():
            a = attnkit.scaled_dot_product_attention(q, q, q, M.key_padding(lengths),
                                                     backend="blocksparse")
        pid = os.fork()
        if pid == 0:
            torch.set_num_threads(1)  # torch's own parallel regions hang in a forked child
            with torch.inference_mode():
                b = attnkit.scaled_dot_product_attention(q, q, q, M.key_padding(lengths),
                                                         backend="blocksparse")
            os._exit(0 if torch.equal(a, b) else 3)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
        """
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr


@needs_streams
@pytest.mark.parametrize("layout", ["transposed", "stepped", "expanded"])
def test_streams_on_every_layout_match_float64(monkeypatch, layout):
    """Heads-major views of (B, L, H, d) tensors, every other row of a longer tensor, and k/v
    expanded over the batch (one element's memory for all): outputs and gradients against
    float64, the forward and the backward in streams."""
    b, h, lq, lk, d = 6, 3, 257, 301, 16
    g = torch.Generator().manual_seed(11)
    if layout == "transposed":
        q, k, v = (torch.randn(b, n, h, d, generator=g).transpose(1, 2) for n in (lq, lk, lk))
    elif layout == "stepped":
        q, k, v = (torch.randn(b, h, 2 * n, d, generator=g)[:, :, ::2] for n in (lq, lk, lk))
    else:
        q = torch.randn(b, h, lq, d, generator=g)
        k, v = (torch.randn(1, h, lk, d, generator=g).expand(b, h, lk, d) for _ in range(2))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    spec = S.key_padding(torch.tensor([301, 5, 90, 0, 131, 64]))
    seen = []
    real = streams.run_streams
    monkeypatch.setattr(tiles, "run_streams", lambda j, c, n: seen.append(n) or real(j, c, n))
    out = attnkit.scaled_dot_product_attention(q, k, v, spec.mask, backend="blocksparse")
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert max(seen) > 1, "the calls did not run in streams"
    assert max_rel_err(out, _reference(q, k, v, spec)) < 1e-5
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = attnkit.scaled_dot_product_attention(q64, k64, v64, spec.mask, backend="math")
    for got, want in zip(grads, torch.autograd.grad(ref, (q64, k64, v64), torch.ones_like(ref))):
        assert max_rel_err(got, want) < 1e-5
