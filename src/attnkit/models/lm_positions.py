"""How a :class:`~attnkit.models.lm.TransformerLM` puts positions into its token embeddings
(``LMConfig.positions``, ``attnkit train --positions``):

- ``"sinusoidal"`` (Vaswani et al., attnkit's default): ``embed(tokens) * sqrt(E)`` plus the
  fixed sinusoidal table (:class:`~attnkit.nn.positional.SinusoidalPositionalEncoding`), which
  extends itself to any length.
- ``"learned"`` (GPT-2 and nanoGPT's ``wpe``): ``embed(tokens)`` unscaled plus row t of a learned
  (max_len, E) table, initialised N(0, 0.02) like nanoGPT's (whose token embeddings are also
  N(0, 0.02): :class:`~attnkit.models.lm.TransformerLM` then initialises its embedding so). A
  position at or beyond ``max_len`` has no row: the model refuses it (ValueError naming the
  argument); ``attnkit generate`` crops the context to the last ``max_len`` tokens instead, as
  nanoGPT's ``generate`` does.

Then dropout, in both cases. Shapes: ``B`` batch, ``L`` positions, ``E`` d_model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnkit import checks
from attnkit.nn.dropout import Dropout
from attnkit.nn.positional import SinusoidalPositionalEncoding

__all__ = ["POSITIONS", "LMPositions"]

POSITIONS = ("sinusoidal", "learned")
"""The kinds of positions of a TransformerLM."""

LEARNED_STD = 0.02
"""Standard deviation of the initial learned positions and (then) token embeddings (nanoGPT)."""


class LMPositions(nn.Module):
    """Scale token embeddings and add positions (see the module docstring), then dropout.

    Args:
        kind: "sinusoidal" or "learned".
        max_len: rows of the table (learned: the most positions the model has; sinusoidal:
            rows built up front).
        d_model: E.
        dropout: probability, after the addition.
    """

    def __init__(self, kind: str, max_len: int, d_model: int, dropout: float) -> None:
        super().__init__()
        self.kind = checks.choice("positions", kind, POSITIONS)
        self.max_len = checks.positive_int("max_len", max_len)
        self.scale = math.sqrt(d_model) if kind == "sinusoidal" else 1.0
        self.dropout = Dropout(checks.probability("dropout", dropout))
        self.sinusoid: SinusoidalPositionalEncoding | None = None
        if kind == "learned":
            self.weight = nn.Parameter(torch.empty(max_len, d_model))
            nn.init.normal_(self.weight, std=LEARNED_STD)
        else:
            self.sinusoid = SinusoidalPositionalEncoding(d_model, max_len, 0.0)

    def check_fits(self, name: str, end: int, what: str) -> None:
        """ValueError naming ``name`` when positions up to ``end - 1`` do not fit a learned
        table; ``what`` says where those positions come from."""
        if self.kind == "learned" and end > self.max_len:
            raise ValueError(
                f"{name}: {what} reaches position {end - 1}, but the model's learned position "
                f"table has {self.max_len} positions (0..{self.max_len - 1}, the training window "
                f"--block-size); give at most {self.max_len} tokens, or crop the context to the "
                f"last {self.max_len} tokens as attnkit generate does"
            )

    def rows(self, length: int, offset: int, like: Tensor) -> Tensor:
        """Positions ``offset .. offset + length - 1``: (length, E) in ``like``'s dtype."""
        if self.sinusoid is not None:
            return self.sinusoid.table(length, offset, like=like)
        self.check_fits("tokens", offset + length, f"a sequence of {offset + length} tokens")
        return self.weight[offset : offset + length].to(like.dtype)

    def forward(self, emb: Tensor, offset: int = 0, position_ids: Tensor | None = None) -> Tensor:
        """Token embeddings emb (B, L, E) -> dropout(emb * scale + positions), (B, L, E); the
        positions are ``offset, offset + 1, ...`` or, given, ``position_ids`` (B, L) ints >= 0."""
        x = emb * self.scale if self.scale != 1.0 else emb
        if position_ids is None:
            return self.dropout(x + self.rows(x.shape[-2], offset, x))
        table = self.rows(int(position_ids.max()) + 1, 0, x)
        return self.dropout(x + table[position_ids])

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, max_len={self.max_len}"
