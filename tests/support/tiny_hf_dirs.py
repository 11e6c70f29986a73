"""Tiny random transformers models saved to a directory with ``save_pretrained`` and a small
word-level tokenizer built with the ``tokenizers`` library: nothing downloaded. Plus the
reference: the same directory run by transformers with ``attn_implementation="eager"`` and
``output_attentions=True``.

    path = save_tiny("gpt2", tmp_path / "gpt2")
    ref = eager_attentions(path, TEXT)        # {"self": (N, H, L, L)} or encoder/decoder/cross
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers as tf
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

TEXT = "the animal didn't cross the street because it was too tired"
WORDS = sorted(set(TEXT.split()) | {"le", "chat", "fatigue", "rue", "il", "etait"})
VOCAB = 64  # every model's embedding rows (more than the tokenizer's ~30 entries)

# (special tokens in id order, template "$A" with specials, encoder-decoder start id)
_BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_BART_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
_T5_SPECIALS = ["<pad>", "</s>", "<unk>"]


def _tokenizer(specials: list[str], single: str, **names: str) -> tf.PreTrainedTokenizerFast:
    vocab = {t: i for i, t in enumerate(specials + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=names["unk_token"]))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if single != "$A":
        used = [t for t in specials if t in single.split()]
        tok.post_processor = processors.TemplateProcessing(
            single=single, special_tokens=[(t, vocab[t]) for t in used]
        )
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=48, **names)


_T5_NAMES = dict(eos_token="</s>", unk_token="<unk>", pad_token="<pad>")
_STYLES = {  # (special tokens in id order, the template around a text, their names)
    "bert": (
        _BERT_SPECIALS,
        "[CLS] $A [SEP]",
        dict(unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]")
        | dict(mask_token="[MASK]"),
    ),
    "bart": (
        _BART_SPECIALS,
        "<s> $A </s>",
        dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>")
        | dict(mask_token="<mask>"),
    ),
    "t5": (_T5_SPECIALS, "$A </s>", _T5_NAMES),
    "gpt": (_T5_SPECIALS, "$A", _T5_NAMES),
}


def tokenizer_of(style: str) -> tf.PreTrainedTokenizerFast:
    """A word-level tokenizer of one style: "bert", "bart", "t5" or "gpt"."""
    specials, single, names = _STYLES[style]
    return _tokenizer(specials, single, **names)


_SMALL = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _build(kind: str):
    """(model, tokenizer) of one kind, random weights, no dropout."""
    bert_like = dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=64, **_SMALL,
    )  # fmt: skip
    seq2seq = dict(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
        decoder_ffn_dim=48, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0,
    )  # fmt: skip
    if kind == "bert":
        return tf.BertForMaskedLM(tf.BertConfig(pad_token_id=0, **bert_like)), tokenizer_of("bert")
    if kind == "roberta":
        cfg = tf.RobertaConfig(pad_token_id=1, bos_token_id=0, eos_token_id=2, **bert_like)
        return tf.RobertaForMaskedLM(cfg), tokenizer_of("bart")
    if kind == "distilbert":
        cfg = tf.DistilBertConfig(
            vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=48,
            max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, pad_token_id=0,
        )  # fmt: skip
        return tf.DistilBertForMaskedLM(cfg), tokenizer_of("bert")
    if kind == "gpt2":
        cfg = tf.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=1, pad_token_id=0,
        )  # fmt: skip
        return tf.GPT2LMHeadModel(cfg), tokenizer_of("gpt")
    if kind == "llama":
        cfg = tf.LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            pad_token_id=0, bos_token_id=1, eos_token_id=1, attention_dropout=0.0,
        )  # fmt: skip
        return tf.LlamaForCausalLM(cfg), tokenizer_of("gpt")
    if kind == "bart":
        cfg = tf.BartConfig(
            pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
            forced_eos_token_id=None, **seq2seq,
        )  # fmt: skip
        return tf.BartForConditionalGeneration(cfg), tokenizer_of("bart")
    if kind == "marian":
        cfg = tf.MarianConfig(
            pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, forced_eos_token_id=None,
            **seq2seq,
        )  # fmt: skip
        return tf.MarianMTModel(cfg), tokenizer_of("t5")
    if kind == "t5":
        cfg = tf.T5Config(
            vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
            dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
        )  # fmt: skip
        return tf.T5ForConditionalGeneration(cfg), tokenizer_of("t5")
    raise ValueError(kind)


KINDS = ("bert", "roberta", "distilbert", "gpt2", "llama", "bart", "marian", "t5")
ENCODER_DECODERS = ("bart", "marian", "t5")


def save_tiny(kind: str, path: Path, seed: int = 0) -> Path:
    """Build a tiny random model of ``kind`` and save it with its tokenizer in ``path``."""
    torch.manual_seed(seed)
    model, tok = _build(kind)
    model.eval().save_pretrained(path)
    tok.save_pretrained(path)
    return path


def eager_attentions(path: Path, text: str, max_new_tokens: int = 64) -> dict[str, np.ndarray]:
    """transformers' own weights, float64 arrays: {"self": (N, H, L, L)}, or for an
    encoder-decoder {"encoder", "decoder", "cross"} on its greedy output, plus "output_ids"."""
    tf.utils.logging.set_verbosity_error()
    tf.utils.logging.disable_progress_bar()
    config = tf.AutoConfig.from_pretrained(path)
    tok = tf.AutoTokenizer.from_pretrained(path)
    enc = tok(text, return_tensors="pt")
    stack = lambda a: torch.stack([x[0] for x in a]).double().numpy()  # noqa: E731
    if config.is_encoder_decoder:
        model = tf.AutoModelForSeq2SeqLM.from_pretrained(path, attn_implementation="eager").eval()
        with torch.no_grad():
            seq = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1)
            out = model(**enc, decoder_input_ids=seq[:, :-1], output_attentions=True)
        return {
            "encoder": stack(out.encoder_attentions),
            "decoder": stack(out.decoder_attentions),
            "cross": stack(out.cross_attentions),
            "output_ids": seq[0].numpy(),
        }
    model = tf.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(**enc, output_attentions=True)
    return {"self": stack(out.attentions), "input_ids": enc["input_ids"][0].numpy()}
