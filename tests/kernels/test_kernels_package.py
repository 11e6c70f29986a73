"""What importing attnkit loads (``kernels/__init__.py`` and dispatch import no backend): a mask
loads nothing of ``kernels``, the functional API loads the call record, the policy and dispatch
but no backend, and the first attention call loads the registry with every backend. Each
import runs in a fresh subprocess; the last test shows the check sees backends when they load.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
BACKEND_MODULES = {
    "attnkit.kernels.registry",
    "attnkit.kernels.dense",
    "attnkit.kernels.math",
    "attnkit.kernels.blocksparse",
    "attnkit.kernels.decode",
    "attnkit.kernels.additive",
    "attnkit.kernels.flex",
}


def _loaded_after(code: str) -> set[str]:
    """The attnkit modules in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    report = "import sys; print(*sorted(m for m in sys.modules if m.startswith('attnkit')))"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    r = subprocess.run(
        [sys.executable, "-c", f"{code}\n{report}"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def test_importing_a_mask_loads_nothing_of_kernels():
    loaded = _loaded_after("import attnkit.masks")
    assert "attnkit.masks" in loaded
    assert sorted(m for m in loaded if m.startswith("attnkit.kernels")) == []


def test_importing_the_functional_api_loads_no_backend():
    loaded = _loaded_after("import attnkit.functional")
    assert {"attnkit.functional", "attnkit.kernels.dispatch", "attnkit.kernels.call.base"} <= loaded
    assert sorted(loaded & BACKEND_MODULES) == []


def test_the_kernels_package_names_load_on_first_use():
    loaded = _loaded_after("import attnkit.kernels")
    assert sorted(m for m in loaded if m.startswith("attnkit.kernels.")) == []
    code = "from attnkit.kernels import BACKENDS, AttentionCall, Backend, preference"
    assert BACKEND_MODULES <= _loaded_after(code)


def test_the_first_call_loads_every_backend():
    code = (
        "import torch, attnkit.functional as F\n"
        "q = torch.randn(1, 3, 4)\n"
        "F.scaled_dot_product_attention(q, q, q)"
    )
    assert BACKEND_MODULES <= _loaded_after(code)
