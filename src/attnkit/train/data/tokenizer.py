"""Tokenisers from the ``tokenizers`` library, trained on the training split and saved with a
checkpoint as ``tokenizer.json``.

Kinds: ``word`` (word level; lower-cased words and punctuation for text, the symbols themselves
for the synthetic tasks), ``char`` (one token per character) and ``bpe`` (byte-level BPE, which
decodes back to the exact text). Every kind keeps a newline as a token of its own (a language
model trained on a stream writes several lines); word-level output is detokenised (no space
before punctuation or around a newline: :func:`detokenize`). The special tokens come first,
with fixed ids: ``[PAD]`` = 0, ``[BOS]`` = 1, ``[EOS]`` = 2, ``[UNK]`` = 3.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

__all__ = [
    "BOS",
    "CHARACTERS",
    "EOS",
    "KINDS",
    "PAD",
    "SPECIALS",
    "UNK",
    "decode",
    "detokenize",
    "encode",
    "load",
    "never_generated",
    "characters",
    "train",
    "unknown_words",
]

KINDS = ("word", "char", "bpe")
SPECIALS = ["[PAD]", "[BOS]", "[EOS]", "[UNK]"]
PAD, BOS, EOS, UNK = range(4)
WORDS = Regex(r"\n|\w+|[^\w\s]+")
"""Word-level pieces: a newline, a run of word characters, or a run of punctuation
(``pre_tokenizers.Whitespace``'s pattern plus the newline)."""
_OPENING = ("(", "[", "{", "'", "\n")
CHARACTERS = "characters.txt"
"""Beside ``tokenizer.json`` in a checkpoint: every character of the tokenizer's training text
(issue 31), which defines an unknown word for byte-level BPE (:func:`unknown_words`)."""


def train(
    texts: Iterable[str], kind: str, vocab_size: int = 2000, symbols: bool = False
) -> Tokenizer:
    """A tokenizer of ``kind`` trained on ``texts``. ``symbols``: the texts are space-separated
    symbols (synthetic tasks): split on whitespace only, keep case. ``vocab_size`` bounds the
    BPE vocabulary (word and char keep every item seen)."""
    texts = list(texts)
    if kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=SPECIALS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    elif kind == "char":
        tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()
        trainer = trainers.WordLevelTrainer(special_tokens=SPECIALS, show_progress=False)
    elif kind == "word":
        tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
        if symbols:
            tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        else:
            tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
            tok.pre_tokenizer = pre_tokenizers.Split(WORDS, behavior="removed", invert=True)
        trainer = trainers.WordLevelTrainer(special_tokens=SPECIALS, show_progress=False)
    else:
        raise ValueError(f"tokenizer: expected one of {KINDS}, got {kind!r}")
    tok.train_from_iterator(texts, trainer=trainer)
    for i, name in enumerate(SPECIALS):
        if tok.token_to_id(name) != i:  # pragma: no cover - the trainers put specials first
            raise RuntimeError(f"tokenizer: special token {name} did not get id {i}")
    return tok


def load(path: str | Path) -> Tokenizer:
    """A tokenizer from ``tokenizer.json``; ValueError naming the file when it is not one."""
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises a plain Exception for bad JSON
        raise ValueError(f"{path}: not a valid tokenizer.json ({' '.join(str(e).split())})") from e


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` (no bos/eos)."""
    return tok.encode(text, add_special_tokens=False).ids


def decode(tok: Tokenizer, ids: Iterable[int]) -> str:
    """Text of ``ids``, stopping at the first eos; pad/bos are dropped."""
    keep = []
    for i in ids:
        i = int(i)
        if i == EOS:
            break
        if i not in (PAD, BOS):
            keep.append(i)
    if _is_word_text(tok):
        return detokenize([tok.id_to_token(i) or "[UNK]" for i in keep]).strip(" ")
    return tok.decode(keep, skip_special_tokens=False).strip(" ")


def _is_word_text(tok: Tokenizer) -> bool:
    """A word-level tokenizer of text (not of the synthetic tasks' symbols, nor char-level)."""
    return isinstance(tok.model, models.WordLevel) and tok.normalizer is not None


def detokenize(tokens: list[str]) -> str:
    """Word-level tokens joined as text: a space between two tokens, except before a token
    that starts with punctuation other than an opening bracket, after an opening bracket or an
    apostrophe, and on either side of a newline. ``["hi", ",", "king", "'", "s", "\\n", "x"]``
    -> ``"hi, king's\\nx"``."""
    out: list[str] = []
    for t in tokens:
        glue = (
            not out
            or t == "\n"
            or out[-1].endswith(_OPENING)
            or (not t[0].isalnum() and t[0] != "_" and t[0] not in '([{"')
        )
        out.append(t if glue else " " + t)
    return "".join(out)


def characters(texts: Iterable[str]) -> str:
    """Every character of ``texts`` once, sorted (what :data:`CHARACTERS` holds)."""
    seen: set[str] = set()
    for t in texts:
        seen.update(t)
    return "".join(sorted(seen))


def unknown_words(tok: Tokenizer, text: str, seen: str | None = None) -> list[str]:
    """The pieces of ``text`` (as written) the model never saw in training: words outside a
    word-level vocabulary and unseen characters of a char tokenizer (both read as [UNK]); for
    byte-level BPE, which reads any text, the runs of characters outside ``seen`` (the training
    text's characters, :func:`characters`; None: unknown, nothing reported)."""
    if isinstance(tok.model, models.BPE):
        if seen is None:
            return []
        known, runs, run = set(seen) | {" ", "\n"}, [], ""
        for ch in text + " ":
            if ch in known:
                runs, run = (runs + [run] if run else runs), ""
            else:
                run += ch
        return runs
    enc = tok.encode(text, add_special_tokens=False)
    return [text[a:b] for i, (a, b) in zip(enc.ids, enc.offsets) if i == UNK]


def never_generated(tok: Tokenizer) -> tuple[int, ...]:
    """Ids a model must never write with ``tok`` besides its own banned ids: ``[UNK]`` (a
    placeholder for input the tokenizer could not read, never text)."""
    unk = tok.token_to_id("[UNK]")
    return () if unk is None else (unk,)
