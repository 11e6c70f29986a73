"""Packed sequences (--pack).

A packed batch gives the same per-sequence losses and gradients as the same sequences run one
at a time (the unpacked models, themselves checked against torch.nn in tests/models); no
document sees another (perturbing one leaves the others' logits bit-identical); positions
restart; the masks reaching attention are structured document masks run by ``blocksparse``
(no dense L x L mask); the packing functions place every sequence once, within max_len,
deterministically; packed model inputs are checked before any work.

Windowed LMs: test_window.py; training and the CLI: test_packing_train.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attnkit.nn.attention_fn as attention_fn
from attnkit import functional
from attnkit.masks import Causal, Document, Intersection, Mask, SlidingWindow
from attnkit.models.lm import LMConfig, TransformerLM
from attnkit.models.packed import positions_from_docs
from attnkit.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnkit.train.data.packing import (
    epoch_packed_batches,
    pack_lm,
    pack_rows,
    pack_seq2seq,
    packed_loss,
    sequence_losses,
    split_long,
)
from attnkit.train.data.tokenizer import EOS, PAD
from tests.support.numerics import max_rel_err as rel_err

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
V = 23


def rand_ids(g: torch.Generator, n: int) -> list[int]:
    return torch.randint(4, V, (n,), generator=g).tolist()


def lm_seqs(lengths: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [rand_ids(g, n - 1) + [EOS] for n in lengths]


def pairs(lengths: list[tuple[int, int]], seed: int = 0) -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(seed)
    return [(rand_ids(g, s - 1) + [EOS], [1] + rand_ids(g, t - 2) + [EOS]) for s, t in lengths]


def make_lm(dtype=torch.float32, window=None, seed=0, **kw) -> TransformerLM:
    torch.manual_seed(seed)
    kw = dict(dict(dropout=0.0), **kw)
    cfg = LMConfig(V, d_model=16, nhead=2, num_layers=2, dim_feedforward=24, window=window, **kw)
    return TransformerLM(cfg).to(dtype).eval()


def make_s2s(dtype=torch.float32, seed=0, **kw) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    kw = dict(dict(dropout=0.0), **kw)
    cfg = Seq2SeqConfig(
        V,
        V,
        d_model=16,
        nhead=2,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dim_feedforward=24,
        tie_embeddings="all",
        norm_first=True,
        **kw,
    )
    return Seq2SeqTransformer(cfg).to(dtype).eval()


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def grad_err(got: dict, want: dict) -> float:
    """Largest difference over every parameter's gradient relative to the largest gradient
    entry (per tensor would divide rounding noise by noise: the key-projection bias has an
    exactly zero gradient, softmax being invariant to a constant added to a row)."""
    assert got.keys() == want.keys()
    names = sorted(want)
    return rel_err(
        torch.cat([got[n].flatten() for n in names]), torch.cat([want[n].flatten() for n in names])
    )


# ---------------------------------------------------------------------------------------------
# packed == one at a time (losses and gradients)
# ---------------------------------------------------------------------------------------------
LM_LENGTHS = [2, 9, 40, 3, 17, 150, 64, 5, 33, 1 + 1, 90, 12]  # ids per sequence (>= 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("window", [None, 5])
def test_lm_packed_equals_one_at_a_time(dtype, window):
    seqs = lm_seqs(LM_LENGTHS)
    model = make_lm(dtype, window)
    batch = pack_lm(seqs, 300)
    assert len(batch.rows) > 1  # several rows, several documents per row
    packed = sequence_losses(model, batch)
    packed.sum().backward()
    g_packed = grads(model)
    model.zero_grad()
    alone = []
    for s in seqs:  # reference: each sequence alone, no padding, the unpacked model
        logits = model(torch.tensor([s[:-1]]))
        alone.append(F.cross_entropy(logits[0], torch.tensor(s[1:]), reduction="sum"))
    alone = torch.stack(alone)
    alone.sum().backward()
    assert rel_err(packed, alone) <= TOL[dtype]
    assert grad_err(g_packed, grads(model)) <= TOL[dtype]


S2S_LENGTHS = [(3, 4), (20, 9), (7, 30), (2, 2), (60, 45), (11, 13), (1 + 1, 70), (33, 3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_seq2seq_packed_equals_one_at_a_time(dtype):
    examples = pairs(S2S_LENGTHS)
    model = make_s2s(dtype)
    batch = pack_seq2seq(examples, 160)
    assert len(batch.rows) > 1
    packed = sequence_losses(model, batch)
    packed.sum().backward()
    g_packed = grads(model)
    model.zero_grad()
    alone = []
    for s, t in examples:
        logits = model(torch.tensor([s]), torch.tensor([t[:-1]]))
        alone.append(F.cross_entropy(logits[0], torch.tensor(t[1:]), reduction="sum"))
    alone = torch.stack(alone)
    alone.sum().backward()
    assert rel_err(packed, alone) <= TOL[dtype]
    assert grad_err(g_packed, grads(model)) <= TOL[dtype]


def test_packed_loss_equals_padded_batch_loss():
    """The trainer's loss (mean over target tokens, label smoothing) is the padded batch's."""
    from attnkit.train.data.batches import batch_logits

    examples = pairs(S2S_LENGTHS, seed=3)
    model = make_s2s(torch.float64)
    loss, n = packed_loss(model, pack_seq2seq(examples, 200), label_smoothing=0.1)
    logits, y = batch_logits(model, "seq2seq", examples)
    ref = F.cross_entropy(
        logits.reshape(-1, V), y.reshape(-1), ignore_index=PAD, label_smoothing=0.1
    )
    assert n == int((y != PAD).sum()) == sum(len(t) - 1 for _, t in examples)
    assert rel_err(loss, ref) <= 1e-10


# ---------------------------------------------------------------------------------------------
# isolation and positions
# ---------------------------------------------------------------------------------------------
def test_lm_no_cross_document_attention():
    seqs = lm_seqs([30, 200, 25, 140, 60], seed=1)
    model = make_lm()
    batch = pack_lm(seqs, 512)
    assert len(batch.rows) == 1
    base = model(batch.inputs, batch.doc_ids, batch.position_ids)
    x = batch.inputs.clone()
    other = batch.doc_ids[0] == 1  # perturb document 1 only
    x[0, other] = torch.randint(4, V, (int(other.sum()),), generator=torch.Generator())
    assert not torch.equal(x, batch.inputs)
    out = model(x, batch.doc_ids, batch.position_ids)
    keep = ~other
    assert torch.equal(out[0, keep], base[0, keep])  # bit-identical
    assert not torch.equal(out[0, other], base[0, other])


def test_seq2seq_no_cross_document_attention():
    examples = pairs([(40, 30), (150, 120), (20, 50), (90, 60)], seed=2)
    model = make_s2s()
    b = pack_seq2seq(examples, 512)
    assert len(b.rows) == 1

    def run(src, tgt):
        return model(
            src,
            tgt,
            src_doc_ids=b.src_doc_ids,
            tgt_doc_ids=b.doc_ids,
            src_position_ids=b.src_position_ids,
            tgt_position_ids=b.position_ids,
        )

    base = run(b.src, b.inputs)
    src = b.src.clone()
    src[0, b.src_doc_ids[0] == 2] = 5  # another pair's source
    tgt = b.inputs.clone()
    tgt[0, (b.doc_ids[0] == 0) & (b.position_ids[0] > 0)] = 6  # and another's target
    out = run(src, tgt)
    for d in (1, 3):
        rows = b.doc_ids[0] == d
        assert torch.equal(out[0, rows], base[0, rows])
    assert not torch.equal(out[0, b.doc_ids[0] == 2], base[0, b.doc_ids[0] == 2])


def test_positions_restart_and_layout():
    seqs = lm_seqs([5, 2, 9, 4])
    b = pack_lm(seqs, 8)
    for r, row in enumerate(b.rows):
        at = 0
        for d, i in enumerate(row):
            n = len(seqs[i]) - 1
            assert b.inputs[r, at : at + n].tolist() == seqs[i][:-1]
            assert b.targets[r, at : at + n].tolist() == seqs[i][1:]  # ends with its own EOS
            assert b.position_ids[r, at : at + n].tolist() == list(range(n))
            assert b.doc_ids[r, at : at + n].tolist() == [d] * n
            at += n
        assert (b.targets[r, at:] == PAD).all() and (b.doc_ids[r, at:] == len(row)).all()
    assert b.num_tokens == sum(len(s) - 1 for s in seqs)
    assert torch.equal(
        positions_from_docs(b.doc_ids)[b.targets != PAD], b.position_ids[b.targets != PAD]
    )


def test_seq2seq_padding_sees_no_source():
    """Target padding has a document id that no source token of its row has."""
    b = pack_seq2seq(pairs([(3, 9), (4, 2), (9, 3)]), 10)
    assert b.rows == [[2], [0, 1]]
    for r, row in enumerate(b.rows):
        src_pad = b.src_doc_ids[r][b.src[r] == PAD].tolist()
        tgt_pad = b.doc_ids[r][b.targets[r] == PAD].tolist()
        assert set(src_pad) <= {len(row)} and set(tgt_pad) <= {len(row) + 1}
        assert not set(tgt_pad) & set(b.src_doc_ids[r].tolist())
    assert (b.src[1] == PAD).sum() == 2 and (b.targets[0] == PAD).sum() == 7


@given(st.lists(st.integers(0, 6), min_size=1, max_size=40))
@settings(max_examples=60, deadline=None)
def test_positions_from_docs_is_the_run_index(ids):
    t = torch.tensor([ids])
    want, run = [], 0
    for i, x in enumerate(ids):
        run = 0 if i == 0 or x != ids[i - 1] else run + 1
        want.append(run)
    assert positions_from_docs(t)[0].tolist() == want


# ---------------------------------------------------------------------------------------------
# structured masks, blocksparse, no dense L x L mask
# ---------------------------------------------------------------------------------------------
def _is_document_mask(m: Mask, windowed: bool = False) -> bool:
    if isinstance(m, Document):
        return True
    if isinstance(m, Intersection):
        a, b = m.parts
        other = SlidingWindow if windowed else Causal
        return isinstance(a, Document) and isinstance(b, other)
    return False


@pytest.mark.parametrize("kind", ["lm", "seq2seq"])
def test_document_masks_reach_blocksparse_and_nothing_dense(monkeypatch, kind):
    """Realistic packing (rows of ~500-1000 tokens of short sentences), a training step as the
    trainer runs it (dropout on, none on the attention weights): every attention call gets a
    structured document mask, ``auto`` runs it with blocksparse, and no mask tile as large as
    the L x L grid is ever evaluated (forward and backward)."""
    g = torch.Generator().manual_seed(4)
    drop = dict(dropout=0.1, attention_dropout=0.0)
    if kind == "lm":
        seqs = lm_seqs(torch.randint(6, 30, (60,), generator=g).tolist())
        model, batch = make_lm(**drop).train(), pack_lm(seqs, 1024)
    else:
        lens = torch.randint(4, 20, (50, 2), generator=g).tolist()
        model, batch = make_s2s(**drop).train(), pack_seq2seq(pairs(lens), 1024)
    seen, tiles = [], []
    real = functional.scaled_dot_product_attention

    def spy(q, k, v, mask=None, **kw):
        how = functional.explain_dispatch(q, k, v, mask, dropout_p=kw.get("dropout_p", 0.0))
        seen.append((mask, how.chosen, q.shape, k.shape))
        return real(q, k, v, mask, **kw)

    real_tile = Mask.tile

    def tile(self, q0, q1, k0, k1, q_len, kv_len):
        tiles.append(((q1 - q0) * (k1 - k0), q_len * kv_len))
        return real_tile(self, q0, q1, k0, k1, q_len, kv_len)

    monkeypatch.setattr(attention_fn.functional, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(Mask, "tile", tile)
    loss, _ = packed_loss(model, batch)
    loss.backward()
    layers = 2 if kind == "lm" else 6  # lm: 2 self; seq2seq: 2 enc + 2 dec self + 2 cross
    assert len(seen) == layers
    for mask, chosen, q, k in seen:
        assert _is_document_mask(mask), mask
        assert chosen == "blocksparse"
        assert q[-2] >= 256 and k[-2] >= 256
    assert tiles and all(area <= grid // 4 for area, grid in tiles)


# ---------------------------------------------------------------------------------------------
# the packing functions
# ---------------------------------------------------------------------------------------------
sizes_1d = st.lists(st.integers(0, 50), min_size=0, max_size=60)
sizes_2d = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=60)


@given(st.one_of(sizes_1d, sizes_2d), st.integers(50, 120))
@settings(max_examples=80, deadline=None)
def test_pack_rows_properties(sizes, max_len):
    rows = pack_rows(sizes, max_len)
    placed = sorted(i for row in rows for i in row)
    assert placed == list(range(len(sizes)))  # every item exactly once
    if not sizes:
        assert rows == []
        return
    arr = np.asarray(sizes, dtype=np.int64).reshape(len(sizes), -1)
    for row in rows:
        assert (arr[row].sum(0) <= max_len).all()  # rows fit, on every side
    assert pack_rows(sizes, max_len) == rows  # deterministic
    if arr.shape[1] == 1:  # first fit: two consecutive rows never fit in one
        assert all(arr[a].sum() + arr[b].sum() > max_len for a, b in zip(rows, rows[1:]))


def test_pack_rows_refuses_too_long():
    with pytest.raises(ValueError, match=r"^max_len: .* sequence 1 needs 9; use --max-len 9"):
        pack_rows([3, 9], 8)
    with pytest.raises(ValueError, match="^max_len: expected a positive int, got 0"):
        pack_rows([1], 0)
    with pytest.raises(ValueError, match="^seqs: sequence 0 has 1 ids"):
        pack_lm([[EOS]], 8)


@given(st.lists(st.integers(0, 9), min_size=2, max_size=60), st.integers(1, 12))
@settings(max_examples=60, deadline=None)
def test_split_long_predicts_every_id_once(seq, max_len):
    pieces = split_long(seq, max_len)
    assert all(2 <= len(p) <= max_len + 1 for p in pieces)
    assert [x for p in pieces for x in p[1:]] == seq[1:]  # every target once, in order
    assert [p[0] for p in pieces] == [seq[0]] + [p[-1] for p in pieces[:-1]]


@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=80),
    st.integers(40, 300),
    st.integers(0, 3),
    st.integers(0, 4),
)
@settings(max_examples=60, deadline=None)
def test_epoch_packed_batches(sizes, tokens, seed, epoch):
    batches = epoch_packed_batches(np.array(sizes), tokens, seed, epoch)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(len(sizes)))
    for b in batches:
        assert len(b) == 1 or sum(sizes[i] for i in b) <= tokens
    again = epoch_packed_batches(np.array(sizes), tokens, seed, epoch)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))


def test_packed_inputs_are_checked_before_work():
    lm, s2s = make_lm(), make_s2s()
    x = torch.randint(4, V, (2, 6))
    with pytest.raises(ValueError, match=r"^doc_ids: expected the shape of tokens \(2, 6\)"):
        lm(x, doc_ids=torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="^doc_ids: expected an integer tensor"):
        lm(x, doc_ids=torch.zeros(2, 6))
    with pytest.raises(ValueError, match="^position_ids: expected values >= 0, got -1"):
        lm(x, position_ids=torch.full((2, 6), -1))
    with pytest.raises(ValueError, match="^tgt_doc_ids: expected with src_doc_ids"):
        s2s(x, x, src_doc_ids=torch.zeros(2, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="^src_lengths: packed rows"):
        z = torch.zeros(2, 6, dtype=torch.long)
        s2s(x, x, torch.tensor([6, 6]), src_doc_ids=z, tgt_doc_ids=z)
    with pytest.raises(ValueError, match="^window: expected a non-negative int, got -1"):
        LMConfig(V, window=-1)
    with pytest.raises(ValueError, match="^attention_dropout: "):
        Seq2SeqConfig(V, V, attention_dropout=1.5)
