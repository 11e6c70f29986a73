"""Float64 NumPy gradients of the reference's attention, for checking every backend's backward.

Each function takes the forward :mod:`attnkit.reference` trace and the cotangents of the
outputs (``d_out`` for the output, ``d_weights`` for the weights when a test also returns them)
and gives the gradient of ``sum(out * d_out) + sum(weights * d_weights)`` with respect to every
input, by the chain rule written out:

    dV = Wᵀ dO;  dW = dO Vᵀ + d_weights;  dS = W ⊙ (dW - rowsum(dW ⊙ W))

``dS`` is the gradient of the masked scores, which is also the gradient of any additive bias
(reduce it to the bias's shape with :func:`tests.support.masks.reduce_grad`); rows without any
allowed key have W = 0, hence dS = 0 and no gradient (P1).
"""

from __future__ import annotations

import numpy as np


def _t(a: np.ndarray) -> np.ndarray:
    return np.swapaxes(a, -1, -2)


def _sum_batch(a: np.ndarray) -> np.ndarray:
    """Sum a (..., m, n) array over its batch dims: (m, n)."""
    return a.reshape((-1,) + a.shape[-2:]).sum(0)


def softmax_backward(trace, d_out, d_weights=None) -> tuple[np.ndarray, np.ndarray]:
    """(dS (..., Lq, Lk), dV (..., Lk, dv)) for output = softmax(S) @ V.

    dW_ij - sum_l W_il dW_il cancels where W_ij is close to 1 (a nearly one-hot row); there it
    is computed as sum_l W_il (dW_ij - dW_il), whose l = j term is exactly 0, so the reference
    keeps full precision where the usual formula loses eps / (1 - W_ij) of it."""
    w = trace.weights
    dw = d_out @ _t(trace.v)
    if d_weights is not None:
        dw = dw + d_weights
    centred = dw - (dw * w).sum(-1, keepdims=True)
    top = w.argmax(-1)[..., None]  # (..., Lq, 1) the largest weight of each row
    dw_top = np.take_along_axis(dw, top, -1)
    exact_top = (w * (dw_top - dw)).sum(-1, keepdims=True)
    np.put_along_axis(centred, top, exact_top, -1)
    return w * centred, _t(w) @ d_out


def dot(trace, d_out, d_weights=None) -> dict[str, np.ndarray]:
    """Scaled / unscaled dot product: gradients of q, k, v and of the full bias ("bias")."""
    ds, dv = softmax_backward(trace, d_out, d_weights)
    s = trace.scale
    return {"q": s * ds @ trace.k, "k": s * _t(ds) @ trace.q, "v": dv, "bias": ds}


def general(trace, w, d_out, d_weights=None) -> dict[str, np.ndarray]:
    """Luong general attention (scores = (q W) kᵀ): gradients of q, k, v, w and the bias."""
    ds, dv = softmax_backward(trace, d_out, d_weights)
    dqw = ds @ trace.k
    return {
        "q": dqw @ _t(w),
        "k": _t(ds) @ trace.q_w,
        "v": dv,
        "w": _sum_batch(_t(trace.q) @ dqw),
        "bias": ds,
    }


def additive(trace, w_q, w_k, w_v, d_out, d_weights=None) -> dict[str, np.ndarray]:
    """Additive attention (e_ij = w_v . tanh(W_q q_i + W_k k_j)): gradients of q, k, v, w_q,
    w_k, w_v and the bias."""
    ds, dv = softmax_backward(trace, d_out, d_weights)
    hid = trace.hidden  # (..., Lq, Lk, h)
    # 1 - tanh² from the pre-activation: 1 - hid² keeps few bits once tanh is near +-1 (|x| = 15:
    # relative error 6e-4 in float64; 0 instead of 4e-18 at |x| = 21)
    pre = trace.q_proj[..., :, None, :] + trace.k_proj[..., None, :, :]
    with np.errstate(over="ignore"):
        sech2 = 1.0 / np.cosh(pre) ** 2  # cosh overflows to inf beyond |x| = 710: sech² = 0
    dpre = ds[..., None] * w_v * sech2
    da, db = dpre.sum(-2), dpre.sum(-3)  # (..., Lq, h), (..., Lk, h)
    return {
        "q": da @ w_q,
        "k": db @ w_k,
        "v": dv,
        "w_q": _sum_batch(_t(da) @ trace.q),
        "w_k": _sum_batch(_t(db) @ trace.k),
        "w_v": (ds[..., None] * hid).reshape(-1, hid.shape[-1]).sum(0),
        "bias": ds,
    }


def multi_head(trace, xq, xkv, w, groups: int, d_out, d_weights=None) -> dict[str, np.ndarray]:
    """Multi-head attention whose reference ran on inputs with a column of ones appended
    (``xq``, ``xkv``: (B, L, E+1)) and stacked weights in X @ W layout with the biases as the
    last row (``w["q"]`` (Eq+1, H*dk), ``w["k"]``/``w["v"]`` (Ekv+1, H*d) with every key/value
    head repeated for the query heads of its group, ``w["o"]`` (H*dv, E_out)).

    Returns gradients in ``torch.nn.Linear`` layout: "query", "key_value" (key is value), "w_q",
    "w_k", "w_v" (out, in), "b_q", "b_k", "b_v", "w_o", "b_o", and "bias" (B, H, Lq, Lk).
    """
    heads = trace.heads
    h = len(heads)
    dk, dv = heads[0].q.shape[-1], heads[0].v.shape[-1]
    d_concat = d_out @ _t(w["o"])
    g = {"xq": np.zeros_like(xq), "xkv": np.zeros_like(xkv)}
    for n in "qkv":
        g[n] = np.zeros_like(w[n])
    bias = []
    for i, t in enumerate(heads):
        dw_i = None if d_weights is None else d_weights[:, i]
        ds, dv_i = softmax_backward(t, d_concat[..., i * dv : (i + 1) * dv], dw_i)
        bias.append(ds)
        parts = {"q": t.scale * ds @ t.k, "k": t.scale * _t(ds) @ t.q, "v": dv_i}
        for n, d in parts.items():
            cols = slice(i * d.shape[-1], (i + 1) * d.shape[-1])
            x = xq if n == "q" else xkv
            g["xq" if n == "q" else "xkv"] += d @ _t(w[n][:, cols])
            g[n][:, cols] += _sum_batch(_t(x) @ d)
    out = {"query": g["xq"][..., :-1], "key_value": g["xkv"][..., :-1]}
    for n, width in (("q", dk), ("k", dk), ("v", dv)):
        m = g[n]
        if n != "q":  # fold the repeated heads of each group back onto their key/value head
            m = m.reshape(m.shape[0], groups, h // groups, width).sum(2).reshape(m.shape[0], -1)
        out[f"w_{n}"], out[f"b_{n}"] = _t(m[:-1]), m[-1]
    out["w_o"] = _t(_sum_batch(_t(trace.concat) @ d_out))
    out["b_o"] = d_out.reshape(-1, d_out.shape[-1]).sum(0)
    out["bias"] = np.stack(bias, axis=1)
    return out
