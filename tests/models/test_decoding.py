"""models.decoding: greedy and beam search over the Stepper protocol, checked against decoding
by full (uncached) forwards, for the decoder-only LM and the encoder-decoder; sampling limits;
bad arguments."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from attnkit.models import decoding
from attnkit.models.lm import LMConfig, TransformerLM
from attnkit.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

PAD, BOS, EOS = 0, 1, 2


def lm_model(vocab=6, seed=0) -> TransformerLM:
    torch.manual_seed(seed)
    cfg = LMConfig(
        vocab_size=vocab, d_model=8, nhead=2, num_layers=2, dim_feedforward=16, dropout=0.0
    )
    return TransformerLM(cfg).double().eval()


def s2s_model(vocab=6, seed=0) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    cfg = Seq2SeqConfig(
        src_vocab_size=9,
        tgt_vocab_size=vocab,
        d_model=8,
        nhead=2,
        num_encoder_layers=1,
        num_decoder_layers=2,
        dim_feedforward=16,
        dropout=0.0,
        max_len=16,
    )
    return Seq2SeqTransformer(cfg).double().eval()


@torch.no_grad()
def full_logprobs(model, context, seq: list[int]) -> torch.Tensor:
    """log-probabilities of the next token after ``seq`` by a full forward (no cache), with
    pad and bos banned; context = the prompt (lm) or the source (seq2seq)."""
    if isinstance(model, TransformerLM):
        logits = model(torch.tensor([context + seq]))[0, -1]
    else:
        logits = model(torch.tensor([context]), torch.tensor([[BOS] + seq]))[0, -1]
    logits = logits.clone()
    logits[[PAD, BOS]] = -math.inf
    return torch.log_softmax(logits, -1)


def naive_greedy(model, context, steps):
    seq = []
    for _ in range(steps):
        seq.append(int(full_logprobs(model, context, seq).argmax()))
        if seq[-1] == EOS:
            break
    return seq


def all_hypotheses(model, context, max_len, vocab):
    """Every hypothesis (ended by eos or max_len) with its exact sum of log-probabilities."""
    memo: dict[tuple, torch.Tensor] = {}

    def logp(prefix: list[int]) -> torch.Tensor:
        key = tuple(prefix)
        if key not in memo:
            memo[key] = full_logprobs(model, context, prefix)
        return memo[key]

    out = []
    for n in range(1, max_len + 1):
        for body in itertools.product(range(3, vocab), repeat=n - 1):
            for last in range(2, vocab):
                seq = list(body) + [last]
                if n < max_len and last != EOS:
                    continue
                score = sum(float(logp(seq[:i])[seq[i]]) for i in range(n))
                out.append((score, seq))
    return out


CASES = [
    ("lm", lambda: lm_model(), [3, 4, 5]),
    ("seq2seq", lambda: s2s_model(), [3, 7, 8, 4]),
]


def stepper_for(model, context, rows):
    if isinstance(model, TransformerLM):
        return model.stepper(rows), torch.tensor([context])
    return model.stepper(torch.tensor([context]), repeat=rows), torch.tensor([[BOS]])


@pytest.mark.parametrize("name, make, context", CASES, ids=[c[0] for c in CASES])
def test_greedy_equals_full_forward_greedy(name, make, context):
    model = make()
    stepper, prefix = stepper_for(model, context, 1)
    got = decoding.greedy_search(stepper, prefix, 7, eos_id=EOS, pad_id=PAD, banned=(PAD, BOS))
    want = naive_greedy(model, context, 7)
    assert got[0].tolist() == want


@pytest.mark.parametrize("name, make, context", CASES, ids=[c[0] for c in CASES])
def test_wide_beam_is_exhaustive(name, make, context):
    """Vocabulary 6 (3 real tokens + eos), max 3 tokens: 3*3*4 + 3*1 + 1 = 43 hypotheses; a
    beam of 64 must return all of them with their exact scores, best first."""
    model, max_len = make(), 3
    stepper, prefix = stepper_for(model, context, 64)
    toks, scores = decoding.beam_search(
        stepper, prefix, 64, max_len, eos_id=EOS, pad_id=PAD, banned=(PAD, BOS), return_all=True
    )
    ref = sorted(all_hypotheses(model, context, max_len, 6), key=lambda x: -x[0])
    n = len(ref)
    assert torch.isfinite(scores[0, :n]).all() and torch.isinf(scores[0, n:]).all()
    torch.testing.assert_close(
        scores[0, :n],
        torch.tensor([s for s, _ in ref], dtype=torch.float64),
        rtol=1e-10,
        atol=1e-10,
    )
    got = {tuple(t for t in row.tolist() if t != PAD) for row in toks[0, :n]}
    assert got == {tuple(seq) for _, seq in ref}


def test_beam_length_penalty_picks_best_normalised():
    model, context = lm_model(), [3, 4]
    stepper, prefix = stepper_for(model, context, 64)
    toks, score = decoding.beam_search(
        stepper, prefix, 64, 3, eos_id=EOS, pad_id=PAD, banned=(PAD, BOS), length_penalty=1.0
    )
    ref = max((s / len(seq), seq) for s, seq in all_hypotheses(model, context, 3, 6))
    assert math.isclose(float(score[0]), ref[0], rel_tol=1e-10)
    assert [t for t in toks[0].tolist() if t != PAD] == ref[1]


def test_model_wrappers_use_the_same_functions():
    lm = lm_model()
    prompt = torch.tensor([[3, 4, 5], [5, 5, 3]])
    want = [naive_greedy(lm, p, 5) for p in prompt.tolist()]
    got = lm.generate(prompt, 5)
    for row, w in zip(got.tolist(), want):
        assert row[: len(w)] == w and all(t == PAD for t in row[len(w) :])
    toks, _ = lm.beam_search(prompt, beam_size=1, max_new_tokens=5)
    assert torch.equal(toks, got)


def test_sampling_top_k_and_reproducible():
    lm = lm_model(vocab=12)
    prompt = torch.tensor([[3, 4]])
    # top_k=1 is greedy whatever the temperature
    g = torch.Generator().manual_seed(0)
    assert torch.equal(
        lm.generate(prompt, 6, temperature=5.0, top_k=1, generator=g), lm.generate(prompt, 6)
    )
    # same seed, same sample; samples stay among the top 2 of the full forward's distribution
    runs = [
        lm.generate(prompt, 8, temperature=2.0, top_k=2, generator=torch.Generator().manual_seed(s))
        for s in (1, 1, 2)
    ]
    assert torch.equal(runs[0], runs[1])
    seq = []
    for t in runs[2][0].tolist():
        if t == PAD:
            break
        top2 = full_logprobs(lm, [3, 4], seq).topk(2).indices.tolist()
        assert t in top2
        seq.append(t)


def test_stepper_protocol_with_a_fake_model():
    """A stepper whose logits favour (last token + 1) mod V: greedy counts up, banned ids are
    skipped, rows end at eos and are padded afterwards."""

    class Counter:
        def __init__(self):
            self.calls = 0

        def step(self, tokens):
            self.calls += 1
            nxt = (tokens[:, -1:] + 1) % 7
            return torch.nn.functional.one_hot(nxt, 7).double() * 10

        def reorder(self, index):
            pass

    out = decoding.greedy_search(
        Counter(), torch.tensor([[3], [5]]), 6, eos_id=EOS, pad_id=PAD, banned=(PAD, BOS)
    )
    # from 5: 6, then 0 is banned -> argmax among the rest (all equal) picks the first allowed
    assert out[0].tolist()[:3] == [4, 5, 6]
    assert out[1, 0].item() == 6
    assert EOS in out[1].tolist()
    after = out[1].tolist()[out[1].tolist().index(EOS) + 1 :]
    assert all(t == PAD for t in after)


@pytest.mark.parametrize(
    "kw, exc, match",
    [
        (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
        (dict(temperature=-1.0), ValueError, "temperature"),
        (dict(temperature=float("nan")), ValueError, "temperature"),
        (dict(temperature="hot"), TypeError, "temperature"),
        (dict(top_k=0), ValueError, "top_k"),
    ],
)
def test_bad_arguments(kw, exc, match):
    lm = lm_model()
    args = dict(max_new_tokens=3, eos_id=EOS, pad_id=PAD)
    args.update(kw)
    with pytest.raises(exc, match=match):
        decoding.greedy_search(lm.stepper(1), torch.tensor([[3]]), **args)
    with pytest.raises(ValueError, match="prefix"):
        decoding.greedy_search(lm.stepper(1), torch.tensor([3]), 3, eos_id=EOS, pad_id=PAD)
    with pytest.raises(ValueError, match="beam_size"):
        decoding.beam_search(lm.stepper(1), torch.tensor([[3]]), 0, 3, eos_id=EOS, pad_id=PAD)
