"""Stream training data (issue 20): the contiguous split, windows at every offset, seeded random
batches (nanoGPT's get_batch), newline tokens for every tokenizer, and a stream run's data."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from attnkit.train.config import TrainConfig
from attnkit.train.data import tokenizer as tk
from attnkit.train.data.sources import DataError
from attnkit.train.data.stream import StreamWindows, split_text, stream_batches
from attnkit.train.data.tasks import prepare
from attnkit.train.loop.steps import heldout_examples
from tests.train.conftest import RHYME


def test_split_is_nanogpts_first_90_percent_and_contiguous_tail():
    text = "".join(chr(97 + i % 26) for i in range(1_115_394))
    part = split_text(text, 0.1)
    n = int(len(text) * 0.9)  # nanoGPT's prepare.py
    assert part.cut == n == 1_003_854
    assert part.train == text[:n] and part.valid == text[n:]


@settings(max_examples=60, deadline=None)
@given(n=hs.integers(2, 500), fraction=hs.floats(0.01, 0.99))
def test_split_covers_the_text_in_order(n, fraction):
    text = "".join(chr(65 + i % 50) for i in range(n))
    cut = int(n * (1 - fraction))
    if cut <= 0 or cut >= n:
        with pytest.raises(ValueError, match="^valid_fraction: "):
            split_text(text, fraction)
        return
    part = split_text(text, fraction)
    assert part.train + part.valid == text and len(part.train) == cut


def test_windows_are_every_offset_of_block_plus_one_ids():
    ids = np.arange(100, 120)
    w = StreamWindows(ids, 5)
    assert len(w) == 15
    for i in (0, 7, 14):
        assert w[i] == (list(range(100 + i, 106 + i)),)
    with pytest.raises(IndexError):
        w[15]
    with pytest.raises(ValueError, match="^block_size: the training stream has 5 tokens"):
        StreamWindows(np.arange(5), 5)


def test_batches_are_seeded_uniform_offsets_with_replacement():
    a = stream_batches(1000, 12, seed=3, epoch=0, count=50)
    assert len(a) == 50 and all(b.shape == (12,) for b in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, stream_batches(1000, 12, 3, 0, 50)))
    assert not np.array_equal(np.stack(a), np.stack(stream_batches(1000, 12, 3, 1, 50)))
    assert not np.array_equal(np.stack(a), np.stack(stream_batches(1000, 12, 4, 0, 50)))
    flat = np.concatenate(stream_batches(10, 50, 0, 0, 400))
    assert flat.min() == 0 and flat.max() == 9  # every offset reachable, none beyond
    counts = np.bincount(flat, minlength=10) / len(flat)
    assert np.abs(counts - 0.1).max() < 0.01  # uniform (20,000 draws: sd ~0.002)


TEXT = "First Citizen:\nBefore we proceed, hear me.\n\nAll:\nSpeak, speak.\n"


@pytest.mark.parametrize("kind", ["char", "word", "bpe"])
def test_newline_is_a_token_and_round_trips(kind):
    tok = tk.train([TEXT], kind, 300)
    ids = tk.encode(tok, TEXT)
    assert tk.UNK not in ids and tk.EOS not in ids
    want = TEXT.rstrip("\n") if kind != "word" else TEXT.lower().rstrip("\n")
    assert tk.decode(tok, ids).rstrip("\n") == want
    if kind != "bpe":  # byte-level BPE may merge "\n\n"; char and word keep each newline
        nl = tok.token_to_id("\n")
        assert nl is not None and ids.count(nl) == TEXT.count("\n")


@pytest.mark.parametrize(
    ("tokens", "text"),
    [
        (["hi", ",", "king", "'", "s", "men", "."], "hi, king's men."),
        (["a", "\n", "\n", "b", "!", "\n"], "a\n\nb!\n"),
        (["(", "all", ")", "went", "?"], "(all) went?"),
        (["x", "--", "y"], "x-- y"),
    ],
)
def test_detokenize(tokens, text):
    assert tk.detokenize(tokens) == text


def test_stream_run_data(tmp_path):
    path = tmp_path / "r.txt"
    path.write_text(RHYME, encoding="utf-8")
    c = TrainConfig(task="lm", data=str(path), tokenizer="char", block_size=16).resolved()
    assert c.lines is False and c.valid_fraction == 0.1 and c.label_smoothing == 0.0
    data = prepare(c)
    part = split_text(RHYME, 0.1)
    assert data.heldout == [part.valid]
    ids = tk.encode(data.tokenizer, part.train)
    assert data.stream is not None and data.stream.ids.tolist() == ids
    assert len(data.examples) == len(ids) - 16
    held = heldout_examples(data, c)
    valid_ids = tk.encode(data.tokenizer, part.valid)
    assert [x for (w,) in held for x in w[:-1]] + [held[-1][0][-1]] == valid_ids
    assert all(len(w) == 17 for (w,) in held[:-1])
    lines = TrainConfig(task="lm", data=str(path), lines=True).resolved()
    assert lines.valid_fraction == 0.05 and prepare(lines).stream is None
    assert TrainConfig(task="lm", data=str(path), pack=True).resolved().lines is True
    with pytest.raises(DataError, match="block_size: the training stream has"):
        prepare(TrainConfig(task="lm", data=str(path), block_size=4096).resolved())
