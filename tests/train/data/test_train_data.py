"""train.data / tokenizer / batches / schedule: bad files named with their line, the seeded
split, the synthetic tasks against plain Python, tokenizers trained on the split, bucketed
batches, the warm-up schedule against the paper's numbers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.train.config import TrainConfig
from attnkit.train.data import tokenizer as tk
from attnkit.train.data.batches import collate_seq2seq, epoch_batches
from attnkit.train.data.sources import (
    DataError,
    read_pairs,
    read_text_lines,
    split_heldout,
    synthetic_split,
)
from attnkit.train.data.tasks import prepare
from attnkit.train.loop.schedule import noam_lr


def write(tmp_path, name, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize(
    "content, match",
    [
        (b"", r"empty"),
        (b"\n  \n", r"empty"),
        (b"a\tb\nc d\n", r":2: expected 'source<TAB>target', found no tab"),
        (b"a\tb\n\tx\n", r":2: the source is empty"),
        (b"a\tb\nx\t \n", r":2: the target is empty"),
        (b"a\tb\nok\tfine\n\xff\xfe\tx\n", r":3: not UTF-8"),
    ],
)
def test_bad_pairs_name_file_and_line(tmp_path, content, match):
    p = write(tmp_path, "bad.tsv", content)
    with pytest.raises(DataError, match=match) as e:
        read_pairs(p)
    assert str(e.value).startswith(str(p))


def test_unreadable_paths(tmp_path):
    with pytest.raises(DataError, match="cannot read"):
        read_pairs(tmp_path / "missing.tsv")
    with pytest.raises(DataError, match="is a directory"):
        read_text_lines(tmp_path)


def test_pairs_keep_two_columns_and_skip_blank_lines(tmp_path):
    p = write(tmp_path, "ok.tsv", "\ufeffGo.\tVa !\tCC-BY\n\nHi.\tSalut.\n".encode())
    assert read_pairs(p) == [("Go.", "Va !"), ("Hi.", "Salut.")]


def test_empty_split_is_refused(tmp_path):
    p = write(tmp_path, "one.tsv", b"a\tb\n")
    with pytest.raises(DataError, match=r"one.tsv: 1 distinct sources; a training and a held-out"):
        prepare(TrainConfig(task="translate", data=str(p)).resolved())


def test_translation_split_keeps_a_source_on_one_side(tmp_path):
    lines = [f"s{i % 40}\tt{i}" for i in range(120)]  # 40 sources, 3 translations each
    p = write(tmp_path, "multi.tsv", "\n".join(lines).encode())
    data = prepare(TrainConfig(task="translate", data=str(p), valid_fraction=0.1).resolved())
    held = {s for s, _ in data.heldout}
    assert len(held) == 4 and len(data.heldout) == 12
    assert not held & {s for s, _ in data.train_sample}
    assert len(data.examples) == 108


def test_split_is_seeded_and_disjoint():
    a = split_heldout(1000, 0.05, seed=3)
    assert len(a) == 50 and len(set(a.tolist())) == 50
    assert np.array_equal(a, split_heldout(1000, 0.05, seed=3))
    assert not np.array_equal(a, split_heldout(1000, 0.05, seed=4))
    assert len(split_heldout(3, 0.01, 0)) == 1  # at least one, never all
    assert len(split_heldout(2, 0.99, 0)) == 1


@pytest.mark.parametrize("task", ["copy", "reverse", "sort"])
def test_synthetic_tasks(task):
    train, held = synthetic_split(task, 300, 40, vocab=7, min_length=2, max_length=9, seed=1)
    want = {"copy": lambda s: s, "reverse": lambda s: s[::-1], "sort": sorted}[task]
    for src, tgt in train + held:
        s = [int(x) for x in src.split()]
        assert 2 <= len(s) <= 9 and all(0 <= x < 7 for x in s)
        assert [int(x) for x in tgt.split()] == list(want(s))
    assert len(held) == 40 and not {s for s, _ in held} & {s for s, _ in train}
    assert (train, held) == synthetic_split(task, 300, 40, 7, 2, 9, seed=1)


def test_tokenizers_specials_and_round_trip():
    texts = ["Je suis fatigué !", "Va-t'en.", "Où est-il ?"]
    bpe = tk.train(texts, "bpe", 300)
    for i, name in enumerate(tk.SPECIALS):
        assert bpe.token_to_id(name) == i
    for t in texts:  # byte-level BPE decodes to the exact text
        assert tk.decode(bpe, tk.encode(bpe, t) + [tk.EOS, 7, 8]) == t
    char = tk.train(["abc ab"], "char")
    assert tk.decode(char, tk.encode(char, "cab ba")) == "cab ba"
    word = tk.train(["Humpty Dumpty sat on a wall."], "word")
    assert tk.decode(word, tk.encode(word, "humpty sat on a wall.")) == "humpty sat on a wall."
    with pytest.raises(ValueError, match="tokenizer"):
        tk.train(texts, "sentencepiece")


def test_bucketed_batches_cover_each_example_once_per_epoch():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 50, size=1000)
    for epoch in (0, 1):
        batches = epoch_batches(lengths, 16, seed=5, epoch=epoch)
        flat = np.concatenate(batches)
        assert sorted(flat.tolist()) == list(range(1000))
        # bucketing: batches are far more uniform in length than random ones
        spread = np.mean([np.ptp(lengths[b]) for b in batches])
        assert spread < 0.25 * np.ptp(lengths)
    assert all(
        np.array_equal(a, b)
        for a, b in zip(epoch_batches(lengths, 16, 5, 1), epoch_batches(lengths, 16, 5, 1))
    )
    e0, e1 = epoch_batches(lengths, 16, 5, 0), epoch_batches(lengths, 16, 5, 1)
    assert not all(np.array_equal(a, b) for a, b in zip(e0, e1))


def test_collate_pads_and_shifts():
    src, tgt_in, tgt_out = collate_seq2seq([([5, 6, 2], [1, 7, 2]), ([5, 2], [1, 7, 8, 2])])
    assert src.tolist() == [[5, 6, 2], [5, 2, 0]]
    assert tgt_in.tolist() == [[1, 7, 2], [1, 7, 8]]
    assert tgt_out.tolist() == [[7, 2, 0], [7, 8, 2]]


def test_noam_schedule_matches_the_paper():
    # Vaswani et al.: d_model 512, warmup 4000: peak 512^-0.5 * 4000^-0.5 at step 4000
    peak = 512**-0.5 * 4000**-0.5
    assert noam_lr(4000, 512, 4000) == pytest.approx(peak, rel=1e-12)
    assert noam_lr(1, 512, 4000) == pytest.approx(peak / 4000, rel=1e-12)  # linear warm-up
    assert noam_lr(16000, 512, 4000) == pytest.approx(peak / 2, rel=1e-12)  # step^-0.5 decay
    assert noam_lr(4000, 512, 4000, factor=2.0) == pytest.approx(2 * peak, rel=1e-12)
    with pytest.raises(ValueError, match="step"):
        noam_lr(0, 512, 4000)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=400),
    batch_size=st.integers(1, 70),
    seed=st.integers(0, 2**32 - 1),
    epoch=st.integers(0, 1000),
)
def test_epoch_batches_partition_the_examples(lengths, batch_size, seed, epoch):
    batches = epoch_batches(np.array(lengths), batch_size, seed, epoch)
    assert all(1 <= len(b) <= batch_size for b in batches)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    again = epoch_batches(np.array(lengths), batch_size, seed, epoch)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))
