"""Standard scoring: references grouped by source, sacrebleu's multi-reference BLEU/chrF/TER
(checked against sacrebleu called directly and against the ``sacrebleu`` command), the
``attnkit score`` verb, and the overlap of an evaluation file with the training data."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.cli import main
from attnkit.train.config import TrainConfig
from attnkit.train.data.sources import synthetic_split
from attnkit.train.inference.overlap import training_overlap
from attnkit.train.inference.scoring import corpus_scores, group_references

PAIRS = [
    ("I am cold.", "J'ai très froid ce soir."),
    ("Go.", "Va-t'en tout de suite !"),
    ("Go.", "Marche vers la porte maintenant."),
    ("Go.", "Bouge de là tout de suite !"),
    ("I am cold.", "J'ai très froid ce soir."),  # a repeated pair counts once
    ("Hi.", "Salut à toi mon ami !"),
]


def test_group_references_keeps_first_order_and_every_reference():
    g = group_references(PAIRS)
    assert g.sources == ("I am cold.", "Go.", "Hi.")
    assert g.references == (
        ("J'ai très froid ce soir.",),
        (
            "Va-t'en tout de suite !",
            "Marche vers la porte maintenant.",
            "Bouge de là tout de suite !",
        ),
        ("Salut à toi mon ami !",),
    )
    assert g.pairs == 5
    assert g.streams() == [
        ["J'ai très froid ce soir.", "Va-t'en tout de suite !", "Salut à toi mon ami !"],
        [None, "Marche vers la porte maintenant.", None],
        [None, "Bouge de là tout de suite !", None],
    ]
    with pytest.raises(ValueError, match="pairs: expected at least one"):
        group_references([])


def test_multi_reference_matches_sacrebleu_and_differs_from_pairwise():
    g = group_references(PAIRS)
    hyps = ["J'ai très froid ce soir.", "Bouge de là tout de suite !", "Salut à toi mon ami !"]
    s = corpus_scores(hyps, g.streams())
    assert s.bleu.score == pytest.approx(100.0, abs=1e-9)
    assert s.ter.score == pytest.approx(0.0, abs=1e-9)
    assert "nrefs:var" in s.bleu.signature and "nrefs:var" in s.chrf.signature
    # the old way (one segment per pair, one reference each) scores the same outputs lower
    flat_h = [hyps[g.sources.index(src)] for src, _ in dict.fromkeys(PAIRS)]
    flat_r = [t for _, t in dict.fromkeys(PAIRS)]
    assert sacrebleu.corpus_bleu(flat_h, [flat_r]).score < 90.0
    # independent: sacrebleu's functional API on the same streams
    ref = sacrebleu.corpus_chrf(hyps, g.streams())
    assert s.chrf.score == pytest.approx(ref.score, abs=1e-9)


@settings(max_examples=25, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from("abcdefg"), st.sampled_from(["x y", "x z w", "y y", "z"]), min_size=1
    ),
    st.sampled_from(["x y", "z w", "y"]),
)
def test_one_reference_per_source_equals_plain_sacrebleu(table, hyp):
    pairs = list(table.items())
    g = group_references(pairs)
    hyps = [hyp] * len(g.sources)
    s = corpus_scores(hyps, g.streams())
    refs = [t for _, t in pairs]
    assert s.bleu.score == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
    assert s.chrf.score == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=1e-9)
    assert s.ter.score == pytest.approx(sacrebleu.corpus_ter(hyps, [refs]).score, abs=1e-9)
    assert "nrefs:1" in s.bleu.signature


def test_corpus_scores_bad_input():
    with pytest.raises(ValueError, match="hyps: expected at least one"):
        corpus_scores([], [[]])
    with pytest.raises(
        ValueError, match=r"refs: reference stream 1 has 1 lines, expected .* \(2\)"
    ):
        corpus_scores(["a", "b"], [["a"]])
    with pytest.raises(ValueError, match="refs: segment 2 has no reference"):
        corpus_scores(["a", "b"], [["a", None]])


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_score_verb_equals_the_sacrebleu_command(capsys, tmp_path):
    hyp = tmp_path / "hyp.txt"
    r1, r2 = tmp_path / "r1.txt", tmp_path / "r2.txt"
    hyp.write_text("the cat sat on the mat\nhello there friend\na b c d\n", encoding="utf-8")
    r1.write_text("the cat sat on a mat\nhello my friend\na b c e\n", encoding="utf-8")
    r2.write_text("a cat was on the mat\nhi there friend\na b d d\n", encoding="utf-8")
    code, out, err = run(capsys, "score", "--hyp", hyp, "--ref", r1, "--ref", r2)
    assert code == 0, err
    got = dict(line.split("=") for line in out.strip().splitlines()[-3:])
    exe = shutil.which("sacrebleu", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("the sacrebleu command is not installed beside this Python")
    res = subprocess.run(
        [exe, str(r1), str(r2), "-i", str(hyp), "-m", "bleu", "chrf", "ter", "-w", "4"],
        capture_output=True,
        text=True,
        check=True,
    )
    want = [m["score"] for m in json.loads(res.stdout)]
    assert [float(got[k]) for k in ("bleu", "chrf", "ter")] == pytest.approx(want, abs=0.006)
    assert "nrefs:2" in out


def test_score_verb_errors_name_the_option(capsys, tmp_path):
    hyp, ref = tmp_path / "h.txt", tmp_path / "r.txt"
    hyp.write_text("a\nb\n", encoding="utf-8")
    ref.write_text("a\n", encoding="utf-8")
    code, _, err = run(capsys, "score", "--hyp", hyp, "--ref", ref)
    assert code == 2 and "--ref:" in err and "has 1 lines, expected one per hypothesis" in err
    code, _, err = run(capsys, "score", "--hyp", hyp, "--ref", tmp_path / "missing.txt")
    assert code == 2 and "--ref:" in err and "missing.txt" in err
    assert len(err.strip().splitlines()) == 1


def test_overlap_counts_training_pairs():
    c = TrainConfig(task="copy", train_size=50, valid_size=5, vocab=6, length=4).resolved()
    train, held = synthetic_split("copy", 50, 5, 6, c.min_length, 4, c.seed)
    items = train[:3] + held[:2]
    o = training_overlap(c, [list(p) for p in held], [], items)
    assert (o.shared, o.total) == (3, 5)
    assert "3 of the 5 examples of x.tsv" in o.warning("x.tsv")
    assert training_overlap(c, held, [], held).warning("x") is None
    json.dumps(o.__dict__)  # plain values only
