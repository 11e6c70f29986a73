"""The in-projection of :class:`~attnkit.nn.attention.MultiHeadAttention`: q, k and v
projections held as torch's ``nn.MultiheadAttention`` holds them.

Shape legend: ``E`` embed_dim (q's width and input), ``E_k`` / ``E_v`` key / value input widths,
``D`` = G d, the width of k and v (G key/value heads of width d; D = E without grouped heads).

- Packed (``E_k = E_v = E``): one ``weight`` (E + 2D, E), rows q | k | v. Self-attention
  projects with one product; cross-attention with two, (E, E) for the query and the packed
  (2D, E) for the memory (key is value); separate key and value inputs with three.
- Separate (``E_k`` or ``E_v`` differs from E): ``q_weight`` (E, E), ``k_weight`` (D, E_k),
  ``v_weight`` (D, E_v), as torch's ``q/k/v_proj_weight``.

``bias`` (E + 2D,) is packed in both. Initialisation is three ``nn.Linear``'s, block by block
(the same numbers for the same seed as the separate projections before).

Checkpoints written before the packed layout name the projections ``q_proj``, ``k_proj`` and
``v_proj`` (each an ``nn.Linear``): :func:`pack_legacy` maps those names to these and
:func:`unpack` the other way (for the transformers export and BERT's weight names).
"""

from __future__ import annotations

import math
from collections.abc import MutableMapping

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = ["LEGACY", "InProjection", "pack_legacy", "unpack"]

LEGACY = ("q_proj", "k_proj", "v_proj")
"""The separate projections' names before the packed in-projection."""
_SEPARATE = ("q_weight", "k_weight", "v_weight")


