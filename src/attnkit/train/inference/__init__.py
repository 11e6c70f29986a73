"""Using a trained model: held-out loss, exact match, perplexity and decoding (``metrics``),
BLEU/chrF/TER (``scoring``), a token stream's nats/token (``lm_eval``), text generation
(``lm_generate``) and a run's training items against an evaluation file (``overlap``). Above
:mod:`attnkit.train.data`; imports nothing from :mod:`attnkit.train.loop`."""
