"""Bridges from attnkit to other libraries. Each bridge is its own module and imports its
library only when it is imported itself; nothing else in attnkit imports them.

- :mod:`attnkit.integrations.transformers`: ``attn_implementation="attnkit"`` for HuggingFace
  transformers models (needs the ``hf`` extra: ``pip install 'attnkit[hf]'``).
- :mod:`attnkit.integrations.hf_attention_weights`: any local transformers model's attention
  weights on a text, run with that attention (what ``attnkit view`` and ``explain --model``
  show); :mod:`attnkit.integrations.hf_attention_forward` is the attention function itself, as
  transformers calls it (registered by :mod:`~attnkit.integrations.transformers`).
"""
