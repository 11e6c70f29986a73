"""``--positions learned`` (issue 21): recorded in the checkpoint with a table of the training
window, echoed in the recipe line, trained as a stream, packed and lines; --resume is
bit-identical; generation past the window crops the context (nanoGPT), also for a
local-attention model; the option is refused for the encoder-decoder tasks."""

from __future__ import annotations

import json

import pytest
import torch

from attnkit.models.lm import LMConfig, TransformerLM
from attnkit.train.config import TrainConfig
from attnkit.train.inference import session
from attnkit.train.inference.lm_generate import generate_ids
from attnkit.train.loop.trainer import train
from tests.support.train_log import resumed_logs


def lm_config(tiny: dict, rhyme_file, **kw) -> dict:
    tiny.update(task="lm", data=str(rhyme_file), block_size=8, valid_fraction=0.25)
    tiny.update(positions="learned", **kw)
    return tiny


@pytest.mark.parametrize("mode", [dict(), dict(pack=True), dict(lines=True)])
def test_trains_and_records_the_table(tmp_path, tiny, rhyme_file, mode):
    lines: list[str] = []
    cfg = TrainConfig(max_steps=4, **lm_config(tiny, rhyme_file, **mode))
    ckpt = train(cfg, tmp_path / "run", echo=lines.append)
    saved = json.loads((ckpt / "config.json").read_text())
    assert saved["model"]["positions"] == saved["train"]["positions"] == "learned"
    assert saved["model"]["max_len"] == 8  # the training window, as nanoGPT's wpe
    assert any(s.startswith("recipe:") and "learned positions" in s for s in lines)
    loaded = session.load(ckpt)
    assert loaded.model.positional.weight.shape == (8, 16)
    assert loaded.model.config.positions == "learned"


def test_resume_is_bit_identical(tmp_path, tiny, rhyme_file):
    full, resumed = resumed_logs(lm_config(tiny, rhyme_file), tmp_path)
    assert full and resumed == full


def test_resume_with_other_positions_is_refused(tmp_path, tiny, rhyme_file):
    cfg = lm_config(tiny, rhyme_file)
    train(TrainConfig(max_steps=2, **cfg), tmp_path / "a", echo=lambda _: None)
    other = TrainConfig(max_steps=4, **{**cfg, "positions": "sinusoidal"})
    with pytest.raises(Exception, match=r"positions: 'learned' != 'sinusoidal'"):
        train(other, tmp_path / "a", resume=tmp_path / "a", echo=lambda _: None)


@pytest.mark.parametrize("window", [None, 2])
def test_generation_past_the_window_crops_the_context(window):
    torch.manual_seed(1)
    block = 6
    model = TransformerLM(
        LMConfig(20, d_model=16, nhead=2, num_layers=2, dim_feedforward=32, dropout=0.0,
                 window=window, positions="learned", max_len=block)
    ).eval()  # fmt: skip
    prompt = [5, 9, 4, 7]
    got = list(generate_ids(model, prompt, 12, block, banned=model.banned_ids()))
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(12):  # reference: the last `block` ids from position 0, every token
            logits = model(torch.tensor([ids[-block:]]))[0, -1]
            logits[list(model.banned_ids())] = float("-inf")
            ids.append(int(logits.argmax()))
    assert got == ids[len(prompt) :]


def test_positions_are_for_the_lm_task():
    with pytest.raises(ValueError, match="positions: learned positions are for the lm task"):
        TrainConfig(task="copy", max_steps=1, positions="learned").resolved()
    with pytest.raises(ValueError, match="positions: expected one of"):
        TrainConfig(task="copy", max_steps=1, positions="rope").resolved()
