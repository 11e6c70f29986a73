"""Test-suite settings.

Unit tests run torch on one thread: their tensors are small, and on a shared 2-core machine
torch's thread pool makes each tiny op cost milliseconds. Benchmarks (subprocesses) are unaffected.
"""

import torch

torch.set_num_threads(1)
