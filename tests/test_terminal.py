"""Untrusted text on the terminal: attnkit.terminal, and the CLI end to end (a user's
sentence, an error message, a model's vocabulary). Control characters are shown escaped and
rich markup is shown as text, never interpreted."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from attnkit import cli
from attnkit.terminal import markup, printable, text

TINY_CONFIG = {"hidden_size": 8, "num_attention_heads": 2, "intermediate_size": 12,
               "max_position_embeddings": 16}  # fmt: skip


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "raw, shown",
    [
        ("\x1b[31mred", "\\x1b[31mred"),
        ("bell\x07 nul\x00 del\x7f", "bell\\x07 nul\\x00 del\\x7f"),
        ("csi\x9b2J c1\x85", "csi\\x9b2J c1\\x85"),
        ("line\nfeed\rret\ttab", "line\\nfeed\\rret\\ttab".replace("\\n", "\\x0a")
         .replace("\\r", "\\x0d").replace("\\t", "\\x09")),
        ("rtl\u202eevil\u2066x\u2069", "rtl\\u202eevil\\u2066x\\u2069"),
        ("sep\u2028x", "sep\\u2028x"),
        ("byte\udcff", "byte\\udcff"),
        ("naïve café 東京 ☃ [bold]", "naïve café 東京 ☃ [bold]"),
    ],
)  # fmt: skip
def test_printable(raw, shown):
    assert printable(raw) == shown
    assert printable(raw).isprintable()
    shown.encode("utf-8")  # lone surrogates are gone


def test_markup_and_text_are_never_interpreted():
    """On a colour terminal the only escapes rich writes are its own colours (SGR); what a
    reader sees (the text without them) is the escaped input, character for character."""
    sgr = re.compile("\x1b\\[[0-9;]*m")
    for s in ("[bold]x[/]", "[/]", "a\\", "[link=http://x]y[/link]", "\x1b[31m", "\x1b]8;;u\x07"):
        for renderable in (f"[italic]<{markup(s)}>[/]", text(s, style="bold")):
            buf = io.StringIO()
            console = Console(file=buf, force_terminal=True, color_system="truecolor", width=200)
            console.print(renderable, highlight=False)
            visible = sgr.sub("", buf.getvalue())
            assert "\x1b" not in visible, (s, buf.getvalue())
            assert printable(s) in visible, (s, visible)


def test_control_characters_and_markup_in_the_sentence(capsys):
    code, out, err = run(capsys, "explain", "a\x1b[31mb", "[bold]c", "[/]", "d\x9b2J\u202e",
                         "--word", "[bold]c", "--d-model", "4")  # fmt: skip
    assert code == 0, err
    assert "\x1b" not in out and "\x9b" not in out and "\u202e" not in out
    assert "a\\x1b[31mb" in out and "d\\x9b2J\\u202e" in out
    assert "One word: '[bold]c'" in out and "[/]" in out  # markup shown as text


def test_control_characters_in_json_are_escaped(capsys):
    code, out, _ = run(capsys, "explain", "a\x1bb", "c\x9bd", "--d-model", "2", "--json")
    assert code == 0
    assert "\x1b" not in out and "\x9b" not in out
    assert "\\u001b" in out and "\\u009b" in out
    assert json.loads(out)["words"] == ["a\x1bb", "c\x9bd"]


def test_an_error_message_with_control_characters(capsys):
    code, out, err = run(capsys, "explain", "x", "--word", "\x1b]0;title\x07")
    assert code == 2 and out == "" and err.count("\n") == 1 and "\x1b" not in err, err
    assert "'\\x1b]0;title\\x07' is not a word" in err


def test_hostile_vocabulary_tokens_are_shown_escaped(capsys, tmp_path):
    """A model whose vocabulary holds an ANSI escape and rich markup, end to end."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "\x1b[31mred", "[bold]x", "ok"]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    cfg = {**TINY_CONFIG, "vocab_size": len(vocab), "num_hidden_layers": 1}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    e, i, p = 8, 12, "encoder.layer.0."
    shapes = {
        "embeddings.word_embeddings.weight": (len(vocab), e),
        "embeddings.position_embeddings.weight": (16, e),
        "embeddings.token_type_embeddings.weight": (2, e),
        "embeddings.LayerNorm.weight": (e,), "embeddings.LayerNorm.bias": (e,),
        p + "intermediate.dense.weight": (i, e), p + "intermediate.dense.bias": (i,),
        p + "output.dense.weight": (e, i), p + "output.dense.bias": (e,),
    }  # fmt: skip
    for part in ("attention.self.query", "attention.self.key", "attention.self.value",
                 "attention.output.dense"):  # fmt: skip
        shapes[p + part + ".weight"], shapes[p + part + ".bias"] = (e, e), (e,)
    for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
        shapes[p + ln + ".weight"], shapes[p + ln + ".bias"] = (e,), (e,)
    save_file(
        {k: torch.randn(s, generator=g) * 0.1 for k, s in shapes.items()},
        str(tmp_path / "model.safetensors"),
    )
    text = "ok \x1b[31mred [bold]x"
    code, out, err = run(capsys, "explain", text, "--model", str(tmp_path), "--word", "ok")
    assert code == 0, err
    assert "\x1b" not in out
    assert "\\x1b[31mred" in out and "[bold]x" in out
    code, out, err = run(
        capsys, "explain", text, "--model", str(tmp_path), "--word", "ok", "--json"
    )
    assert code == 0 and "\x1b" not in out
    assert json.loads(out)["tokens"] == ["[CLS]", "ok", "\x1b[31mred", "[bold]x", "[SEP]"]