class InProjection(nn.Module):
    """q, k and v projections (module docstring): ``q(x)``, ``kv(x)``, ``qkv(x)``, ``k(x)``,
    ``v(x)`` on (..., width) inputs."""

    def __init__(
        self,
        embed_dim: int,
        kdim: int,
        vdim: int,
        kv_dim: int,
        bias: bool,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.embed_dim, self.kv_dim = embed_dim, kv_dim
        self.packed = kdim == vdim == embed_dim
        rows = embed_dim + 2 * kv_dim
        if self.packed:
            self.weight = nn.Parameter(torch.empty(rows, embed_dim, **kw))
            for name in _SEPARATE:
                self.register_parameter(name, None)
        else:
            self.register_parameter("weight", None)
            self.q_weight = nn.Parameter(torch.empty(embed_dim, embed_dim, **kw))
            self.k_weight = nn.Parameter(torch.empty(kv_dim, kdim, **kw))
            self.v_weight = nn.Parameter(torch.empty(kv_dim, vdim, **kw))
        self.bias = nn.Parameter(torch.empty(rows, **kw)) if bias else None
        self.reset_parameters()

    def weights(self) -> tuple[Tensor, Tensor, Tensor]:
        """(W_q (E, E), W_k (D, E_k), W_v (D, E_v)): views of the packed weight, or the
        separate weights."""
        if self.packed:
            return self.weight.split([self.embed_dim, self.kv_dim, self.kv_dim])  # type: ignore[return-value]
        return self.q_weight, self.k_weight, self.v_weight

    def biases(self) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """(b_q (E,), b_k (D,), b_v (D,)) views of the packed bias, or three None."""
        if self.bias is None:
            return None, None, None
        return self.bias.split([self.embed_dim, self.kv_dim, self.kv_dim])  # type: ignore[return-value]

    def reset_parameters(self) -> None:
        """Each block as ``nn.Linear`` initialises it, in q, k, v order (weight, then bias)."""
        with torch.no_grad():
            for w, b in zip(self.weights(), self.biases(), strict=True):
                nn.init.kaiming_uniform_(w, a=math.sqrt(5))
                if b is not None:
                    bound = 1 / math.sqrt(w.shape[1])
                    nn.init.uniform_(b, -bound, bound)

    def xavier_(self) -> None:
        """``nn.init.xavier_uniform_`` on each weight block (as on three separate weights)."""
        with torch.no_grad():
            for w in self.weights():
                nn.init.xavier_uniform_(w)

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention: (q (..., E), k (..., D), v (..., D)) of x (..., E), one product when
        packed."""
        if not self.packed:
            return self.q(x), self.k(x), self.v(x)
        out = F.linear(x, self.weight, self.bias)
        return out.split([self.embed_dim, self.kv_dim, self.kv_dim], dim=-1)  # type: ignore[return-value]

    def kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Key and value from one memory x (..., E_k): one (2D, E) product when packed."""
        if not self.packed:
            return self.k(x), self.v(x)
        e = self.embed_dim
        b = None if self.bias is None else self.bias[e:]
        out = F.linear(x, self.weight[e:], b)
        return out.split(self.kv_dim, dim=-1)  # type: ignore[return-value]

    def q(self, x: Tensor) -> Tensor:
        """q (..., E) of x (..., E)."""
        return self._part(x, 0)

    def k(self, x: Tensor) -> Tensor:
        """k (..., D) of x (..., E_k)."""
        return self._part(x, 1)

    def v(self, x: Tensor) -> Tensor:
        """v (..., D) of x (..., E_v)."""
        return self._part(x, 2)

    def _part(self, x: Tensor, i: int) -> Tensor:
        """x's product with block ``i`` (0 q, 1 k, 2 v) of the weights and bias (row slices)."""
        e, d = self.embed_dim, self.kv_dim
        start, n = (0, e) if i == 0 else (e + (i - 1) * d, d)
        b = None if self.bias is None else self.bias[start : start + n]
        w = self.weight[start : start + n] if self.packed else self.weights()[i]
        return F.linear(x, w, b)

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, kv_dim={self.kv_dim}, packed={self.packed}"


def pack_legacy(state: MutableMapping[str, Tensor], prefix: str = "") -> None:
    """Rename, in place, old separate projections (``<p>q_proj.weight``, ``<p>k_proj.bias``,
    ...) under ``prefix`` to the in-projection's names: ``<p>in_proj.weight`` (the three
    stacked) when the three weights have one input width, else ``<p>in_proj.q_weight``,
    ``k_weight``, ``v_weight``; the biases stacked into ``<p>in_proj.bias``. Any tensors
    (meta tensors too: shapes only). Prefixes holding only some of the three are left alone."""
    starts = [
        k[: -len("q_proj.weight")]
        for k in state
        if k.startswith(prefix) and (k == prefix + "q_proj.weight" or k.endswith(".q_proj.weight"))
    ]
    for p in starts:
        names = [f"{p}{n}.weight" for n in LEGACY]
        if not all(n in state for n in names):
            continue
        ws = [state.pop(n) for n in names]
        if len({w.shape[1] for w in ws}) == 1:
            state[p + "in_proj.weight"] = torch.cat(ws)
        else:
            for name, w in zip(_SEPARATE, ws, strict=True):
                state[f"{p}in_proj.{name}"] = w
        bias_names = [f"{p}{n}.bias" for n in LEGACY]
        if all(n in state for n in bias_names):
            state[p + "in_proj.bias"] = torch.cat([state.pop(n) for n in bias_names])


def unpack(state: MutableMapping[str, Tensor]) -> dict[str, Tensor]:
    """``state`` with every in-projection under the old separate names (``<p>q_proj.weight``,
    ``<p>k_proj.bias``, ...; views of the packed tensors, in the order of ``state``): what
    exporters and weight renamings that name q, k and v separately read."""
    out: dict[str, Tensor] = {}
    for key, t in state.items():
        p, _, name = key.rpartition("in_proj.")
        if not name or "." in name or (p and not p.endswith(".")):
            out[key] = t
        elif name == "weight":
            e = t.shape[1]
            d = (t.shape[0] - e) // 2
            for old, w in zip(LEGACY, t.split([e, d, d]), strict=True):
                out[f"{p}{old}.weight"] = w
        elif name in _SEPARATE:
            out[f"{p}{LEGACY[_SEPARATE.index(name)]}.weight"] = t
        elif name == "bias":
            e = _q_rows(state, p)
            d = (t.shape[0] - e) // 2
            for old, b in zip(LEGACY, t.split([e, d, d]), strict=True):
                out[f"{p}{old}.bias"] = b
        else:
            out[key] = t
    return out


def _q_rows(state: MutableMapping[str, Tensor], p: str) -> int:
    """E, the query rows of the in-projection under prefix ``p``."""
    packed = state.get(p + "in_proj.weight")
    return packed.shape[1] if packed is not None else state[p + "in_proj.q_weight"].shape[0]
