"""Standard corpus scoring: sacrebleu's BLEU, chrF and TER with several references per
segment, and the grouping of (source, reference) pairs by source that it needs.

A test set such as eng-fra's held-out split may hold one source several times with different
translations. Scored the standard way, each *distinct* source is one segment, decoded once, and
all its translations are its references (sacrebleu's signature then says ``nrefs:var`` when the
number varies). Scoring every pair as its own segment instead would count one hypothesis up to
as many times as it has references, against one reference each: a different, lower number.

Shape legend: ``S`` distinct sources (segments), ``R`` the most references of one segment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "CorpusScore",
    "References",
    "Scores",
    "corpus_bleu",
    "corpus_scores",
    "group_references",
]


@dataclass(frozen=True)
class References:
    """Pairs grouped by source: ``sources`` (S,) distinct, in order of first appearance;
    ``references[i]`` the targets of ``sources[i]`` in file order (duplicates dropped)."""

    sources: tuple[str, ...]
    references: tuple[tuple[str, ...], ...]

    @property
    def pairs(self) -> int:
        """The number of (source, reference) pairs kept."""
        return sum(len(r) for r in self.references)

    def streams(self) -> list[list[str | None]]:
        """sacrebleu's layout: R reference streams of S entries each, None where a segment
        has fewer than R references."""
        most = max((len(r) for r in self.references), default=0)
        return [[r[k] if k < len(r) else None for r in self.references] for k in range(most)]


def group_references(pairs: Sequence[tuple[str, str]]) -> References:
    """(source, target) pairs -> :class:`References` (every distinct source once, with all its
    distinct targets). ValueError when ``pairs`` is empty."""
    if not pairs:
        raise ValueError("pairs: expected at least one (source, reference) pair, got none")
    groups: dict[str, dict[str, None]] = {}
    for src, tgt in pairs:
        groups.setdefault(src, {})[tgt] = None
    return References(tuple(groups), tuple(tuple(t) for t in groups.values()))


@dataclass(frozen=True)
class CorpusScore:
    """One corpus-level metric: ``name`` (BLEU, chrF, TER), ``score`` and sacrebleu's
    ``signature`` (which says how it was computed, e.g. ``nrefs:var|case:mixed|tok:13a``)."""

    name: str
    score: float
    signature: str

    def line(self) -> str:
        """``BLEU 35.40  (nrefs:var|...)``."""
        return f"{self.name} {self.score:.2f}  ({self.signature})"


@dataclass(frozen=True)
class Scores:
    """BLEU, chrF and TER of one set of hypotheses (higher BLEU/chrF is better, lower TER)."""

    bleu: CorpusScore
    chrf: CorpusScore
    ter: CorpusScore

    def all(self) -> tuple[CorpusScore, CorpusScore, CorpusScore]:
        return self.bleu, self.chrf, self.ter


def corpus_scores(hyps: Sequence[str], refs: Sequence[Sequence[str | None]]) -> Scores:
    """sacrebleu corpus BLEU (13a tokenizer), chrF and TER of ``hyps`` (S,) against reference
    streams ``refs`` (R streams of S entries; None = this segment has no reference in this
    stream), on detokenized text. ValueError naming the argument when the lengths differ or a
    segment has no reference."""
    from sacrebleu.metrics import BLEU, CHRF, TER

    hyps = list(hyps)
    if not hyps:
        raise ValueError("hyps: expected at least one hypothesis, got none")
    if not refs:
        raise ValueError("refs: expected at least one reference stream, got none")
    for k, stream in enumerate(refs):
        if len(stream) != len(hyps):
            raise ValueError(
                f"refs: reference stream {k + 1} has {len(stream)} lines, expected one per "
                f"hypothesis ({len(hyps)})"
            )
    for i, seg in enumerate(zip(*refs)):
        if all(r is None for r in seg):
            raise ValueError(f"refs: segment {i + 1} has no reference")
    streams = [list(s) for s in refs]
    out = []
    for name, metric in (("BLEU", BLEU()), ("chrF", CHRF()), ("TER", TER())):
        score = metric.corpus_score(hyps, streams)
        out.append(CorpusScore(name, float(score.score), str(metric.get_signature())))
    return Scores(*out)


def corpus_bleu(hyps: Sequence[str], refs: Sequence[Sequence[str | None]]) -> float:
    """sacrebleu corpus BLEU alone (the laid-out arguments of :func:`corpus_scores`)."""
    from sacrebleu.metrics import BLEU

    return float(BLEU().corpus_score(list(hyps), [list(s) for s in refs]).score)
