"""``attnkit.nn.Dropout`` (nn/dropout.py) and the layers' dropouts in training mode.

The module: an ``nn.Dropout`` whose training pass is attnkit's kernel (its keep mask regenerated
by the NumPy reference of tests/kernels/dropout), identity in eval mode, torch's own dropout
where the kernel does not serve. The layers: a training step of attnkit's encoder and decoder
layers (pre- and post-norm, odd sizes) against ``torch.nn.TransformerEncoderLayer`` /
``TransformerDecoderLayer`` holding the same weights, whose dropout modules replay the masks
attnkit's drew (attention-weight dropout 0: that one is the attention backend's), float64:
outputs and every gradient.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit.kernels.dropout import elementwise as ew
from attnkit.nn import (
    Dropout,
    MultiHeadAttention,
    TransformerDecoderLayer,
    TransformerEncoderLayer,
)
from attnkit.nn.positional import SinusoidalPositionalEncoding
from tests.kernels.dropout.test_elementwise import expected, keep_ref
from tests.support.numerics import max_rel_err

F64_TOL = 1e-10


def test_module_is_a_torch_dropout_with_the_kernels_training_pass() -> None:
    m = Dropout(0.3)
    assert isinstance(m, nn.Dropout) and m.p == 0.3
    x = torch.randn(5, 4099, dtype=torch.float64)
    torch.manual_seed(4)
    seed = ew.draw_seed()
    torch.manual_seed(4)
    y = m(x)
    want = expected(x, keep_ref(seed, x.numel(), 0.3), 0.3)
    assert max_rel_err(y, torch.from_numpy(want)) < F64_TOL
    m.eval()
    assert m(x) is x


def test_inplace_and_unserved_inputs_take_torchs_dropout() -> None:
    x = torch.randn(300, 200).t()  # not contiguous
    torch.manual_seed(2)
    got = Dropout(0.2)(x)
    torch.manual_seed(2)
    assert torch.equal(got, nn.functional.dropout(x, 0.2, training=True))
    y = torch.randn(20_000)
    torch.manual_seed(2)
    got = Dropout(0.2, inplace=True)(y.clone())
    torch.manual_seed(2)
    assert torch.equal(got, nn.functional.dropout(y.clone(), 0.2, training=True))


def test_the_layers_and_positions_hold_attnkits_dropout() -> None:
    enc = TransformerEncoderLayer(16, 2, 32)
    dec = TransformerDecoderLayer(16, 2, 32)
    pos = SinusoidalPositionalEncoding(16, 8, 0.1)
    found = [m for mod in (enc, dec, pos) for m in mod.modules() if isinstance(m, nn.Dropout)]
    assert len(found) == 3 + 4 + 1
    assert all(type(m) is Dropout for m in found)


class Replay(nn.Module):
    """Applies the recorded factors (x * m), in the order they were drawn."""

    def __init__(self, factors: list[torch.Tensor]) -> None:
        super().__init__()
        self.factors = factors

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factors.pop(0)


def _record(layer: nn.Module, p: float) -> tuple[list[torch.Tensor], list]:
    """Forward hooks on the layer's Dropout modules: each call's factor (1/(1-p) or 0)."""
    factors: list[torch.Tensor] = []

    def hook(_m, inputs, out) -> None:
        (x,) = inputs
        assert ew.served(x, p), "the test's sizes must reach the kernel"
        kept = (out != 0) | (x == 0)
        factors.append(kept.to(x.dtype) / (1 - p))

    hooks = [m.register_forward_hook(hook) for m in layer.modules() if isinstance(m, Dropout)]
    return factors, hooks


def _compare(ours: nn.Module, theirs: nn.Module, args: tuple, names: tuple[str, ...]) -> None:
    p = ours.dropout.p
    factors, hooks = _record(ours, p)
    torch.manual_seed(0)
    ins = [a.clone().requires_grad_() for a in args]
    out = ours(*ins)
    for h in hooks:
        h.remove()
    replay = Replay(list(factors))  # torch's layer calls its dropouts in the same order
    for name in names:
        setattr(theirs, name, replay)
    tins = [a.clone().requires_grad_() for a in args]
    ref = theirs(*tins)
    assert not replay.factors, "every recorded mask replayed"
    assert max_rel_err(out, ref) < F64_TOL
    dy = torch.randn_like(out)
    got = torch.autograd.grad(out, ins + list(ours.parameters()), dy)
    want = torch.autograd.grad(ref, tins + [q for _, q in _torch_params(ours, theirs)], dy)
    for g, w in zip(got, want, strict=True):
        assert max_rel_err(g, w) < F64_TOL


def _torch_params(ours: nn.Module, theirs: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """torch's parameters in the order of ours (in-projections packed alike)."""
    tp = dict(theirs.named_parameters())
    out = []
    for name, _ in ours.named_parameters():
        tname = name.replace("in_proj.weight", "in_proj_weight").replace(
            "in_proj.bias", "in_proj_bias"
        )
        out.append((tname, tp[tname]))
    return out


CASES = {
    # torch's class, attnkit's, d_ff, p, input shapes (odd; >= MIN_ELEMENTS), dropout call order
    "encoder": (
        nn.TransformerEncoderLayer,
        TransformerEncoderLayer,
        72,
        0.2,
        [(3, 119, 24)],
        ("dropout1", "dropout", "dropout2"),
    ),
    "decoder": (
        nn.TransformerDecoderLayer,
        TransformerDecoderLayer,
        48,
        0.15,
        [(2, 181, 24), (2, 13, 24)],
        ("dropout1", "dropout2", "dropout", "dropout3"),
    ),
}


@pytest.mark.parametrize("kind", list(CASES))
@pytest.mark.parametrize("norm_first", [False, True])
def test_layer_training_step_equals_torchs_with_the_same_masks(kind, norm_first) -> None:
    torch_cls, ours_cls, d_ff, p, shapes, names = CASES[kind]
    torch.manual_seed(len(shapes))
    t = torch_cls(24, 3, d_ff, p, batch_first=True, norm_first=norm_first, dtype=torch.float64)
    ours = ours_cls.from_torch(t)
    for layer in (t, ours):  # the attention weights' dropout is the backend's, not tested here
        for m in layer.modules():
            if isinstance(m, (nn.MultiheadAttention, MultiHeadAttention)):
                m.dropout = 0.0
        layer.train()
    args = tuple(torch.randn(s, dtype=torch.float64) for s in shapes)
    _compare(ours, t, args, names)
