"""The verbs that use a trained model (``translate``, ``generate``, ``evaluate``) load
:mod:`attnkit.train.inference` and what it stands on (the data, config and checkpoint modules),
never the training loop (:mod:`attnkit.train.loop`: the optimiser, the trainer, torchrun's
process groups). Each verb runs to the end on a tiny trained run in a fresh interpreter, which
then lists the ``attnkit.train`` modules it loaded (one interpreter for all of them: what
none of them loads, their union does not hold either)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnkit import cli
from tests.support.tiny_runs import train_lm, train_translate

SRC = Path(cli.__file__).resolve().parents[2]

_PROBE = """
import contextlib, io, json, sys
from attnkit.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    codes = [main(argv) for argv in {argvs!r}]
print(json.dumps({{"codes": codes, "loaded": sorted(m for m in sys.modules
                                                    if m.startswith("attnkit.train"))}}))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {"lm": train_lm(root / "lm"), "tr": train_translate(root / "tr")}


VERBS = [
    ["translate", "--ckpt", "{tr}", "the cat sat."],
    ["translate", "--ckpt", "{tr}", "--beam", "2", "the dog ran."],
    ["generate", "--ckpt", "{lm}", "--prompt", "the cat", "--max-new-tokens", "3"],
    ["evaluate", "--ckpt", "{tr}"],
    ["evaluate", "--ckpt", "{lm}"],
]


def test_inference_verbs_never_load_the_training_loop(runs):
    argvs = [[a.format(**{k: str(v) for k, v in runs.items()}) for a in verb] for verb in VERBS]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    r = subprocess.run(
        [sys.executable, "-c", _PROBE.format(argvs=argvs)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["codes"] == [0] * len(VERBS)
    assert "attnkit.train.inference.session" in out["loaded"]  # the checkpoints were read
    assert [m for m in out["loaded"] if m.startswith("attnkit.train.loop")] == []
