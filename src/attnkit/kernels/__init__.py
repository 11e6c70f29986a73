"""Attention backends and how one is chosen for a call, grouped by concern.

- ``call/``: the call record every backend sees (``AttentionCall``, its memo, the layout its
  input scan reads) and the ``Backend`` interface;
- ``policy/``: the NaN/inf/overflow policy, one stage of dispatch;
- ``numba/``: the numba runtime the fused kernels share;
- ``tuning/``: the machine-dependent constants in use, their store and ``attnkit tune``'s rules;
- the backends, each standing alone: ``dense``, ``math``, ``blocksparse/``, ``decode/``,
  ``additive/`` (``additive_fused``, ``additive_chunked``), ``flex/``;
- ``dropout/``: the layers' element-wise dropout (``attnkit.nn.Dropout``; no attention backend);
- ``registry`` (``BACKENDS``: name -> backend instance) and ``dispatch`` (the preference order,
  ``preference(kind)``, the choice of backend and the policy stage around it) on top.

The names below are imported on first use: importing a mask, the functional API or one kernels
module does not load every backend.
"""

from __future__ import annotations

from attnkit.lazy import lazy_exports

__all__ = ["BACKENDS", "AttentionCall", "Backend", "preference"]

__getattr__ = lazy_exports(
    __name__,
    {
        "BACKENDS": "attnkit.kernels.registry",
        "AttentionCall": "attnkit.kernels.call.base",
        "Backend": "attnkit.kernels.call.backend",
        "preference": "attnkit.kernels.dispatch",
    },
)
