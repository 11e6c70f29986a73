"""Models built from :mod:`attnkit.nn` layers. Pretrained ones load from local directories
(no download, no ``transformers`` at run time)."""

from attnkit.models.bert import BertConfig, BertInputs, BertModel, BertOutput
from attnkit.models.hub import default_model_path, resolve_model_path
from attnkit.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

__all__ = [
    "BertConfig",
    "BertInputs",
    "BertModel",
    "BertOutput",
    "Seq2SeqConfig",
    "Seq2SeqTransformer",
    "default_model_path",
    "resolve_model_path",
]
