"""attnkit export --to hf: transformers loads the directory with its Auto classes, its logits
equal attnkit's within 1e-5 (float32, padded batch, odd lengths), greedy generation gives the
same tokens, the tokenizer encodes as attnkit does; configurations without a faithful
transformers class are refused naming the feature. Language models: test_hf_export_lm.py."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from attnkit.cli import main  # noqa: E402
from attnkit.integrations.hf_export import UnfaithfulExport, export_seq2seq  # noqa: E402
from attnkit.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer  # noqa: E402
from attnkit.train.config import TrainConfig  # noqa: E402
from attnkit.train.data.tasks import seq2seq_example  # noqa: E402
from attnkit.train.inference import session  # noqa: E402
from attnkit.train.loop.trainer import train  # noqa: E402


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("export")
    cfg = TrainConfig(
        task="reverse",
        vocab=7,
        length=7,
        train_size=300,
        valid_size=8,
        d_model=18,  # 18 / 3 heads: an odd head dim
        nhead=3,
        layers=2,
        dim_feedforward=40,
        batch_size=16,
        dropout=0.1,
        warmup=10,
        eval_every=5,
        max_steps=15,
    )
    train(cfg, root / "run", echo=lambda _: None)
    assert main(["export", "--ckpt", str(root / "run"), "--to", "hf", str(root / "hf")]) == 0
    return root / "run", root / "hf"


def test_transformers_loads_it_and_logits_match(exported):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    run, hf_dir = exported
    loaded = session.load(run, best=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(hf_dir).eval()
    tok = AutoTokenizer.from_pretrained(hf_dir)
    assert type(model).__name__ == "PegasusForConditionalGeneration"
    texts = ["3 1 4 1 5 2 6", "0 2", "5 5 5"]
    enc = tok(texts, return_tensors="pt", padding=True)
    for row, text in zip(enc["input_ids"], texts):  # attnkit's source ids, [EOS] at the end
        want = seq2seq_example(loaded.tokenizer, text, "")[0]
        assert row[: len(want)].tolist() == want and not row[len(want) :].any()
    tgt = torch.tensor([[1, 4, 5, 6], [1, 3, 3, 2], [1, 8, 0, 0]])
    with torch.no_grad():
        ours = loaded.model(enc["input_ids"], tgt)
        theirs = model(**enc, decoder_input_ids=tgt, decoder_attention_mask=tgt != 0).logits
    real = tgt != 0  # attnkit never lets padded target positions be queried meaningfully
    assert (ours - theirs)[real].abs().max() <= 1e-5


def test_greedy_generation_gives_the_same_tokens(exported):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    run, hf_dir = exported
    loaded = session.load(run, best=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(hf_dir).eval()
    tok = AutoTokenizer.from_pretrained(hf_dir)
    for text in ["3 1 4 1 5 2 6", "0 2 4", "6"]:
        enc = tok([text], return_tensors="pt")
        with torch.no_grad():
            ours = loaded.model.greedy_decode(enc["input_ids"], max_len=12)[0].tolist()
            theirs = model.generate(**enc, max_new_tokens=12, do_sample=False, num_beams=1)
        theirs = theirs[0, 1:].tolist()  # without the start token
        assert theirs[: len(ours)] == ours


def test_unfaithful_configurations_are_refused(tmp_path, exported, capsys):
    def s2s(**kw) -> Seq2SeqTransformer:
        base = dict(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1)
        return Seq2SeqTransformer(Seq2SeqConfig(11, 11, **{**base, **kw}))

    tok = session.load(exported[0]).tokenizer
    with pytest.raises(UnfaithfulExport, match="post-LN layers"):
        export_seq2seq(s2s(norm_first=False, tie_embeddings="all"), tok, tmp_path / "a")
    with pytest.raises(UnfaithfulExport, match="tie_embeddings='none'"):
        export_seq2seq(s2s(norm_first=True, tie_embeddings="none"), tok, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    code = main(["export", "--ckpt", str(exported[0]), "--to", "hf", str(exported[1])])
    assert code == 2 and "OUT:" in capsys.readouterr().err  # never over an existing directory


def test_the_export_has_the_modes_of_a_directory_made_as_usual(exported):
    # was: the directory 0700 (tempfile.mkdtemp) and model.safetensors 0600, so an export
    # copied to a shared place could not be read by anyone else; the reference is what mkdir
    # and open make beside it under the same umask
    hf = exported[1]
    (hf.parent / "usual").mkdir()
    (hf.parent / "usual.txt").write_text("x")
    assert stat.S_IMODE(hf.stat().st_mode) == stat.S_IMODE((hf.parent / "usual").stat().st_mode)
    usual = stat.S_IMODE((hf.parent / "usual.txt").stat().st_mode)
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in hf.iterdir()}
    assert "model.safetensors" in modes and modes == dict.fromkeys(modes, usual)
