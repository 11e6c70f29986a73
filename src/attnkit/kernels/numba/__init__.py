"""The numba runtime shared by every numba kernel: loading and caching (:mod:`.runtime`),
float32 math (:mod:`.nbmath`), raw memory access (:mod:`.memory`), torch's OpenMP threads
(:mod:`.openmp`) and the team size on a contended machine (:mod:`.contention`). (Inside
attnkit, ``import numba`` still means the numba package: imports are absolute.)"""
