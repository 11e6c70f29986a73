"""attnkit.integrations.hf_masks: every mask transformers can build, recovered as attnkit masks,
against transformers' own dense evaluation (``masking_utils.sdpa_mask`` with no skipping), the
reference for what eager attention masks. Exact (bool grids), odd sizes, offsets as a KV cache
and a sliding-window cache produce them.

Packed sequences go through what a model calls (``create_causal_mask`` /
``create_sliding_window_causal_mask`` with ``position_ids``), once with
``attn_implementation="attnkit"`` and once with ``"sdpa"``: transformers composes the mask
function itself, so the tests follow however a release builds it (5.24 removed the helper they
used to call)."""

from __future__ import annotations

import warnings

import pytest
import torch

mu = pytest.importorskip(
    "transformers.masking_utils", reason="transformers not installed (pip install 'attnkit[hf]')"
)
import transformers as tf  # noqa: E402

from attnkit.integrations import hf_mask_nodes  # noqa: E402
from attnkit.integrations import transformers as ak_hf  # noqa: E402
from attnkit.integrations.hf_masks import UnrecognisedMaskWarning, recover  # noqa: E402
from attnkit.masks import Document, KeyColumns, KeyPadding, Predicate  # noqa: E402


def dense(fn, padding, b, lq, lk, q_off=0, kv_off=0):
    """transformers' own evaluation: (B, Lq, Lk) bool."""
    m = mu.sdpa_mask(
        batch_size=b,
        q_length=lq,
        kv_length=lk,
        q_offset=q_off,
        kv_offset=kv_off,
        mask_function=fn,
        attention_mask=padding,
        allow_is_causal_skip=False,
        allow_is_bidirectional_skip=False,
    )
    return m[:, 0]


def ours(fn, padding, b, lq, lk, q_off=0, kv_off=0):
    hm = recover(fn, padding, b, lq, lk, q_off, kv_off)
    if hm.mask is None:
        return torch.ones(b, lq, lk, dtype=torch.bool), hm
    return hm.mask.materialize(lq, lk).expand(b, lq, lk), hm


def padding_rows(b, n, kind, gen):
    """(B, n) bool padding masks: right / left padded, or an arbitrary pattern."""
    lengths = torch.randint(0, n + 1, (b,), generator=gen)
    ar = torch.arange(n)[None, :]
    if kind == "right":
        return ar < lengths[:, None]
    if kind == "left":
        return ar >= (n - lengths)[:, None]
    return torch.rand(b, n, generator=gen) < 0.7


SHAPES = [  # (Lq, Lk, q_offset, kv_offset): prefill, decode after a cache, window-cache offsets
    (1, 1, 0, 0),
    (7, 7, 0, 0),
    (97, 97, 0, 0),
    (1, 8, 7, 0),
    (3, 12, 9, 0),
    (1, 4, 9, 6),  # sliding-window cache: keys 6..9
    (5, 9, 12, 8),
]
FUNCS = {
    "causal": lambda: mu.causal_mask_function,
    "bidirectional": lambda: mu.bidirectional_mask_function,
    "window3": lambda: mu.sliding_window_causal_mask_function(3),
    "window1": lambda: mu.sliding_window_causal_mask_function(1),
    "window_bi2": lambda: mu.sliding_window_bidirectional_mask_function(2),
    "or_window_causal": lambda: mu.or_masks(
        mu.sliding_window_overlay(2), mu.sliding_window_bidirectional_overlay(1)
    ),
}


@pytest.mark.parametrize("func", sorted(FUNCS))
def test_recognised_masks_equal_transformers(func):
    fn = FUNCS[func]()
    b = 3
    for lq, lk, q_off, kv_off in SHAPES:
        gen = torch.Generator().manual_seed(lq * 31 + lk)
        for pad in (None, "right", "left", "random"):
            padding = None if pad is None else padding_rows(b, kv_off + lk, pad, gen)
            with warnings.catch_warnings():
                warnings.simplefilter("error", UnrecognisedMaskWarning)  # recognised: no predicate
                got, hm = ours(fn, padding, b, lq, lk, q_off, kv_off)
            want = dense(fn, padding, b, lq, lk, q_off, kv_off)
            assert torch.equal(got, want), (lq, lk, q_off, kv_off, pad, hm)
            leaves = hm.mask.leaves() if hm.mask is not None else ()
            assert not any(isinstance(leaf, Predicate) for leaf in leaves)


