"""The ``flex`` backend: attention on torch's FlexAttention, its ``BlockMask`` built from
attnkit's exact block maps, its ``mask_mod`` / ``score_mod`` translated from the mask objects.

- :mod:`.mods` — masks, biases and softcap as Flex ``mask_mod`` / ``score_mod``.
- :mod:`.block_classes` — exact block classes on the call's device (no host sync).
- :mod:`.block_eval` — the ``mask_mod`` evaluated on blocks (exact refinement of ``&`` / ``|``).
- :mod:`.block_mask` — block classes to a ``BlockMask`` (``BlockMask.from_kv_blocks``).
- :mod:`.engine` — plans (cached per mask and shape), the compiled kernel, sinks.
- :mod:`.backend` — :class:`FlexBackend`, what dispatch sees.
"""

from attnkit.kernels.flex.backend import FlexBackend, FlexMemoKey
from attnkit.kernels.flex.engine import FlexPlan, FlexPlanKey, attend, plan_for

__all__ = ["FlexBackend", "FlexMemoKey", "FlexPlan", "FlexPlanKey", "attend", "plan_for"]
