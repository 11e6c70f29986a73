"""attnkit export --to hf for language models: transformers loads the directory with
AutoModelForCausalLM / AutoTokenizer (GPT2LMHeadModel for learned positions, PegasusForCausalLM
for sinusoidal ones), its logits equal attnkit's within 1e-5 (float32, a right-padded batch, odd
lengths and head widths, tied and untied, gelu and relu), greedy ``generate`` gives attnkit's
tokens, the tokenizer (char, word, BPE) encodes as attnkit does, Pegasus's unused
cross-attention holds zeros that no output depends on, configurations without a faithful class
are refused naming the feature (nothing written), and the CLI path works in a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from attnkit.cli import main  # noqa: E402
from attnkit.integrations.hf_export import UnfaithfulExport, quiet  # noqa: E402
from attnkit.integrations.hf_export_lm import export_lm  # noqa: E402
from attnkit.models.lm import LMConfig, TransformerLM  # noqa: E402
from attnkit.train.config import TrainConfig  # noqa: E402
from attnkit.train.data import tokenizer as tk  # noqa: E402
from attnkit.train.inference import session  # noqa: E402
from attnkit.train.loop.trainer import train  # noqa: E402
from tests.train.conftest import RHYME  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
TOL = 1e-5
TEXTS = ["humpty dumpty sat on a wall", "jack and jill", "all the king's men fell"]
PROMPTS = ["humpty dumpty", "jack", "to fetch a pail"]
RUNS = {  # learned: an odd head width (15 / 3); sinusoidal: Pegasus needs an even d_model
    "learned": dict(d_model=15, nhead=3, positions="learned", tie_embeddings=False),
    "sinusoidal": dict(d_model=18, nhead=3, positions="sinusoidal"),
}


def hf_load(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet():
        model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
        return model.eval(), AutoTokenizer.from_pretrained(path), info


def lm_train_config(data: Path, **kw) -> TrainConfig:
    base = dict(task="lm", data=str(data), tokenizer="word",
                block_size=12, valid_fraction=0.25, layers=2,
                dim_feedforward=32, dropout=0.1, batch_size=16, warmup=10, eval_every=5,
                max_steps=15, bias=False)  # fmt: skip
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def rhyme(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("data") / "rhyme.txt"
    p.write_text(RHYME, encoding="utf-8")
    return p


@pytest.fixture(scope="module", params=sorted(RUNS))
def exported(request, rhyme, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp(request.param)
    train(lm_train_config(rhyme, **RUNS[request.param]), root / "run", echo=lambda _: None)
    assert main(["export", "--ckpt", str(root / "run"), "--to", "hf", str(root / "hf")]) == 0
    return root / "run", root / "hf"


def test_transformers_loads_it_and_logits_match(exported):
    run, hf_dir = exported
    loaded = session.load(run, best=True)
    model, tok, info = hf_load(hf_dir)
    want = "GPT2" if loaded.model.config.positions == "learned" else "PegasusForCausalLM"
    assert type(model).__name__.startswith(want)
    assert not info["missing_keys"] and not info["unexpected_keys"]  # nothing left random
    assert not list(hf_dir.glob("*.bin")) and (hf_dir / "model.safetensors").is_file()
    assert not [p for p in hf_dir.parent.iterdir() if p.name.startswith(".hf.")]  # no temp dir
    enc = tok(TEXTS, return_tensors="pt", padding=True)
    for row, text in zip(enc["input_ids"], TEXTS):  # attnkit's ids, [PAD] after them
        ids = tk.encode(loaded.tokenizer, text)
        assert row[: len(ids)].tolist() == ids and not row[len(ids) :].any()
    with torch.no_grad():
        ours = loaded.model(enc["input_ids"])
        theirs = model(**enc).logits
    real = enc["attention_mask"].bool()
    assert ours.abs().max() > 0.1  # not a trivial comparison
    assert (ours - theirs)[real].abs().max() <= TOL


def test_greedy_generation_gives_the_same_tokens(exported):
    run, hf_dir = exported
    loaded = session.load(run, best=True)
    model, tok, _ = hf_load(hf_dir)
    for text in PROMPTS:
        ids = tok([text], return_tensors="pt")["input_ids"]
        n = 12 - ids.shape[1] + 1  # the learned table has 12 rows
        ours = [t for t in loaded.model.generate(ids, max_new_tokens=n)[0].tolist() if t != 0]
        with quiet(), torch.no_grad():
            theirs = model.generate(ids, max_new_tokens=n, do_sample=False, num_beams=1)
        assert ours and theirs[0, ids.shape[1] :].tolist() == ours


def random_lm(vocab: int, seed: int, **kw) -> TransformerLM:
    """A TransformerLM with random weights, its LayerNorm gains and biases perturbed (a fresh
    LayerNorm is the identity map, which would hide a mismatch there)."""
    torch.manual_seed(seed)
    base = dict(nhead=3, num_layers=2, dim_feedforward=20, dropout=0.0, bias=False, max_len=24)
    model = TransformerLM(LMConfig(vocab, **{**base, **kw}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("positions, d_model", [("learned", 15), ("sinusoidal", 12)])
@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_every_mapped_option_matches(tmp_path, rhyme, positions, d_model, tie, activation):
    tok = tk.train([RHYME], "word")
    vocab = tok.get_vocab_size()
    model = random_lm(vocab, 3, d_model=d_model, positions=positions, tie_embeddings=tie,
                      activation=activation)  # fmt: skip
    with quiet():
        export_lm(model, tok, tmp_path / "hf")
    hf, _, info = hf_load(tmp_path / "hf")
    assert not info["missing_keys"]
    g = torch.Generator().manual_seed(5)
    x = torch.randint(4, vocab, (3, 23), generator=g)
    with torch.no_grad():
        ours, theirs = model(x), hf(x).logits
        assert (ours - theirs).abs().max() <= TOL
        for row in x[:, :5]:
            mine = [t for t in model.generate(row[None], max_new_tokens=15)[0].tolist() if t]
            out = hf.generate(row[None], max_new_tokens=15, do_sample=False, num_beams=1)
            assert mine and out[0, 5:].tolist() == mine


@pytest.mark.parametrize("kind", ["char", "word", "bpe"])
def test_tokenizer_encodes_as_attnkit(tmp_path, kind):
    tok = tk.train([RHYME], kind, vocab_size=300)
    model = random_lm(tok.get_vocab_size(), 0, d_model=12, positions="learned")
    with quiet():
        export_lm(model, tok, tmp_path / "hf")
    _, hf_tok, _ = hf_load(tmp_path / "hf")
    for text in [*TEXTS, "Humpty's crown,\nbroke!"]:
        assert hf_tok(text)["input_ids"] == tk.encode(tok, text)


def test_pegasus_cross_attention_is_zero_and_unused(tmp_path):
    tok = tk.train([RHYME], "word")
    model = random_lm(tok.get_vocab_size(), 1, d_model=12)
    with quiet():
        export_lm(model, tok, tmp_path / "hf")
    hf, _, _ = hf_load(tmp_path / "hf")
    cross = {k: v for k, v in hf.state_dict().items() if ".encoder_attn" in k}
    assert cross and not any(v.any() for v in cross.values())
    x = torch.randint(4, tok.get_vocab_size(), (2, 9))
    with torch.no_grad():
        before = hf(x).logits
        for v in cross.values():
            v.normal_()
        assert torch.equal(hf(x).logits, before)


@pytest.mark.parametrize(
    "kw, feature",
    [
        (dict(bias=True), r"the bias of the output layer \(generator\.bias"),
        (dict(norm_first=False), r"post-LN layers \(--no-norm-first: GPT2LMHeadModel"),
        (dict(window=4), r"sliding-window attention \(--window 4: GPT2LMHeadModel"),
        (dict(positions="sinusoidal", d_model=15), r"an odd d_model \(15"),
        (dict(positions="sinusoidal", layer_norm_eps=1e-6), r"layer_norm_eps=1e-06"),
    ],
)
def test_unfaithful_configurations_are_refused(tmp_path, kw, feature):
    tok = tk.train([RHYME], "word")
    model = random_lm(tok.get_vocab_size(), 0, **{"d_model": 12, "positions": "learned", **kw})
    with pytest.raises(UnfaithfulExport, match=feature):
        export_lm(model, tok, tmp_path / "hf")
    assert not (tmp_path / "hf").exists() and not list(tmp_path.iterdir())


def test_bad_arguments_are_refused_before_any_work(tmp_path):
    tok = tk.train([RHYME], "word")
    model = random_lm(tok.get_vocab_size(), 0, d_model=12, positions="learned")
    with pytest.raises(TypeError, match="model: expected an attnkit TransformerLM, got Linear"):
        export_lm(torch.nn.Linear(2, 2), tok, tmp_path / "a")
    with pytest.raises(TypeError, match="tok: expected a tokenizers.Tokenizer, got str"):
        export_lm(model, "word", tmp_path / "a")
    with pytest.raises(TypeError, match="out: expected a directory path, got int"):
        export_lm(model, tok, 3)
    small = random_lm(tok.get_vocab_size() - 1, 0, d_model=12, positions="learned")
    with pytest.raises(ValueError, match=r"tok: \d+ tokens, more than the model's vocabulary"):
        export_lm(small, tok, tmp_path / "a")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ValueError, match="out: .* exists and is not an empty directory"):
        export_lm(model, tok, tmp_path / "full")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]


def test_cli_refuses_an_lm_with_biases(tmp_path, rhyme, capsys):
    cfg = lm_train_config(rhyme, d_model=12, nhead=2, max_steps=2, bias=True)
    train(cfg, tmp_path / "run", echo=lambda _: None)
    assert main(["export", "--ckpt", str(tmp_path / "run"), "--to", "hf", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert "bias of the output layer" in err and "--no-bias" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_cli_train_and_export_in_real_processes(tmp_path, rhyme):
    env = {**os.environ, "PYTHONPATH": str(SRC)}

    def attnkit(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "attnkit", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    attnkit("train", "--task", "lm", "--data", str(rhyme), "--positions", "learned",
            "--tokenizer", "word",
            "--no-bias", "--block-size", "12", "--d-model", "16", "--nhead", "2", "--layers",
            "1", "--dim-feedforward", "32", "--max-steps", "6", "--eval-every", "3",
            "--out", "run")  # fmt: skip
    out = attnkit("export", "--ckpt", "run", "--to", "hf", "hf")
    assert "GPT2LMHeadModel" in out and "AutoModelForCausalLM" in out
    loaded = session.load(tmp_path / "run", best=True)
    model, tok, _ = hf_load(tmp_path / "hf")
    ids = tok(["humpty dumpty sat on"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert (loaded.model(ids) - model(ids).logits).abs().max() <= TOL


def test_cli_says_where_the_positions_limit_comes_from(exported, tmp_path, capsys):
    # was "(its training window, --block-size)" for Pegasus too, whose table (max_len rows,
    # 256 by default) is not the --block-size of 12 it was trained on
    run_dir, hf = exported
    capsys.readouterr()
    assert main(["export", "--ckpt", str(run_dir), "--to", "hf", str(tmp_path / "again")]) == 0
    out = capsys.readouterr().out
    config = json.loads((hf / "config.json").read_text())
    n = (
        config["n_positions"]
        if config["model_type"] == "gpt2"
        else config["max_position_embeddings"]
    )
    block = session.load(run_dir).train_config.block_size
    if config["model_type"] == "gpt2":
        assert n == block and f"holds {n} positions (its training window, --block-size)" in out
    else:
        assert n != block and "--block-size" not in out
        assert f"holds {n} positions (the rows of its sinusoidal position table)" in out
