"""Models built from :mod:`attnkit.nn` layers. Pretrained ones load from local directories
(no download, no ``transformers`` at run time). Greedy and beam search for every generating
model live in :mod:`attnkit.models.decoding`."""

from attnkit.models.bert import BertConfig, BertInputs, BertModel, BertOutput
from attnkit.models.decoding import Stepper, beam_search, greedy_search
from attnkit.models.hub import default_model_path, resolve_model_path
from attnkit.models.lm import LMConfig, TransformerLM
from attnkit.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

__all__ = [
    "BertConfig",
    "BertInputs",
    "BertModel",
    "BertOutput",
    "LMConfig",
    "Seq2SeqConfig",
    "Seq2SeqTransformer",
    "Stepper",
    "TransformerLM",
    "beam_search",
    "default_model_path",
    "greedy_search",
    "resolve_model_path",
]
