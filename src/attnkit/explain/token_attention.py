"""What every token of a text attends to most, per layer, averaged over the heads:
``attnkit explain --model ...`` without ``--word``.

    report = all_tokens_report("gpt2", tokens, special, weights, top_k=2)
    report.rows[i][n]    # token i, layer n: its top_k Attended, heaviest first

The head average of layer ``n`` is ``weights[n].mean(over heads)``, a (L, L) matrix whose rows
still sum to 1 (each head's row does). Shape legend: ``N`` layers, ``H`` heads, ``L`` tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from attnkit.checks import flag, positive_int
from attnkit.explain.model_attention import Attended

__all__ = ["AllTokensReport", "all_tokens_report"]


@dataclass(frozen=True)
class AllTokensReport:
    """For each token (``tokens``, L) and each layer (N): the ``top_k`` tokens it attends to
    most, head-averaged (``rows[i][n]``, a list of :class:`Attended`, heaviest first)."""

    model: str
    text: str
    tokens: list[str]
    top_k: int
    skip_special: bool
    num_layers: int
    num_heads: int
    rows: list[list[list[Attended]]]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """Plain dict of str / int / float / bool / lists (``json.dumps`` works on it)."""
        return asdict(self)


def all_tokens_report(
    model: str,
    text: str,
    tokens: list[str],
    special: list[bool],
    weights: torch.Tensor,
    *,
    top_k: int = 3,
    skip_special: bool = False,
    notes: list[str] | None = None,
) -> AllTokensReport:
    """Rank, for every token and layer, the tokens it attends to most (head-averaged).

    Args:
        model: the model's name (shown). text: the text.
        tokens: the L tokens; special: L flags (the tokenizer's special tokens).
        weights: (N, H, L, L) attention weights (rows: queries).
        top_k: how many tokens per token and layer (>= 1).
        skip_special: leave special tokens out of the rankings (weights are not renormalised).
        notes: lines for the reader.

    Raises:
        TypeError / ValueError: a bad ``top_k`` or ``skip_special``, or weights whose shape
            does not fit the tokens.
    """
    top_k = positive_int("top_k", top_k)
    skip_special = flag("skip_special", skip_special)
    n_tok = len(tokens)
    if not isinstance(weights, torch.Tensor) or weights.dim() != 4:
        raise ValueError(f"weights: expected a (N, H, L, L) tensor, got {weights!r:.80}")
    if tuple(weights.shape[2:]) != (n_tok, n_tok) or len(special) != n_tok:
        raise ValueError(
            f"weights: expected (N, H, {n_tok}, {n_tok}) for {n_tok} tokens, got "
            f"{tuple(weights.shape)} and {len(special)} special flags"
        )
    avg = weights.double().mean(dim=1)  # (N, L, L)
    allowed = torch.tensor([not (skip_special and s) for s in special], dtype=torch.bool)
    k = min(top_k, int(allowed.sum()))
    masked = torch.where(allowed, avg, torch.full_like(avg, -1.0))
    vals, idx = masked.topk(k, dim=-1)  # (N, L, k)
    rows = [
        [
            [Attended(tokens[j], j, v) for v, j in zip(vals[n, i].tolist(), idx[n, i].tolist())]
            for n in range(avg.shape[0])
        ]
        for i in range(n_tok)
    ]
    all_notes = list(notes or [])
    if skip_special:
        all_notes.append("special tokens are left out of the rankings")
    return AllTokensReport(
        model, text, list(tokens), top_k, skip_special, weights.shape[0], weights.shape[1], rows,
        all_notes,
    )  # fmt: skip
