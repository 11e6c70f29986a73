"""Training data: files and synthetic tasks (``sources``), tokenisers (``tokenizer``), a
config's ids and model (``tasks``), lm token streams (``stream``), packed rows (``packing``)
and length-bucketed batches (``batches``). Below :mod:`attnkit.train.inference` and
:mod:`attnkit.train.loop`; imports nothing from them."""
