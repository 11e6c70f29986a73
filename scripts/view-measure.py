"""File size and opening time of ``attnkit.viz.html`` pages, measured in headless Chromium.

    .venv/bin/python scripts/view-measure.py            # all rows (about 3 minutes)
    .venv/bin/python scripts/view-measure.py --quick    # the model rows only

Rows: the default model (6 layers x 12 heads) on a real text at 256 tokens (its sentence-
transformers limit) and at 512 tokens (its position limit; the tokenizer's truncation lifted
here); then 6 x 12 heads at 2,000 tokens of synthetic attention (a local band, a sink on the
first key and noise in the logits: each row has a few large weights and a long tail). For each:
entries, bytes per entry in the file, file size, render time, and the time from navigation to
the first complete drawing in Chromium (median of 3 loads).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from attnkit.viz import html

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-quic",
]  # fmt: skip
ROOT = Path(__file__).resolve().parents[1]


def model_rows() -> list[tuple[str, object, list[str]]]:
    from attnkit.models import default_model_path
    from attnkit.models.bert import BertModel

    model = BertModel.from_pretrained(default_model_path())
    text = " ".join(p.read_text(encoding="utf-8") for p in (ROOT / "README.md", ROOT / "docs"
                    / "seeds.md") if p.exists())  # fmt: skip
    rows = []
    for n in (256, 512):
        tok = model.tokenizer
        tok.no_truncation()
        enc = tok.encode(text)
        ids = enc.ids[: n - 1] + [enc.ids[-1]]  # keep [SEP] at the end
        tokens = enc.tokens[: n - 1] + [enc.tokens[-1]]
        assert len(ids) == n, f"the text has only {len(enc.ids)} tokens"
        with torch.inference_mode():
            out = model(torch.tensor([ids]), None, None, output_attentions=True)
        w = torch.stack([a[0] for a in out.attentions]).numpy()
        rows.append((f"default model, 6x12, {n} tokens", w, tokens))
    return rows


def synthetic(n: int, layers: int, heads: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    i = np.arange(n, dtype=np.float32)[:, None]
    j = np.arange(n, dtype=np.float32)[None, :]
    out = np.empty((layers, heads, n, n), np.float32)
    for layer in range(layers):
        for h in range(heads):
            s = rng.standard_normal((n, n), dtype=np.float32)
            s -= np.abs(i - j) / (4.0 + 8 * (h % 4))
            s[:, 0] += 3.0 * (h % 2)
            s -= s.max(-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(-1, keepdims=True)
            out[layer, h] = s
    return out


def open_ms(ctx, path: Path, runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        page = ctx.new_page()
        page.goto(path.as_uri())
        page.wait_for_function("document.body.dataset.firstDrawMs !== undefined", timeout=120_000)
        times.append(float(page.evaluate("document.body.dataset.firstDrawMs")))
        page.close()
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="the model rows only")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    rows = model_rows()
    if not args.quick:
        rows.append(("synthetic, 6x12, 2000 tokens", None, [f"w{i}" for i in range(2000)]))
    print(f"{'case':34} {'entries':>12} {'B/entry':>8} {'file MB':>8} {'render s':>9} "
          f"{'open ms':>8}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(Path(tmp) / "profile"), executable_path=shutil.which("chromium"),
            headless=True, args=FLAGS, viewport={"width": 1100, "height": 800},
        )  # fmt: skip
        for name, w, tokens in rows:
            if w is None:
                w = synthetic(len(tokens), 6, 12)
            t = time.perf_counter()
            page = html.render(w, tokens, title=name)
            render_s = time.perf_counter() - t
            path = Path(tmp) / "page.html"
            html.save(page, path)
            size = path.stat().st_size
            del page
            ms = open_ms(ctx, path)
            print(f"{name:34} {w.size:>12,} {size / w.size:>8.3f} {size / 1e6:>8.1f} "
                  f"{render_s:>9.1f} {ms:>8.0f}")  # fmt: skip
            del w
        ctx.close()


if __name__ == "__main__":
    main()
