"""The option tables of the verbs (attnkit.cli.support.options): every option of every table,
given a bad value, is refused in one line that names the option, says what it got and what was
expected, before the checkpoint is read (the checkpoint here does not exist: an error about it
would mean the option was not checked first); a text that is not a number is refused by
argparse naming the option; the shared options are one object in every verb."""

from __future__ import annotations

import argparse

import pytest

from attnkit import checks
from attnkit.cli import evaluate, explain, generate, main, translate
from attnkit.cli.support import options as o
from attnkit.cli.support.common import UsageError

# verb -> (its option table, the arguments every run needs; the checkpoint does not exist)
TABLES = {
    "evaluate": (evaluate.OPTIONS, ["--ckpt", "/nonexistent/run"]),
    "translate": (translate.OPTIONS, ["--ckpt", "/nonexistent/run", "a b"]),
    "generate": (generate.OPTIONS, ["--ckpt", "/nonexistent/run", "--prompt", "a"]),
    "explain": ((explain.TOP_K_OPTION,), ["a b", "--model", "/nonexistent/model"]),
}
BAD_VALUES = ("0", "-1", "nan", "inf", "1e400")
"""Values one of which every check refuses (0 and -1: counts, seeds and probabilities; nan, inf
and 1e400 (inf once parsed): numbers)."""

CASES = [
    pytest.param(verb, option, id=f"{verb} {option.flag}")
    for verb, (table, _) in TABLES.items()
    for option in table
    if option.check is not None
]


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err and err.count("\n") == 1, err
    return code, err


@pytest.mark.parametrize("verb, option", CASES)
def test_every_table_option_refuses_a_bad_value_first(capsys, verb, option):
    _, base = TABLES[verb]
    refused = []
    for value in BAD_VALUES:
        try:
            parsed = option.kwargs["type"](value)
        except argparse.ArgumentTypeError:  # not this option's kind of number
            continue
        try:  # the values the option's own check refuses
            option.check(option.field, parsed)
        except (ValueError, TypeError):
            code, err = _run(capsys, [verb, *base, option.flag, value])
            assert code == 2, err
            assert err.startswith(f"attnkit {verb}: error: {option.flag}: expected "), err
            assert "got " in err and "checkpoint" not in err and "model" not in err, err
            refused.append(value)
    assert refused, f"{option.flag}: none of {BAD_VALUES} is refused"


@pytest.mark.parametrize("verb, option", CASES)
def test_a_text_that_is_not_a_number_is_refused_naming_the_option(capsys, verb, option):
    _, base = TABLES[verb]
    code, err = _run(capsys, [verb, *base, option.flag, "x1"])
    assert code == 2
    assert f"argument {option.flag}: expected " in err and "got 'x1'" in err, err


def test_shared_options_are_one_definition():
    for table in (evaluate.OPTIONS, translate.OPTIONS):
        assert o.BEAM in table and o.LENGTH_PENALTY in table
    assert o.BEAM.field == "beam_size" and o.LENGTH_PENALTY.field == "length_penalty"
    helps = set()
    for verb in ("evaluate", "translate"):
        sub = _subparser(verb)
        helps.add(next(a.help for a in sub._actions if "--beam" in a.option_strings))
    assert len(helps) == 1


def _subparser(verb: str) -> argparse.ArgumentParser:
    from attnkit.cli import build_parser

    parser = build_parser()
    return parser._subparsers._group_actions[0].choices[verb]


def test_check_names_the_option_and_skips_absent_values():
    opt = o.Option("--max-len", "max_len", checks.positive_int, o.positive("tokens"))
    o.check(argparse.Namespace(max_len=None), opt)  # not given: nothing to check
    o.check(argparse.Namespace(max_len=3), opt)
    with pytest.raises(UsageError, match=r"^--max-len: expected a positive int, got 0$"):
        o.check(argparse.Namespace(max_len=0), opt)


def test_renamed_names_library_errors_only_for_the_table_fields():
    with pytest.raises(UsageError, match=r"^--beam: expected a positive int, got 0$"):
        with o.renamed(o.BEAM):
            checks.positive_int("beam_size", 0)
    with pytest.raises(ValueError, match=r"^other: "):  # not an option's field: left as is
        with o.renamed(o.BEAM):
            checks.positive_int("other", 0)
