"""Test-suite settings.

Unit tests run torch on one thread: their tensors are small, and on a shared 2-core machine
torch's thread pool makes each tiny op cost milliseconds. Benchmarks (subprocesses) are unaffected.

Dispatch and plans use the built-in tuning, never one ``attnkit tune`` stored on this machine
(``ATTNKIT_NO_TUNING``): tests that need another one inject it (``attnkit.kernels.tuning.use``).
"""

import os

import torch

os.environ["ATTNKIT_NO_TUNING"] = "1"

torch.set_num_threads(1)
