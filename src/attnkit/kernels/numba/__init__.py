"""The numba runtime shared by every numba kernel: loading and caching (:mod:`.runtime`),
float32 math (:mod:`.nbmath`), raw memory access (:mod:`.memory`) and torch's OpenMP threads
(:mod:`.openmp`). (Inside attnkit, ``import numba`` still means the numba package: imports are
absolute.)"""
