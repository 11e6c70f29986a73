"""What a real model's attention does for one word: per layer and head, the tokens it attends
to most, and the head-averaged view per layer.

    report = model_attention_report(model, "The animal didn't cross the street because it "
                                    "was too tired", "it")
    render_model_attention(report, rich.console.Console())   # attnkit.explain.render

The weights are the model's own softmax rows (``output_attentions=True``), one row per layer
and head: the row of the token where ``word`` starts (its first WordPiece). BERT-style models put
much of their weight on [CLS] / [SEP] ("attention sinks"); ``skip_special=True`` leaves those
out of the rankings (the weights shown are unchanged, not renormalised), and the report always
gives the head-averaged weight that went to special tokens.

Shape legend: ``L`` tokens of the text (with [CLS] and [SEP]), ``H`` heads, ``N`` layers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from attnkit.checks import flag, nonnegative_int, positive_int
from attnkit.models.bert import BertModel

__all__ = [
    "Attended",
    "ModelAttentionReport",
    "WordPosition",
    "find_word",
    "locate_word",
    "model_attention_report",
    "report_from_weights",
]


@dataclass(frozen=True)
class Attended:
    """One attended token: its text, its position in the token list, its weight."""

    token: str
    index: int
    weight: float


@dataclass(frozen=True)
class ModelAttentionReport:
    """Top attended tokens for one query token, per layer and head (JSON-safe via
    :meth:`to_dict`).

    ``heads[layer][head]`` and ``averaged[layer]`` list up to ``top_k`` :class:`Attended`,
    heaviest first; ``special_weight[layer]`` is the head-averaged weight on special tokens.
    """

    model: str
    text: str
    word: str
    tokens: list[str]
    word_pieces: list[str]
    word_indices: list[int]
    query_index: int
    top_k: int
    skip_special: bool
    num_layers: int
    num_heads: int
    heads: list[list[list[Attended]]]
    averaged: list[list[Attended]]
    special_weight: list[float]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """Plain dict of str / int / float / bool / lists (``json.dumps`` works on it)."""
        return asdict(self)


def find_word(tokens: list[str], pieces: list[str]) -> list[int]:
    """Start indices of every whole-word occurrence of the WordPiece sequence ``pieces`` in
    ``tokens`` (the match must not run on into a following "##" piece)."""
    n = len(pieces)
    out = []
    for i in range(len(tokens) - n + 1):
        if tokens[i : i + n] != pieces:
            continue
        if i + n < len(tokens) and tokens[i + n].startswith("##"):
            continue
        out.append(i)
    return out


def _top(row: torch.Tensor, allowed: torch.Tensor, tokens: list[str], k: int) -> list[Attended]:
    """The k heaviest allowed entries of a (L,) weight row."""
    masked = torch.where(allowed, row, torch.full_like(row, -1.0))
    k = min(k, int(allowed.sum()))
    vals, idx = masked.topk(k)
    return [
        Attended(tokens[j], j, float(v)) for v, j in zip(vals.tolist(), idx.tolist(), strict=True)
    ]


def model_attention_report(
    model: BertModel,
    text: str,
    word: str,
    top_k: int = 3,
    *,
    occurrence: int = 0,
    skip_special: bool = False,
) -> ModelAttentionReport:
    """Run ``model`` on ``text`` and collect, for the token where ``word`` starts, the
    ``top_k`` tokens each layer and head attends to, and the head-averaged top ``top_k``.

    Args:
        model: a loaded :class:`~attnkit.models.bert.BertModel` (with its tokenizer).
        text: one text; truncated like :meth:`BertModel.tokenize`.
        word: a word of ``text``; matched on WordPiece tokens (case follows the tokenizer).
            A word split into several pieces is looked up by its first piece (a note says so).
        top_k: how many tokens to list per head and per layer (>= 1).
        occurrence: which occurrence of ``word`` to use when it appears several times (0-based).
        skip_special: leave [CLS] / [SEP] out of the rankings.

    Raises:
        ValueError: ``word`` is not among the tokens (the message lists them), or a bad
            ``top_k`` / ``occurrence``.
    """
    if not isinstance(model, BertModel):
        raise TypeError(f"model: expected an attnkit BertModel, got {type(model).__name__}")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"text: expected a non-empty str, got {text!r}")
    if not isinstance(word, str) or not word.strip():
        raise ValueError(f"word: expected a non-empty str, got {word!r}")
    top_k = positive_int("top_k", top_k)
    occurrence = nonnegative_int("occurrence", occurrence)
    skip_special = flag("skip_special", skip_special)

    batch = model.tokenize([text])
    tokens = batch.tokens[0]
    special = batch.special_tokens_mask[0].bool()
    w = model.tokenize([word.strip()])
    pieces = [
        p for p, s in zip(w.tokens[0], w.special_tokens_mask[0].tolist(), strict=True) if not s
    ]
    if not pieces:
        raise ValueError(f"word: {word!r} gives no tokens")
    starts = find_word(tokens, pieces)
    if not starts:
        raise ValueError(f"word: {word!r} (tokens {pieces}) is not in the text's tokens: {tokens}")
    position = _word_position(word, starts, occurrence, lambda _: pieces)

    with torch.inference_mode():
        out = model(batch.input_ids, batch.attention_mask, batch.token_type_ids, True)
    weights = torch.stack([a[0] for a in out.attentions])  # (N, H, L, L)
    return report_from_weights(
        model.name_or_path, text, word, list(tokens), special.tolist(), weights, position,
        top_k=top_k, skip_special=skip_special,
    )  # fmt: skip


@dataclass(frozen=True)
class WordPosition:
    """Where a word is among a text's tokens: its ``pieces`` (the tokens it spans), the start
    token of each occurrence (``starts``), the chosen one (``query_index``), and notes for the
    reader (a split word, several occurrences)."""

    pieces: list[str]
    starts: list[int]
    query_index: int
    notes: list[str]


def locate_word(
    text: str,
    word: str,
    tokens: list[str],
    offsets: list[tuple[int, int]],
    special: list[bool],
    occurrence: int = 0,
) -> WordPosition:
    """Find ``word`` in ``text`` by characters (whole words; case-insensitive when it does not
    occur with this case) and map it to tokens through their character ``offsets`` (L): for
    any tokenizer (WordPiece, byte-level BPE, SentencePiece). A tokenizer that gives no offsets
    (all (0, 0)) is matched on whole token texts instead, ignoring case.

    Raises:
        ValueError: the word is not in the text or not in the tokens the model read (a cut
            text), naming ``word`` / ``occurrence``.
    """
    if not isinstance(word, str) or not word.strip():
        raise ValueError(f"word: expected a non-empty str, got {word!r}")
    occurrence = nonnegative_int("occurrence", occurrence)
    w = word.strip()
    pattern = r"(?<!\w)" + re.escape(w) + r"(?!\w)"
    found = [m.start() for m in re.finditer(pattern, text)]
    if not found:
        found = [m.start() for m in re.finditer(pattern, text, flags=re.IGNORECASE)]
    spans = []
    if all(a == b == 0 for a, b in offsets):  # a tokenizer without offsets: match token texts
        key = w.casefold()
        found = []
        spans = [[i] for i, t in enumerate(tokens) if t.casefold() == key and not special[i]]
    for c in found:
        covered = [
            i
            for i, ((a, b), sp) in enumerate(zip(offsets, special, strict=True))
            if not sp and a < c + len(w) and b > c
        ]
        if covered:
            spans.append(covered)
    if not spans:
        shown = [t for t, sp in zip(tokens, special, strict=True) if not sp]
        raise ValueError(f"word: {word!r} is not in the text's tokens: {shown}")
    starts = [c[0] for c in spans]
    return _word_position(word, starts, occurrence, lambda n: [tokens[i] for i in spans[n]])


def _word_position(
    word: str, starts: list[int], occurrence: int, pieces_of: Callable[[int], list[str]]
) -> WordPosition:
    """The chosen occurrence (ValueError naming ``occurrence`` when there are fewer), with notes
    for a word split into pieces (``pieces_of(occurrence)``) or occurring several times."""
    if occurrence >= len(starts):
        raise ValueError(
            f"occurrence: {word!r} occurs {len(starts)} time(s) (tokens {starts}), "
            f"got occurrence={occurrence}"
        )
    pieces = pieces_of(occurrence)
    q = starts[occurrence]
    notes = []
    if len(pieces) > 1:
        notes.append(
            f"{word!r} is split into the pieces {pieces}; showing its first piece {pieces[0]!r}"
        )
    if len(starts) > 1:
        notes.append(
            f"{word!r} occurs {len(starts)} times (tokens {starts}); showing occurrence "
            f"{occurrence} (token {q})"
        )
    return WordPosition(pieces, starts, q, notes)


def report_from_weights(
    model: str,
    text: str,
    word: str,
    tokens: list[str],
    special: list[bool],
    weights: torch.Tensor,
    position: WordPosition,
    *,
    top_k: int = 3,
    skip_special: bool = False,
    notes: list[str] | None = None,
) -> ModelAttentionReport:
    """The report for the token at ``position.query_index`` from a model's weights
    (N, H, L, L) on ``tokens`` (L) with their ``special`` flags (L); ``model`` is its name.
    ``notes`` are added after the position's notes."""
    top_k = positive_int("top_k", top_k)
    skip_special = flag("skip_special", skip_special)
    if weights.dim() != 4 or weights.shape[-1] != len(tokens) or len(special) != len(tokens):
        raise ValueError(
            f"weights: expected (N, H, {len(tokens)}, {len(tokens)}) for {len(tokens)} tokens, "
            f"got {tuple(weights.shape)} and {len(special)} special flags"
        )
    q = position.query_index
    special_t = torch.tensor(special, dtype=torch.bool)
    rows = weights[:, :, q, :].double()  # (N, H, L)
    allowed = ~special_t if skip_special else torch.ones_like(special_t)
    heads = [[_top(r, allowed, tokens, top_k) for r in layer] for layer in rows]
    avg = rows.mean(dim=1)  # (N, L)
    averaged = [_top(r, allowed, tokens, top_k) for r in avg]
    special_weight = [float(r[special_t].sum()) for r in avg]
    all_notes = list(position.notes) + list(notes or [])
    if skip_special:
        all_notes.append("special tokens (such as [CLS], [SEP]) are left out of the rankings")
    return ModelAttentionReport(
        model=model,
        text=text,
        word=word,
        tokens=list(tokens),
        word_pieces=list(position.pieces),
        word_indices=list(position.starts),
        query_index=q,
        top_k=top_k,
        skip_special=skip_special,
        num_layers=rows.shape[0],
        num_heads=rows.shape[1],
        heads=heads,
        averaged=averaged,
        special_weight=special_weight,
        notes=all_notes,
    )
