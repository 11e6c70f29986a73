"""Parts shared by the encoder and decoder layers and stacks: argument checks (every error names
the argument the caller passed, before torch sees it), the feed-forward block, and the helpers
that copy ``torch.nn.Transformer*`` weights. Shape legend as in :mod:`attnkit.nn.transformer`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch.nn.functional as F
from torch import Tensor, nn

from attnkit import checks
from attnkit import tensor_checks as tc
from attnkit.functional import check_mask
from attnkit.nn.dropout import Dropout

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


def layer_args(
    d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, flags, device, dtype
) -> dict:
    """Every constructor argument of a layer checked (before torch sees any), normalised."""
    d_model = checks.positive_int("d_model", d_model)
    nhead = checks.positive_int("nhead", nhead)
    if d_model % nhead:
        raise ValueError(f"d_model: expected a multiple of nhead={nhead}, got {d_model}")
    return dict(
        d_model=d_model,
        nhead=nhead,
        dim_feedforward=checks.positive_int("dim_feedforward", dim_feedforward),
        dropout=checks.probability("dropout", dropout),
        activation=checks.choice("activation", activation, tuple(ACTIVATIONS)),
        layer_norm_eps=checks.positive_float("layer_norm_eps", layer_norm_eps),
        **{name: checks.flag(name, x) for name, x in flags.items()},
        device=tc.device("device", device),
        dtype=tc.float_dtype("dtype", dtype),
    )


@contextmanager
def renamed(**names: str) -> Iterator[None]:
    """Re-raise a ValueError/TypeError whose message starts with an inner argument name
    (``mask:``, ``key:``) under the name the user passed (``tgt_mask:``, ``memory:``)."""
    try:
        yield
    except (ValueError, TypeError) as e:
        m = re.match(r"(\w+):", str(e))
        if m is None or m.group(1) not in names:
            raise
        raise type(e)(names[m.group(1)] + str(e)[len(m.group(1)) :]) from None


def torch_activation(act: object) -> str:
    """The name of a torch layer's activation (a function, module or legacy string)."""
    if act is F.relu or isinstance(act, nn.ReLU) or act == "relu":
        return "relu"
    if act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none") or act == "gelu":
        return "gelu"
    raise ValueError(f"m: activation {act!r} is not supported (expected relu or gelu)")


def copy_linear(dst: nn.Linear, src: nn.Linear) -> None:
    dst.weight.copy_(src.weight)
    if src.bias is not None:
        dst.bias.copy_(src.bias)


def copy_norm(dst: nn.LayerNorm, src: nn.LayerNorm) -> None:
    if src.weight is not None:
        dst.weight.copy_(src.weight)
    if src.bias is not None:
        dst.bias.copy_(src.bias)


def layer_kwargs(m: nn.Module) -> dict:
    """Constructor arguments of an attnkit layer mirroring torch layer ``m``."""
    w = m.linear1.weight
    return dict(
        d_model=m.self_attn.embed_dim,
        nhead=m.self_attn.num_heads,
        dim_feedforward=m.linear1.out_features,
        dropout=m.dropout.p,
        activation=torch_activation(m.activation),
        layer_norm_eps=m.norm1.eps,
        batch_first=m.self_attn.batch_first,
        norm_first=m.norm_first,
        bias=m.linear1.bias is not None,
        device=w.device,
        dtype=w.dtype,
    )


def check_seq(name: str, x: object, d_model: int, batch_first: bool, ref: Tensor) -> Tensor:
    """``x`` (B, L, E) (or (L, B, E)) with E = d_model, the dtype and device of ``ref`` (the
    layer's parameters) and non-empty dims."""
    x = tc.tensor(name, x)
    layout = "(B, L, d_model)" if batch_first else "(L, B, d_model)"
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(
            f"{name}: expected shape {layout} with d_model={d_model}, got {tuple(x.shape)}"
        )
    tc.like(name, x, ref, "the layer's parameters")
    if 0 in x.shape:
        raise ValueError(f"{name}: expected non-empty dims {layout}, got {tuple(x.shape)}")
    return x


def batch_len(x: Tensor, batch_first: bool) -> tuple[int, int]:
    return (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])


def check_same_batch(name: str, x: Tensor, ref_name: str, ref: Tensor, batch_first: bool):
    b, b_ref = batch_len(x, batch_first)[0], batch_len(ref, batch_first)[0]
    if b != b_ref:
        raise ValueError(f"{name}: batch size {b} differs from {ref_name}'s {b_ref}")


def check_attn_mask(name: str, mask: object, b: int, h: int, lq: int, lk: int, ref: Tensor):
    """A self-/cross-attention mask against scores (B, H, Lq, Lk), as MultiHeadAttention
    accepts it (a 3-D tensor is ambiguous there), with the user's argument name."""
    if isinstance(mask, Tensor) and mask.dim() == 3:
        raise ValueError(
            f"{name}: a 3-D tensor {tuple(mask.shape)} is ambiguous against (B, H, Lq, Lk); "
            "give (Lq, Lk), (B, 1, Lq, Lk), or a per-batch mask as "
            "attnkit.masks.from_tensor(mask) (leading dim = B)"
        )
    check_mask(mask, (b, h), lq, lk, ref.device, name=name)


def clones(layer: nn.Module | Sequence[nn.Module], num_layers: int | None, kind: type) -> list:
    if isinstance(layer, kind):
        return [copy.deepcopy(layer) for _ in range(checks.positive_int("num_layers", num_layers))]
    if isinstance(layer, Sequence) and layer and all(isinstance(x, kind) for x in layer):
        if num_layers is not None and checks.positive_int("num_layers", num_layers) != len(layer):
            raise ValueError(f"num_layers: got {num_layers} for a list of {len(layer)} layers")
        return list(layer)
    raise TypeError(
        f"layers: expected a {kind.__name__} or a non-empty list of them, got {layer!r}"
    )


def check_norm(norm: object) -> nn.Module | None:
    if norm is not None and not isinstance(norm, nn.Module):
        raise TypeError(f"norm: expected a torch.nn.Module or None, got {type(norm).__name__}")
    return norm


class FeedForward(nn.Module):
    """Shared parts of both layer kinds: the position-wise feed-forward block."""

    def _init_ff(self, d_model, dim_feedforward, dropout, activation, bias, kw) -> None:
        self.linear1 = nn.Linear(d_model, dim_feedforward, bias=bias, **kw)
        self.dropout = Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model, bias=bias, **kw)
        self.activation = activation

    def check_src(self, name: str, x: object) -> Tensor:
        return check_seq(name, x, self.linear1.in_features, self.batch_first, self.linear1.weight)

    def _ff_block(self, x: Tensor) -> Tensor:
        """(B, L, E) -> (B, L, E): linear2(dropout(act(linear1(x))))."""
        return self.linear2(self.dropout(ACTIVATIONS[self.activation](self.linear1(x))))


def copy_final_norm(norm: nn.Module | None) -> nn.LayerNorm | None:
    if norm is None:
        return None
    if not isinstance(norm, nn.LayerNorm):
        raise ValueError(f"m: norm must be a LayerNorm or None, got {type(norm).__name__}")
    return copy.deepcopy(norm)
