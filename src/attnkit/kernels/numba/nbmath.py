"""float32 ``tanh`` and ``exp`` for numba kernels, written so that LLVM vectorises them.

The pip build of numba has no vector math library: ``math.tanh`` / ``math.exp`` inside a loop
become one scalar libm call per element. These approximations are plain float32 arithmetic
(polynomials, one division, a bit cast), so a loop over them compiles to SIMD code.

- :func:`tanh_f32`: Eigen's [13/6] rational approximation on |x| <= 7.9053111 (beyond that
  tanh(x) rounds to +-1 in float32). Max relative error 3.2e-7 (about 5 ulp) against float64.
- :func:`exp_nonpos_f32`: Cephes-style ``expf`` for x <= 0: x = n ln2 + r, a degree-6
  polynomial for e^r and 2^n built from the exponent bits. Max relative error 3e-7 on
  [-87, 0]; arguments below -87 return exp(-87) ~ 1.6e-38 (no denormals, never 0).

Every constant is ``np.float32``: a Python float literal would promote the arithmetic to float64
and halve the SIMD width. Compiled with ``fastmath`` and ``error_model="numpy"`` (the default
"python" error model checks every division for zero, which blocks vectorisation).

This module imports numba at import time; kernel modules import it, and the rest of attnkit
reaches them only through :func:`attnkit.kernels.numba.runtime.load_kernels`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from attnkit.kernels.numba.memory import bits_to_f32

__all__ = ["exp_nonpos_f32", "tanh_f32"]

f32 = np.float32
JIT_OPTIONS = dict(forceinline=True, fastmath=True, error_model="numpy")

# tanh(x) ~ x * P(x^2) / Q(x^2) (Eigen, ptanh_float)
_T1 = f32(4.89352455891786e-03)
_T3 = f32(6.37261928875436e-04)
_T5 = f32(1.48572235717979e-05)
_T7 = f32(5.12229709037114e-08)
_T9 = f32(-8.60467152213735e-11)
_T11 = f32(2.00018790482477e-13)
_T13 = f32(-2.76076847742355e-16)
_Q0 = f32(4.89352518554385e-03)
_Q2 = f32(2.26843463243900e-03)
_Q4 = f32(1.18534705686654e-04)
_Q6 = f32(1.19825839466702e-06)
_TANH_CLAMP = f32(7.90531110763549805)


@njit(**JIT_OPTIONS)
def tanh_f32(x):
    """tanh(x) for a float32 scalar (relative error <= 3.2e-7)."""
    x = min(max(x, -_TANH_CLAMP), _TANH_CLAMP)
    x2 = x * x
    p = x2 * _T13 + _T11
    p = p * x2 + _T9
    p = p * x2 + _T7
    p = p * x2 + _T5
    p = p * x2 + _T3
    p = p * x2 + _T1
    p = p * x
    q = x2 * _Q6 + _Q4
    q = q * x2 + _Q2
    q = q * x2 + _Q0
    return p / q


_LOG2E = f32(1.44269504088896341)
_LN2_HI = f32(0.693359375)
_LN2_LO = f32(-2.12194440e-4)
_EXP_LO = f32(-87.0)
_E0 = f32(1.9875691500e-4)
_E1 = f32(1.3981999507e-3)
_E2 = f32(8.3334519073e-3)
_E3 = f32(4.1665795894e-2)
_E4 = f32(1.6666665459e-1)
_E5 = f32(5.0000001201e-1)
_HALF = f32(0.5)
_ONE = f32(1.0)


@njit(**JIT_OPTIONS)
def exp_nonpos_f32(x):
    """exp(x) for a float32 scalar x <= 0 (relative error <= 3e-7; x < -87 gives exp(-87)).

    Small positive arguments (below ~0.3, e.g. rounding noise) are still accurate."""
    x = max(x, _EXP_LO)
    n = np.int32(x * _LOG2E - _HALF)  # round to nearest for x <= 0 (int32() truncates)
    fn = np.float32(n)
    r = x - fn * _LN2_HI
    r = r - fn * _LN2_LO
    p = r * _E0 + _E1
    p = p * r + _E2
    p = p * r + _E3
    p = p * r + _E4
    p = p * r + _E5
    y = p * (r * r) + r + _ONE
    return y * bits_to_f32((n + np.int32(127)) << np.int32(23))
