"""Reading HuggingFace-layout model directories, with ``safetensors`` and ``tokenizers`` only
(no ``transformers``, no pickle, no download). The model itself is in :mod:`attnkit.models.bert`.

Files read:

- ``config.json`` (:func:`read_json_object`; the model's config class validates the values).
- ``model.safetensors``: the header (tensor names, shapes, dtypes) is read and checked first
  (:func:`read_header`, :func:`check_layer_count`, :func:`match_weights`), before any model is
  built or any tensor loaded; then the tensors are loaded one by one and checked for NaN / inf
  (:func:`load_weights`). HuggingFace ``BertModel`` names are renamed to attnkit's
  (:func:`rename`; an optional ``bert.`` prefix is accepted; the pooler, MLM heads and
  ``position_ids`` are ignored).
- ``tokenizer.json``, or else ``vocab.txt`` (+ ``tokenizer_config.json`` for lower-casing)
  (:func:`load_tokenizer`).
- sentence-transformers files: ``modules.json``, the pooling module's ``config.json``,
  ``sentence_bert_config.json`` (:class:`SentencePooling`).

Every problem with a file's *content* raises ``ValueError`` naming the file (and the key or
tensor); a missing file raises ``FileNotFoundError`` naming it; a directory where a file should
be raises ``ValueError``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from torch import Tensor

__all__ = [
    "FLOAT_DTYPES",
    "SentencePooling",
    "check_layer_count",
    "first",
    "load_tokenizer",
    "load_weights",
    "match_weights",
    "check_shapes",
    "read_header",
    "read_json",
    "read_json_object",
    "read_text",
    "rename",
    "require_file",
]

MAX_TEXT_BYTES = 64 * 2**20
"""Largest JSON / vocabulary file read (64 MiB; the biggest real tokenizer.json is ~20 MiB)."""

FLOAT_DTYPES = {
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
}
"""safetensors dtype names accepted for weights, and their torch dtypes."""

Header = dict[str, tuple[tuple[int, ...], str]]
"""A safetensors header: tensor name -> (shape, safetensors dtype name)."""


def first(items: Sequence[str], n: int = 5) -> str:
    """The first ``n`` items joined by ", ", with the total when some are left out."""
    more = f", ... ({len(items)} in all)" if len(items) > n else ""
    return ", ".join(items[:n]) + more


# ---------------------------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------------------------
def require_file(path: Path) -> Path:
    """``path`` if it is a regular file; FileNotFoundError if absent, ValueError otherwise."""
    if path.is_file():
        return path
    if path.is_dir():
        raise ValueError(f"{path}: is a directory, expected a file")
    if path.exists():
        raise ValueError(f"{path}: is not a regular file")
    raise FileNotFoundError(f"{path}: file not found")


def read_text(path: Path) -> str:
    """The UTF-8 text of file ``path`` (ValueError naming the file and the line otherwise)."""
    require_file(path)
    with path.open("rb") as f:
        data = f.read(MAX_TEXT_BYTES + 1)
    if len(data) > MAX_TEXT_BYTES:
        raise ValueError(f"{path}: larger than {MAX_TEXT_BYTES // 2**20} MiB; not a model file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(
            f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}, line {line})"
        ) from None


def read_json(path: Path) -> object:
    """The JSON value in file ``path``."""
    text = read_text(path)
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def read_json_object(path: Path) -> dict:
    """The JSON object (dict) in file ``path``."""
    value = read_json(path)
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got a JSON {type(value).__name__}")
    return value


# ---------------------------------------------------------------------------------------------
# sentence-transformers files
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SentencePooling:
    """How sentence-transformers turns token states into a sentence embedding.

    ``mode`` is "mean" (average over non-padding tokens); ``normalize`` says whether the
    embedding is L2-normalised; ``max_seq_length`` is the truncation length in tokens.
    ``unsupported`` lists modules of ``modules.json`` this encoder cannot run (``embed`` then
    refuses, the encoder itself still works)."""

    mode: str = "mean"
    normalize: bool = False
    max_seq_length: int = 512
    unsupported: tuple[str, ...] = ()

    @classmethod
    def from_dir(cls, path: Path, max_positions: int) -> SentencePooling:
        """Read ``modules.json``, the pooling config and ``sentence_bert_config.json`` under
        ``path``; without ``modules.json``: mean pooling, no normalisation."""
        max_len = max_positions
        sbert = path / "sentence_bert_config.json"
        if sbert.exists():
            n = read_json_object(sbert).get("max_seq_length")
            if n is not None:
                if not isinstance(n, int) or isinstance(n, bool) or n < 2:
                    raise ValueError(f"{sbert}: max_seq_length: expected an int >= 2, got {n!r}")
                max_len = min(n, max_positions)
        modules_file = path / "modules.json"
        if not modules_file.exists():
            return cls(max_seq_length=max_len)
        modules = read_json(modules_file)
        if not isinstance(modules, list):
            raise ValueError(f"{modules_file}: expected a JSON list of modules")
        mode, normalize, unsupported = "mean", False, []
        for m in modules:
            kind = str(m.get("type", "")) if isinstance(m, dict) else ""
            short = kind.rsplit(".", 1)[-1]
            if short == "Transformer":
                continue
            if short == "Normalize":
                normalize = True
            elif short == "Pooling":
                pool_file = _inside(path, str(m.get("path", "")), modules_file) / "config.json"
                mode = cls._pooling_mode(read_json_object(pool_file))
            else:
                unsupported.append(kind or repr(m)[:60])
        return cls(mode, normalize, max_len, tuple(unsupported))

    @staticmethod
    def _pooling_mode(cfg: dict) -> str:
        if "pooling_mode" in cfg:
            modes = [cfg["pooling_mode"]]
        else:
            modes = [
                k[len("pooling_mode_") :]
                for k, v in cfg.items()
                if k.startswith("pooling_mode_") and v
            ]
        if modes not in (["mean"], ["mean_tokens"]):
            return f"unsupported:{'+'.join(map(str, modes)) or 'none'}"
        return "mean"


def _inside(root: Path, sub: str, source: Path) -> Path:
    """``root / sub``, refusing an absolute ``sub`` or one that climbs out with "..".
    (Symbolic links inside ``root`` are followed: a linked copy of a model is fine.)"""
    parts = Path(sub).parts
    if Path(sub).is_absolute() or ".." in parts:
        raise ValueError(f"{source}: module path {sub!r} leads outside {root}")
    return root / sub


# ---------------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------------
_PROBE = "Hello, world! naïve 東京 ☃ \u0000 x"  # a smoke test: every tokenizer must encode this


def _wordpiece_from_vocab(vocab_file: Path, cfg_file: Path) -> Tokenizer:
    """A BERT WordPiece tokenizer from ``vocab.txt`` (one token per line, id = line number)."""
    vocab: dict[str, int] = {}
    for i, line in enumerate(read_text(vocab_file).splitlines()):
        vocab.setdefault(line.rstrip("\r"), i)
    missing = [t for t in ("[UNK]", "[CLS]", "[SEP]") if t not in vocab]
    if missing:
        raise ValueError(f"{vocab_file}: lacks the special token(s) {', '.join(missing)}")
    lower = True
    if cfg_file.exists():
        flag = read_json_object(cfg_file).get("do_lower_case", True)
        if not isinstance(flag, bool):
            raise ValueError(f"{cfg_file}: do_lower_case: expected true or false, got {flag!r}")
        lower = flag
    tok = Tokenizer(WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lower
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.BertProcessing(
        ("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"])
    )
    tok.decoder = decoders.WordPiece()
    return tok


def load_tokenizer(path: Path, max_length: int, vocab_size: int) -> Tokenizer:
    """``path/tokenizer.json``, or a BERT WordPiece tokenizer built from ``path/vocab.txt``;
    set to truncate to ``max_length`` tokens and not to pad (padding is done per batch).

    Raises ValueError naming the file when it is not UTF-8, not a tokenizer, lacks [UNK] /
    [CLS] / [SEP], has ids >= ``vocab_size`` (the model's embedding rows), or fails to encode
    a sample text; FileNotFoundError when neither file exists."""
    tj, vocab = path / "tokenizer.json", path / "vocab.txt"
    if tj.exists():
        source, text = tj, read_text(tj)
        try:
            tok = Tokenizer.from_str(text)
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception
            raise ValueError(f"{tj}: not a tokenizers file ({' '.join(str(e).split())})") from None
    elif vocab.exists():
        source = vocab
        tok = _wordpiece_from_vocab(vocab, path / "tokenizer_config.json")
    else:
        raise FileNotFoundError(f"{path}: no tokenizer.json or vocab.txt found")
    n = tok.get_vocab_size(with_added_tokens=True)
    if n > vocab_size:
        raise ValueError(
            f"{source}: has {n} tokens but the model has only vocab_size={vocab_size} "
            "embeddings (config.json)"
        )
    tok.no_padding()
    tok.enable_truncation(max_length=max_length)
    try:
        tok.encode(_PROBE)
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception
        raise ValueError(f"{source}: the tokenizer cannot encode text ({e})") from None
    return tok


# ---------------------------------------------------------------------------------------------
# weights
# ---------------------------------------------------------------------------------------------
# HuggingFace BertModel parameter names -> attnkit's (without the optional "bert." prefix).
_RENAMES: tuple[tuple[str, str], ...] = (
    (
        r"embeddings\.(word|position|token_type)_embeddings\.weight",
        r"embeddings.\1_embeddings.weight",
    ),
    (r"embeddings\.LayerNorm\.", r"embeddings.norm."),
    (r"encoder\.layer\.(\d+)\.attention\.self\.query\.", r"layers.\1.self_attn.q_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.self\.key\.", r"layers.\1.self_attn.k_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.self\.value\.", r"layers.\1.self_attn.v_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"layers.\1.self_attn.out_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"layers.\1.norm1."),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.", r"layers.\1.linear1."),
    (r"encoder\.layer\.(\d+)\.output\.dense\.", r"layers.\1.linear2."),
    (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"layers.\1.norm2."),
)
_IGNORED = re.compile(r"(embeddings\.position_ids|pooler\..*|cls\..*)")
_LAYER = re.compile(r"layers\.(\d+)\.")


def rename(name: str) -> str | None:
    """attnkit's parameter name for a HuggingFace BERT weight name; "" for weights that are
    ignored; None when the name is not recognised."""
    if name.startswith("bert."):
        name = name[len("bert.") :]
    if _IGNORED.fullmatch(name):
        return ""
    name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
    name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
    for pat, rep in _RENAMES:
        m = re.match(pat, name)
        if m:
            return m.expand(rep) + name[m.end() :]
    return None


def read_header(file: Path) -> Header:
    """Names, shapes and dtypes of the tensors in safetensors ``file``, without loading any.

    safetensors checks the header against the file (size, offsets, shapes): a truncated file or
    a header that does not describe the data raises ValueError naming the file."""
    require_file(file)
    try:
        with safe_open(str(file), framework="pt") as f:
            header = {}
            for name in f.keys():
                s = f.get_slice(name)
                header[name] = (tuple(int(n) for n in s.get_shape()), str(s.get_dtype()))
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{file}: not a valid safetensors file ({e})") from None
    return header


def check_layer_count(file: Path, header: Header, num_layers: int, config_file: Path) -> None:
    """The layer indices of the weights must be 0 .. ``num_layers`` - 1: checked on the header
    before a model with ``num_layers`` layers is built."""
    found = sorted({int(m.group(1)) for n in header if (m := _LAYER.match(rename(n) or ""))})
    if len(found) != num_layers or (found and found[-1] != num_layers - 1):  # not 0 .. n-1
        held = f"layers {first([str(i) for i in found], 8)}" if found else "no layers"
        raise ValueError(
            f"{file}: holds weights for {held}, but {config_file} says "
            f"num_hidden_layers={num_layers}"
        )


def match_weights(
    file: Path, header: Header, expected: Mapping[str, tuple[int, ...]]
) -> dict[str, str]:
    """Map every expected parameter (attnkit name -> shape) to its tensor name in ``file``,
    checking names, shapes and dtypes against the header; ValueError listing the first few
    problems of each kind."""
    names: dict[str, str] = {}
    unknown, bad_shape, bad_dtype, seen = [], [], [], set()
    for name, (shape, dtype) in header.items():
        ours = rename(name)
        if ours == "":
            continue
        if ours is None or ours not in expected:
            unknown.append(name)
            continue
        seen.add(ours)
        if shape != tuple(expected[ours]):
            bad_shape.append(f"{name} {shape} (expected {tuple(expected[ours])})")
        elif dtype not in FLOAT_DTYPES:
            bad_dtype.append(f"{name} {dtype}")
        else:
            names[ours] = name
    missing = [k for k in expected if k not in seen]
    problems = []
    if bad_shape:
        problems.append(f"shape mismatch: {first(bad_shape)}")
    if bad_dtype:
        problems.append(
            f"tensors not floating-point (expected {', '.join(FLOAT_DTYPES)}): {first(bad_dtype)}"
        )
    if missing:
        problems.append(f"missing weights (attnkit names): {first(missing)}")
    if unknown:
        problems.append(f"unexpected weights: {first(unknown)}")
    if problems:
        head = "weights do not match config.json: " if bad_shape or missing or unknown else ""
        raise ValueError(f"{file}: {head}" + "; ".join(problems))
    return names


def load_weights(file: Path, names: Mapping[str, str], dtype: torch.dtype) -> dict[str, Tensor]:
    """Load the tensors ``names`` (attnkit name -> name in ``file``) converted to ``dtype``;
    ValueError naming the tensor when it holds NaN or inf, or overflows ``dtype``."""
    state: dict[str, Tensor] = {}
    try:
        with safe_open(str(file), framework="pt") as f:
            for ours, name in names.items():
                raw = f.get_tensor(name)
                state[ours] = _finite(file, name, raw, raw.to(dtype))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{file}: cannot read the tensors ({e})") from None
    return state


def _finite(file: Path, name: str, raw: Tensor, t: Tensor) -> Tensor:
    # fast path, one pass: the min and max are finite exactly when every entry is (aminmax
    # propagates NaN)
    if t.numel() == 0 or bool(torch.isfinite(torch.stack(torch.aminmax(t))).all()):
        return t
    bad = int((~torch.isfinite(t)).sum())
    if bad:
        if bool(torch.isfinite(raw).all()):
            raise ValueError(
                f"{file}: tensor {name!r}: {bad} value(s) overflow {t.dtype}; load with a wider "
                "dtype"
            )
        raise ValueError(f"{file}: tensor {name!r} holds {bad} NaN or infinite value(s)")
    return t


def check_shapes(
    path: Path, expected: Mapping[str, tuple[int, ...]], prefixes: Sequence[str] = ()
) -> None:
    """Check the safetensors headers of model directory ``path`` (every ``*.safetensors``
    file, sharded ones included; nothing loaded) against ``expected``: parameter name -> shape
    of the model that ``path/config.json`` describes (e.g. built on the meta device). A tensor
    of the files matches a parameter of the same name, or of the name with one of ``prefixes``
    (a base model's prefix, such as ``transformer.``) added or removed. ValueError naming the
    first few tensors whose shapes differ, before any model is built; names that match nothing
    are left to the loader (tied or buffer weights)."""
    config_file = path / "config.json"
    bad: list[str] = []
    for file in sorted(path.glob("*.safetensors")):
        for name, (shape, _) in read_header(file).items():
            candidates = [name] + [p + name for p in prefixes]
            candidates += [name[len(p) :] for p in prefixes if p and name.startswith(p)]
            ours = next((c for c in candidates if c in expected), None)
            if ours is not None and tuple(expected[ours]) != shape:
                bad.append(f"{name} is {shape} in {file.name} but {tuple(expected[ours])} by "
                           "config.json")  # fmt: skip
    if bad:
        raise ValueError(
            f"{config_file}: disagrees with the weights: {first(bad, 3)}; the config does not "
            "describe these weights (was it edited, or copied from another model?)"
        )
