"""The one token cross-entropy (``attnkit.train.loss``) against a float64 NumPy reference; its
chunked form against the full one; activation checkpointing of the LM against the plain model;
the default packed row length; the packed held-out loss of lm against per-document losses.

Tolerances: float64 1e-10 relative; float32 1e-5 (losses) and 1e-6 (checkpointed vs plain, the
same float32 operations recomputed).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnkit.models.lm import LMConfig, TransformerLM
from attnkit.train.config import TrainConfig
from attnkit.train.data.packing import default_row_length
from attnkit.train.data.tasks import prepare
from attnkit.train.data.tokenizer import PAD
from attnkit.train.inference.metrics import heldout_loss, perplexity
from attnkit.train.loop.steps import LMHeadLoss, heldout_examples
from attnkit.train.loop.trainer import train
from attnkit.train.loss import chunked_head_loss, token_cross_entropy
from tests.support.train_log import logged, resumed_logs


def reference_ce(logits: np.ndarray, y: np.ndarray, smoothing: float, pad: int) -> np.ndarray:
    """Per-token label-smoothed cross-entropy in float64 (0 where y == pad)."""
    z = logits.astype(np.float64)
    logp = z - z.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    v = z.shape[-1]
    nll = -np.take_along_axis(logp, np.where(y == pad, 0, y)[..., None], -1)[..., 0]
    loss = (1 - smoothing) * nll - smoothing / v * logp.sum(-1)
    return np.where(y == pad, 0.0, loss)


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 97)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("pad", [PAD, 5])  # the caller's padding id, not a fixed one
def test_token_cross_entropy_matches_reference(shape, smoothing, pad):
    g = torch.Generator().manual_seed(sum(shape))
    logits = torch.randn(*shape, 13, dtype=torch.float64, generator=g) * 5
    y = torch.randint(0, 13, shape, generator=g)
    y[0, -1] = pad  # a padded target counts nowhere
    want = reference_ce(logits.numpy(), y.numpy(), smoothing, pad)
    n = int((y != pad).sum())
    kw = dict(pad_id=pad, label_smoothing=smoothing)
    none, count = token_cross_entropy(logits, y, reduction="none", **kw)
    total, _ = token_cross_entropy(logits, y, **kw)
    mean, _ = token_cross_entropy(logits, y, reduction="mean", **kw)
    assert count == n
    np.testing.assert_allclose(none.numpy(), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(float(total), want.sum(), rtol=1e-10)
    np.testing.assert_allclose(float(mean), want.sum() / max(n, 1), rtol=1e-10)
    f32, _ = token_cross_entropy(logits.float(), y, **kw)
    up, _ = token_cross_entropy(logits.float(), y, dtype=torch.float64, **kw)
    assert up.dtype == torch.float64
    np.testing.assert_allclose(float(f32), want.sum(), rtol=1e-5)
    head = torch.nn.Identity()
    chunked, chunked_n = chunked_head_loss(logits, y, head, chunk=2, **kw)
    assert chunked_n == n
    np.testing.assert_allclose(float(chunked), want.sum(), rtol=1e-10)


def test_token_cross_entropy_bad_input():
    x, y = torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="^reduction: expected one of"):
        token_cross_entropy(x, y, pad_id=PAD, reduction="avg")
    with pytest.raises(ValueError, match=r"^targets: expected the shape \(2, 3\)"):
        token_cross_entropy(x, y[:, :2], pad_id=PAD)
    with pytest.raises(ValueError, match="^label_smoothing: "):
        token_cross_entropy(x, y, pad_id=PAD, label_smoothing=1.5)
    with pytest.raises(ValueError, match="^chunk: expected a positive int, got 0"):
        chunked_head_loss(x, y, torch.nn.Identity(), pad_id=PAD, chunk=0)
    with pytest.raises(ValueError, match="^pad_id: "):
        token_cross_entropy(x, y, pad_id=-1)
    with pytest.raises(TypeError, match="pad_id"):  # required: no padding id is assumed
        token_cross_entropy(x, y)  # type: ignore[call-arg]


@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_chunked_head_loss_equals_full_loss_and_gradients(chunk):
    g = torch.Generator().manual_seed(chunk)
    head = torch.nn.Linear(8, 11)
    h = torch.randn(2, 17, 8, generator=g, requires_grad=True)
    y = torch.randint(0, 11, (2, 17), generator=g)
    y[:, -5:] = PAD
    full, n_full = token_cross_entropy(head(h), y, pad_id=PAD, label_smoothing=0.1)
    grads_full = torch.autograd.grad(full, [h, head.weight])
    part, n = chunked_head_loss(h, y, head, pad_id=PAD, label_smoothing=0.1, chunk=chunk)
    grads = torch.autograd.grad(part, [h, head.weight])
    assert n == n_full
    torch.testing.assert_close(part, full, rtol=1e-6, atol=0)
    for a, b in zip(grads, grads_full, strict=True):  # float32 sums in another order
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * float(b.abs().max()))


def _lm(window=None, norm_first=True) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(
        LMConfig(
            23, d_model=16, nhead=2, num_layers=2, dim_feedforward=32, dropout=0.1,
            window=window, attention_dropout=0.0, norm_first=norm_first,
        )
    )  # fmt: skip


@pytest.mark.parametrize(("window", "norm_first"), [(None, True), (5, True), (None, False)])
def test_checkpointed_lm_equals_plain_lm_with_dropout(window, norm_first):
    """Checkpointed layers: the same loss and gradients (1e-6; the same float32 operations
    recomputed), dropout drawing the same masks. Layers and the chunked loss: loss 1e-6,
    gradients 1e-5 (the generator's weight gradient is summed chunk by chunk, another order)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(3, 23, (2, 97), generator=g)
    y = torch.randint(3, 23, (2, 97), generator=g)
    y[1, 90:] = PAD
    out = {}
    for how in ("plain", "layers", "layers+chunked"):
        model = _lm(window, norm_first)
        model.train()
        model.checkpoint_layers = how != "plain"
        torch.manual_seed(7)
        if how == "layers+chunked":
            loss = LMHeadLoss(model, 0.1, chunk=10)(x, y)
        else:
            loss = token_cross_entropy(model(x), y, pad_id=PAD, label_smoothing=0.1)[0]
        loss.backward()
        # the global generator is where an uninterrupted run leaves it (same dropout draws)
        out[how] = (loss.detach(), [p.grad.clone() for p in model.parameters()], torch.rand(3))
    l0, g0, r0 = out["plain"]
    for how, rtol in (("layers", 1e-6), ("layers+chunked", 1e-5)):
        loss, grads, r = out[how]
        assert torch.equal(r, r0)
        torch.testing.assert_close(loss, l0, rtol=1e-6, atol=0)
        for a, b in zip(grads, g0, strict=True):
            torch.testing.assert_close(a, b, rtol=rtol, atol=rtol * float(b.abs().max()))


def test_default_row_length_rule(tmp_path):
    # twice the longest side, rounded up to a multiple of 32
    assert default_row_length([1]) == 32
    assert default_row_length([16, 3]) == 32
    assert default_row_length([17]) == 64
    assert default_row_length([(8, 16), (40, 2)]) == 96
    assert default_row_length([1025]) == 2080
    with pytest.raises(ValueError, match="^sizes: "):
        default_row_length([])
    tsv = tmp_path / "p.tsv"
    g = np.random.default_rng(0)
    words = ["a", "b", "c", "d", "e"]
    lines = [f"{' '.join(g.choice(words, int(g.integers(1, 30))))} {i}\tx y {i}" for i in range(97)]
    tsv.write_text("\n".join(lines) + "\n", encoding="utf-8")
    c = TrainConfig(
        task="translate", data=str(tsv), pack=True, tokenizer="word", valid_fraction=0.1
    )
    data = prepare(c.resolved())
    longest = max(max(len(s), len(t) - 1) for s, t in data.examples)
    assert data.pack.max_len == -(-2 * longest // 32) * 32
    c.max_len = 200  # --max-len overrides the rule
    assert prepare(c.resolved()).pack.max_len == 200


def test_packed_heldout_loss_is_the_per_document_loss(rhyme_file):
    c = TrainConfig(task="lm", data=str(rhyme_file), pack=True, max_len=6, valid_fraction=0.5)
    c = c.resolved()
    data = prepare(c)
    model = TransformerLM(
        LMConfig(
            data.tokenizer.get_vocab_size(),
            d_model=16,
            nhead=2,
            num_layers=2,
            dim_feedforward=32,
            dropout=0.0,
            attention_dropout=0.0,
        )
    ).eval()
    held = heldout_examples(data, c)
    assert len(held) > len(data.heldout)  # lines longer than a row are cut, as in training
    got = heldout_loss(model, "lm", held, batch_size=3, pack=data.pack)
    total, count = 0.0, 0
    with torch.no_grad():
        for (seq,) in held:  # each document alone, positions from 0, no other document
            ids = torch.tensor([seq])
            logits = model(ids[:, :-1]).double()
            lp = torch.log_softmax(logits, -1)[0]
            total -= float(lp[torch.arange(len(seq) - 1), ids[0, 1:]].sum())
            count += len(seq) - 1
    assert got == pytest.approx(total / count, rel=1e-5)
    # `attnkit evaluate` scores a packed model the same way
    ppl = perplexity(model, data.tokenizer, data.heldout, c.max_len, packed=True)
    assert ppl == pytest.approx(np.exp(total / count), rel=1e-5)


def test_checkpointed_training_resumes_bit_identically(tmp_path, tiny, rhyme_file):
    with pytest.raises(ValueError, match="^checkpoint: activation checkpointing is for the lm"):
        TrainConfig(task="reverse", checkpoint=True).resolved()
    tiny.update(task="lm", data=str(rhyme_file), block_size=8, valid_fraction=0.25, keep=10)
    tiny.update(checkpoint=True)
    quiet = lambda _: None  # noqa: E731
    want, got = resumed_logs(tiny, tmp_path)
    assert len(want) >= 8 and got == want
    tiny["checkpoint"] = False  # the plain run logs the same losses (float32, 1e-6)
    plain = train(TrainConfig(max_steps=8, **tiny), tmp_path / "plain", echo=quiet)
    base = logged(plain.parent / "log.jsonl", ("loss", "val_loss"))
    assert base.keys() == want.keys()
    assert all(want[k] == pytest.approx(v, rel=1e-6) for k, v in base.items())


def test_host_target_count_equals_the_non_pad_targets_of_a_batch():
    """The step's token count comes from the host (nothing read back from a GPU); it must be
    the count of non-PAD targets that the loss sums over, PAD ids inside a sequence included."""
    from attnkit.train.data.batches import batch_logits, target_count
    from attnkit.train.data.tokenizer import PAD

    class Echo(torch.nn.Module):  # logits are irrelevant: only the targets are read
        def forward(self, *xs):
            return torch.zeros(*xs[-1].shape, 7)

    lm = [([5, 6, PAD, 7],), ([4, 5],), ([3, 4, 5, 6, 6],)]
    pairs = [([5, 6], [1, 5, 6, 2]), ([4], [1, PAD, 4, 2]), ([3, 3, 3], [1, 2])]
    for kind, batch in (("lm", lm), ("seq2seq", pairs)):
        _, y = batch_logits(Echo(), kind, batch)
        assert target_count(kind, batch) == int((y != PAD).sum()), kind
