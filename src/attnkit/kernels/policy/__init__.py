"""The NaN/inf/overflow policy, one stage of dispatch: the dot-product policy
(:mod:`.numerics`), the additive one (:mod:`.additive`), the input scan (:mod:`.scan` and its
numba kernels), a cache's kept key bounds (:mod:`.kv_bounds`), a mask's biases
(:mod:`.mask_bias`) and the float64 fallback's warning (:mod:`.precision`)."""
