"""The training loop: the run (``trainer``), one optimiser step and one evaluation (``steps``),
AdamW and its schedule (``optim``, ``schedule``), checkpoints (``checkpoint``, ``session``,
``state``, ``legacy_state``, ``best``), reporting (``progress``), signals (``interrupt``),
several processes (``distributed``) and mixed precision (``precision``). The top of
:mod:`attnkit.train`."""
