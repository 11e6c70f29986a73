"""Running numba callbacks on torch's OpenMP threads (kernels/numba/openmp.py): found where torch
uses OpenMP, off when ``ATTNKIT_NO_OPENMP`` is set, and a decode step gives the same result on
either route (the float64 comparisons of both routes are in test_decode_split_k.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from attnkit.kernels.numba import openmp


def _available_in_child(env: dict[str, str]) -> str:
    code = "from attnkit.kernels.numba import openmp; print(openmp.available())"
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_the_variable_turns_the_openmp_route_off():
    env = dict(os.environ, ATTNKIT_NO_OPENMP="1")
    assert _available_in_child(env) == "False"


def test_available_follows_torchs_parallel_backend():
    uses_openmp = "parallel backend: OpenMP" in torch.__config__.parallel_info()
    if not uses_openmp:
        assert not openmp.available()
    elif os.environ.get("ATTNKIT_NO_OPENMP"):
        pytest.skip("ATTNKIT_NO_OPENMP is set in this environment")
    else:
        env = {k: v for k, v in os.environ.items() if k != "ATTNKIT_NO_OPENMP"}
        assert _available_in_child(env) == "True"


_FORK_SCRIPT = """
import os, signal, sys, torch
import attnkit
torch.set_num_threads(2)
q, k, v = torch.randn(1, 8, 1, 64), torch.randn(1, 8, 4096, 64), torch.randn(1, 8, 4096, 64)
with torch.no_grad():
    a = attnkit.scaled_dot_product_attention(q, k, v, backend="decode")
pid = os.fork()
if pid == 0:
    signal.alarm(60)  # a hang becomes a failure, not a stuck test run
    from attnkit.kernels.numba import openmp
    with torch.no_grad():
        b = attnkit.scaled_dot_product_attention(q, k, v, backend="decode")
    os._exit(0 if (not openmp.available() and torch.allclose(a, b, atol=1e-6)) else 3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_decodes_on_the_thread_pool():
    """GNU OpenMP's pool is not usable after fork (its threads stay in the parent): a child's
    decode step must take the thread pool, finish, and give the parent's result."""
    res = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT], capture_output=True, text=True, timeout=180
    )
    assert res.returncode == 0, (res.returncode, res.stderr[-2000:])