def test_structure_names():
    """The recovered objects are the structured kinds the block-sparse kernel plans cheaply."""
    hm = recover(mu.sliding_window_causal_mask_function(4), None, 2, 9, 9)
    assert type(hm.mask).__name__ == "SlidingWindow" and hm.mask.left == 3
    hm = recover(mu.sliding_window_causal_mask_function(16), None, 2, 9, 9)
    assert hm.mask.is_plain_causal  # a window wider than the sequence: plain causal
    hm = recover(mu.causal_mask_function, None, 2, 3, 9, 6, 0)
    assert hm.mask.is_plain_causal is False and hm.mask.alignment == "bottom_right"
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    hm = recover(mu.bidirectional_mask_function, right, 2, 4, 4)
    assert isinstance(hm.mask, KeyPadding) and hm.mask.lengths.tolist() == [3, 4]
    left = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    hm = recover(mu.bidirectional_mask_function, left, 2, 4, 4)
    assert isinstance(hm.mask, KeyColumns)
    assert recover(mu.bidirectional_mask_function, None, 2, 4, 4).mask is None


def packed_masks(pos: torch.Tensor, window: int | None):
    """Masks for packed ``position_ids`` (B, L) built by transformers' public mask creation (what
    a causal LM calls; ``window``: a Mistral-style sliding window): attnkit's (B, L, L) bool grid
    with its ``HFMask``, and transformers' own (B, L, L) under ``attn_implementation="sdpa"``."""
    ak_hf.register()
    cfg = tf.MistralConfig(
        hidden_size=8, num_attention_heads=1, num_key_value_heads=1, sliding_window=window
    )
    create = mu.create_causal_mask if window is None else mu.create_sliding_window_causal_mask
    b, n = pos.shape
    emb = torch.zeros(b, n, 8)
    cfg._attn_implementation = ak_hf.NAME
    hm = create(cfg, emb, None, None, pos)
    cfg._attn_implementation = "sdpa"
    want = create(cfg, emb, None, None, pos, allow_is_causal_skip=False)[:, 0]
    got = want.new_ones(()) if hm.mask is None else hm.mask.materialize(n, n)
    return got.expand(b, n, n), hm, want


@pytest.mark.parametrize("window", [None, 3])
def test_packed_sequences_become_documents(window):
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3], [5, 6, 7, 8, 0, 1, 2, 3, 4, 5, 6]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnrecognisedMaskWarning)
        got, hm, want = packed_masks(pos, window)
    assert torch.equal(got, want)
    assert any(isinstance(leaf, Document) for leaf in hm.mask.leaves())
    assert not any(isinstance(leaf, Predicate) for leaf in hm.mask.leaves())


def test_packed_with_jumps_inside_a_sequence_stays_exact():
    """Positions that jump by 2 inside what transformers calls one sequence cannot happen (a jump
    starts a new sequence), but a hand-built remap must still be exact: evaluated, not assumed."""
    pos = torch.tensor([[0, 1, 2, 3, 4, 5]])
    psm = torch.tensor([[0, 0, 0, 0, 1, 1]])
    fn = mu.and_masks(  # the closures transformers composes for packed sequences
        mu.remap_positions_for_packed_sequence(mu.causal_mask_function, pos * 2),
        mu.packed_sequence_mask_function(psm),
    )
    hf_mask_nodes._WARNED.clear()  # the warning is once per function; make this test independent
    with pytest.warns(UnrecognisedMaskWarning):
        got, hm = ours(fn, None, 1, 6, 6)
    assert torch.equal(got, dense(fn, None, 1, 6, 6))


