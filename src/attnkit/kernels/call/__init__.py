"""The call record: what every backend sees of one attention call (:mod:`.base`:
``AttentionCall``, the ``Backend`` interface) and what the call's stages hand each other
(:mod:`.memo`). The bottom of ``kernels``: it imports masks, never the policy or a backend."""
