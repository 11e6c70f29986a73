"""Schedules against their formulas (nanoGPT's get_lr written out here; Vaswani et al.'s),
AdamW parameter groups (weight decay on matrices only, as nanoGPT's configure_optimizers), and
the recipe flags: validated, recorded in the checkpoint, reaching the model."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from attnkit.models.lm import LMConfig, TransformerLM
from attnkit.train.config import TrainConfig
from attnkit.train.inference.session import load
from attnkit.train.loop.optim import build_optimizer, decay_groups, schedule_of
from attnkit.train.loop.schedule import Schedule
from attnkit.train.loop.trainer import train


def nanogpt_lr(it, lr=1e-3, min_lr=1e-4, warmup=100, decay=2000):
    """karpathy/nanoGPT train.py get_lr, verbatim in substance."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay:
        return min_lr
    ratio = (it - warmup) / (decay - warmup)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (lr - min_lr)


def test_cosine_is_nanogpts_get_lr():
    s = Schedule("cosine", 100, lr=1e-3, min_lr=1e-4, total=2000)
    for step in (1, 2, 50, 100, 101, 102, 1000, 1999, 2000, 2001, 2002, 5000):
        assert s(step) == pytest.approx(nanogpt_lr(step - 1), rel=1e-12, abs=1e-15)
    assert s(101) == pytest.approx(1e-3) and s(2001) == pytest.approx(1e-4)


def test_constant_and_noam():
    c = Schedule("constant", 10, lr=3e-4)
    want = [3e-4 / 11, 3e-4 * 10 / 11, 3e-4, 3e-4]
    assert [c(k) for k in (1, 10, 11, 500)] == pytest.approx(want)
    n = Schedule("noam", 400, d_model=128, factor=2.0)
    for step in (1, 399, 400, 401, 10_000):
        want = 2.0 * 128**-0.5 * min(step**-0.5, step * 400**-1.5)
        assert n(step) == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="^kind: "):
        Schedule("linear", 10)


def tiny_lm(**kw) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(LMConfig(30, d_model=8, nhead=2, num_layers=1, dim_feedforward=16, **kw))


@pytest.mark.parametrize("tie", [True, False])
def test_weight_decay_on_matrices_only(tie):
    model = tiny_lm(tie_embeddings=tie)
    decay, rest = decay_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in rest["params"])
    assert decay["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0
    got = [id(p) for g in (decay, rest) for p in g["params"]]
    assert sorted(got) == sorted(names) and len(got) == len(set(got))  # each parameter once
    assert any("embed" in names[id(p)] for p in decay["params"])
    assert any("norm" in names[id(p)] for p in rest["params"])
    assert any(names[id(p)].endswith("bias") for p in rest["params"])
    # behaviour: one AdamW step with zero gradients only shrinks the matrices, by lr * wd
    c = TrainConfig(task="lm", data="x", weight_decay=0.1, schedule="constant", lr=0.5,
                    max_steps=1)  # fmt: skip
    c = dataclasses.replace(c, lines=True, valid_fraction=0.1, betas=(0.9, 0.99))
    opt = build_optimizer(model, c)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for g in opt.param_groups:
        g["lr"] = 0.5
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        factor = 1 - 0.5 * 0.1 if p.dim() >= 2 else 1.0
        torch.testing.assert_close(p.detach(), before[n] * factor, rtol=1e-6, atol=1e-7)
    assert opt.defaults["betas"] == (0.9, 0.99)


def test_recipe_validation(tmp_path):
    base = dict(task="lm", data=str(tmp_path / "a.txt"))
    cases = [
        (dict(schedule="noam", lr=1e-3), "^lr: the noam schedule sets its own peak"),
        (dict(schedule="cosine", max_minutes=5), "^schedule: cosine decays over --max-steps"),
        (dict(schedule="constant", lr=1e-3, min_lr=2e-3), r"^min_lr: expected a number in \[0"),
        (dict(schedule="cosine", lr=-1.0, max_steps=5), "^lr: "),
        (dict(betas=(0.9, 1.0)), r"^betas: expected two numbers in \[0, 1\)"),
        (dict(betas=(0.9,)), r"^betas: expected two numbers"),
        (dict(activation="tanh"), "^activation: "),
        (dict(schedule="step"), "^schedule: "),
        (dict(task="copy", data=None, bias=False), "^bias: --no-bias is for the lm task"),
        (dict(task="copy", data=None, lines=False), "^lines: stream training is for the lm"),
    ]
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            TrainConfig(**{**base, **kw}).resolved()


def test_flags_reach_the_model_and_the_checkpoint(tmp_path, rhyme_file):
    c = TrainConfig(task="lm", data=str(rhyme_file), tokenizer="char", block_size=16,
                    d_model=16, nhead=2, layers=1, dim_feedforward=32, batch_size=4,
                    max_steps=3, schedule="cosine", lr=2e-3, min_lr=1e-5, warmup=1,
                    betas=(0.8, 0.95), weight_decay=0.1, tie_embeddings=False,
                    norm_first=False, bias=False, activation="relu")  # fmt: skip
    loaded = load(train(c, tmp_path / "run", echo=lambda _: None))
    tc, m = loaded.train_config, loaded.model
    assert (tc.schedule, tc.lr, tc.min_lr, tuple(tc.betas)) == ("cosine", 2e-3, 1e-5, (0.8, 0.95))
    model_flags = (tc.tie_embeddings, tc.norm_first, tc.bias, tc.activation)
    assert model_flags == (False, False, False, "relu")
    assert m.generator.weight is not m.embed.weight and m.generator.bias is None
    assert m.norm is None and m.layers[0].linear1.bias is None
    assert schedule_of(tc.resolved())(3) == pytest.approx(
        Schedule("cosine", 1, lr=2e-3, min_lr=1e-5, total=3)(3)
    )


def test_cosine_and_constant_may_start_without_warm_up():
    # was refused ("--warmup: expected a positive int, got 0") although the schedule, like
    # nanoGPT's get_lr with warmup_iters = 0, starts at the peak
    c = TrainConfig(task="lm", data="FILE", warmup=0, lr=1e-3, min_lr=1e-4, max_steps=300)
    s = schedule_of(c.resolved())
    for step in (1, 2, 150, 300, 301, 302):
        assert s(step) == pytest.approx(nanogpt_lr(step - 1, warmup=0, decay=300), rel=1e-12)
    constant = TrainConfig(task="copy", schedule="constant", lr=3e-4, warmup=0, max_steps=5)
    assert [schedule_of(constant.resolved())(k) for k in (1, 5)] == [3e-4, 3e-4]
    with pytest.raises(ValueError, match="^warmup: expected a positive int, got 0"):
        TrainConfig(task="copy", warmup=0, max_steps=5).resolved()  # noam divides by it
    with pytest.raises(ValueError, match="^warmup: expected a non-negative int, got -1"):
        dataclasses.replace(c, warmup=-1).resolved()
