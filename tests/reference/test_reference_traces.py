"""attnkit.reference.traces are frozen and read-only; the reference never imports torch."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnkit import reference as R


def test_traces_are_frozen_and_read_only():
    rng = np.random.default_rng(13)
    Q = rng.normal(size=(3, 2))
    t = R.scaled_dot_product(Q, Q, Q)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.output = None  # type: ignore[misc]
    with pytest.raises(ValueError):
        t.weights[0, 0] = 1.0
    Q[0, 0] = 100.0  # the trace holds a copy of the input
    assert t.q[0, 0] != 100.0
    p = R.sinusoidal_positions(3, 4)
    with pytest.raises(ValueError):
        p.output[0, 0] = 1.0


def test_reference_does_not_import_torch():
    path = Path(R.__file__)
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('ref', {str(path)!r})\n"
        "mod = importlib.util.module_from_spec(spec); sys.modules['ref'] = mod\n"
        "spec.loader.exec_module(mod)\n"
        "mod.scaled_dot_product([[1.0]], [[1.0]], [[1.0]])\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    assert importlib.util.find_spec("numpy") is not None
    subprocess.run([sys.executable, "-c", code], check=True)