def test_unrecognised_function_is_exact_with_a_warning():
    """Llama 4's chunked attention is not a band: evaluated exactly, with a one-time warning."""
    left = torch.tensor([0, 2])
    fn = mu.chunked_causal_mask_function(3, left)
    pad = torch.tensor([[1] * 10, [0, 0] + [1] * 8], dtype=torch.bool)
    hf_mask_nodes._WARNED.clear()
    with pytest.warns(UnrecognisedMaskWarning, match="chunked_overlay"):
        got, hm = ours(fn, pad, 2, 10, 10)
    assert torch.equal(got, dense(fn, pad, 2, 10, 10))
    assert any(isinstance(leaf, Predicate) for leaf in hm.mask.leaves())
    bm = hm.mask.block_map(10, 10, 4, 4)
    assert bm is hm.mask.block_map(10, 10, 4, 4)  # cached per shape


def test_same_structure_reuses_the_mask_object():
    """Block maps and kernel plans live on the mask object: a second forward with the same
    structure gets the same object back."""
    pad = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    a = recover(mu.causal_mask_function, pad, 1, 4, 4).mask
    b = recover(mu.causal_mask_function, pad.clone(), 1, 4, 4).mask
    c = recover(mu.causal_mask_function, torch.tensor([[1, 1, 0, 0]], dtype=torch.bool), 1, 4, 4)
    assert a is b and c.mask is not a


def test_bad_padding_shape_is_refused():
    with pytest.raises(ValueError, match="attention_mask"):
        recover(mu.causal_mask_function, torch.ones(2, 2, 4, dtype=torch.bool), 2, 4, 4)
    with pytest.raises(ValueError, match="attention_mask: expected 2 rows"):
        recover(mu.causal_mask_function, torch.ones(3, 4, dtype=torch.bool), 2, 4, 4)


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - hypothesis is a dev dependency
    given = None

if given is not None:

    @settings(max_examples=60, deadline=None)
    @given(
        lq=st.integers(1, 40),
        extra=st.integers(0, 40),
        q_back=st.integers(0, 40),
        kv_off=st.integers(0, 20),
        window=st.integers(1, 12),
        kind=st.sampled_from(["causal", "window", "window_bi", "or", "packed"]),
        pad=st.sampled_from([None, "right", "left", "random"]),
        seed=st.integers(0, 2**16),
    )
    def test_any_recognised_mask_equals_transformers(
        lq, extra, q_back, kv_off, window, kind, pad, seed
    ):
        """Random lengths, cache offsets, windows, padding and packing: attnkit's recovered
        mask equals transformers' evaluation, and no predicate was needed."""
        lk = lq + extra
        q_off = kv_off + extra  # queries after the cached keys
        q_off = max(0, q_off - min(q_back, q_off)) if kind == "window_bi" else q_off
        gen = torch.Generator().manual_seed(seed)
        b = 2
        if kind == "packed":
            starts = torch.rand(b, lq, generator=gen) < 0.25
            starts[:, 0] = True
            first = torch.zeros(b, lq, dtype=torch.long)
            for r in range(b):
                for t in range(lq):
                    first[r, t] = t if starts[r, t] else first[r, t - 1]
            # transformers packs only without a padding mask or a cache
            with warnings.catch_warnings():
                warnings.simplefilter("error", UnrecognisedMaskWarning)
                got, hm, want = packed_masks(torch.arange(lq)[None, :] - first, window)
            assert torch.equal(got, want), hm
            return
        if kind == "causal":
            fn = mu.causal_mask_function
        elif kind == "window":
            fn = mu.sliding_window_causal_mask_function(window)
        elif kind == "window_bi":
            fn = mu.sliding_window_bidirectional_mask_function(window)
        elif kind == "or":
            fn = mu.and_masks(
                mu.or_masks(mu.causal_mask_function, mu.sliding_window_bidirectional_overlay(2)),
                mu.sliding_window_overlay(window),
            )
        padding = None if pad is None else padding_rows(b, kv_off + lk, pad, gen)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnrecognisedMaskWarning)
            got, hm = ours(fn, padding, b, lq, lk, q_off, kv_off)
        assert torch.equal(got, dense(fn, padding, b, lq, lk, q_off, kv_off)), hm
