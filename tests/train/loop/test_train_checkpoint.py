"""Checkpoints: weights and optimiser state round-trip bit for bit (safetensors + JSON, no
pickle), keep-last-N, clear errors naming the file for corrupted / foreign / other-config
checkpoints, nothing on disk overwritten by a run that fails to start, and a process killed by
SIGKILL in the middle of a save leaves the previous checkpoint loadable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnkit.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnkit.train.checkpoint import CheckpointError, list_checkpoints, resolve
from attnkit.train.config import TrainConfig
from attnkit.train.data.sources import DataError
from attnkit.train.inference import session
from attnkit.train.loop.state import load_optimizer_state, optimizer_state
from attnkit.train.loop.trainer import train


def quiet(_: str) -> None:
    pass


def s2s(seed: int) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    cfg = Seq2SeqConfig(
        11,
        11,
        d_model=8,
        nhead=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dim_feedforward=16,
        tie_embeddings="all",
    )
    return Seq2SeqTransformer(cfg)


def test_weights_round_trip_keeps_ties(tmp_path):
    a, b = s2s(0), s2s(1)
    (tmp_path / "m.safetensors").write_bytes(session.weights_bytes(a))
    session.load_weights(b, tmp_path / "m.safetensors")
    for (n, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), n
    assert b.generator.weight is b.src_embed.weight is b.tgt_embed.weight
    other = Seq2SeqTransformer(Seq2SeqConfig(11, 11, d_model=16, nhead=2))
    with pytest.raises(CheckpointError, match=r"m.safetensors: weights do not fit this model"):
        session.load_weights(other, tmp_path / "m.safetensors")


def test_optimizer_state_round_trip_is_bit_exact():
    def step(model, opt, seed):
        torch.manual_seed(seed)
        model(torch.randint(3, 11, (2, 4)), torch.randint(3, 11, (2, 3))).square().mean().backward()
        opt.step()
        opt.zero_grad()

    a = s2s(0)
    opt_a = torch.optim.AdamW(a.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-9)
    for s in range(2):
        step(a, opt_a, s)
    tensors, meta = optimizer_state(opt_a)
    meta = json.loads(json.dumps(meta))  # through JSON, as on disk
    b = s2s(1)
    b.load_state_dict(a.state_dict())
    opt_b = torch.optim.AdamW(b.parameters(), lr=0.5)
    load_optimizer_state(opt_b, tensors, meta)
    step(a, opt_a, 7)
    step(b, opt_b, 7)
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)


def test_run_directory_keeps_last_n(tmp_path, tiny):
    train(TrainConfig(max_steps=12, keep=2, **tiny), tmp_path / "run", echo=quiet)
    names = [p.name for p in list_checkpoints(tmp_path / "run")]
    assert names == ["step-00000008", "step-00000012"]
    ck = tmp_path / "run" / "step-00000012"
    for f in (
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "state.safetensors",
        "state.json",
        "heldout.jsonl",
        "manifest.json",
    ):
        assert (ck / f).is_file()
    loaded = session.load(tmp_path / "run")
    assert loaded.path == ck and loaded.step == 12 and not loaded.model.training
    assert len(loaded.jsonl("heldout.jsonl")) == tiny["valid_size"]
    assert not any(p.name.endswith(".pt") or p.name.endswith(".pkl") for p in ck.iterdir())


@pytest.fixture
def ckpt(tmp_path, tiny) -> Path:
    return train(TrainConfig(max_steps=4, **tiny), tmp_path / "run", echo=quiet)


def test_corrupted_checkpoint_names_the_file(ckpt):
    f = ckpt / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: corrupted checkpoint"):
        session.load(ckpt)


def test_truncated_manifest(ckpt):
    (ckpt / "manifest.json").write_text('{"format": ')
    with pytest.raises(CheckpointError, match=r"manifest\.json: corrupted checkpoint file"):
        session.load(ckpt)


def test_not_a_checkpoint(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"empty: not an attnkit checkpoint"):
        session.load(tmp_path / "empty")
    (tmp_path / "file.bin").write_bytes(b"\x00" * 10)
    with pytest.raises(CheckpointError, match=r"file\.bin: not a checkpoint"):
        session.load(tmp_path / "file.bin")
    with pytest.raises(CheckpointError, match=r"nothing: no such checkpoint"):
        session.load(tmp_path / "nothing")


def test_resume_with_another_configuration_names_config_json(tmp_path, ckpt, tiny):
    tiny["d_model"] = 32
    with pytest.raises(
        CheckpointError, match=r"config\.json: .*another configuration.*d_model: 16 != 32"
    ):
        train(TrainConfig(max_steps=8, **tiny), tmp_path / "new", resume=ckpt, echo=quiet)
    assert not (tmp_path / "new").exists()


def test_failed_start_overwrites_nothing(tmp_path, tiny, ckpt):
    run = ckpt.parent
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    with pytest.raises(ValueError, match=r"already exists and is not empty"):
        train(TrainConfig(max_steps=4, **tiny), run, echo=quiet)
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\nno tab here\n")
    with pytest.raises(DataError, match=r"bad\.tsv:2:"):
        train(TrainConfig(task="translate", data=str(bad), max_steps=2), tmp_path / "o", echo=quiet)
    assert not (tmp_path / "o").exists()
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before


CHILD = """
import sys
from attnkit.train.config import TrainConfig
from attnkit.train.loop.trainer import train
cfg = TrainConfig(task="copy", train_size=200, valid_size=8, vocab=5, length=4, d_model=64,
                  nhead=2, layers=2, dim_feedforward=256, batch_size=8, max_steps=100000,
                  save_every=1, eval_every=100000, log_every=1, keep=2)
train(cfg, sys.argv[1], echo=lambda s: None)
"""


def test_sigkill_during_save_leaves_previous_checkpoint_loadable(tmp_path):
    """Kill a real training process while a save is in progress (a .tmp- directory exists);
    retry a few times until a kill lands mid-save."""
    mid_save = False
    for attempt in range(6):
        run = tmp_path / f"run{attempt}"
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(run)])
        try:
            deadline = time.monotonic() + 120
            while len(list_checkpoints(run)) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            while time.monotonic() < deadline and proc.poll() is None:
                if any(run.glob(".tmp-*")):
                    proc.send_signal(signal.SIGKILL)
                    break
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        mid_save = any(run.glob(".tmp-*"))
        loaded = session.load(run)  # the latest complete checkpoint
        assert loaded.step >= 1
        if mid_save:
            break
    assert mid_save, "no kill landed during a save in 6 attempts"
    # the run resumes from what was left
    cfg = resolve(run).train_config
    cfg.max_steps = loaded.step + 2
    last = train(cfg, run, resume=run, echo=quiet)
    assert last.name == f"step-{loaded.step + 2:08d}"
    assert not any(run.glob(".tmp-*"))
    assert os.path.isdir(last)


def test_resume_refuses_changed_data(tmp_path, tiny, rhyme_file):
    tiny.update(task="lm", data=str(rhyme_file), block_size=8, valid_fraction=0.25)
    ck = train(TrainConfig(max_steps=2, **tiny), tmp_path / "run", echo=quiet)
    rhyme_file.write_text(rhyme_file.read_text() + "one more line\n")
    with pytest.raises(DataError, match=r"rhyme\.txt: the file differs from the one"):
        train(TrainConfig(max_steps=4, **tiny), tmp_path / "run", resume=ck, echo=quiet)
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step-00000002"]
