"""The viewer's browser fixtures: one chromium per test module (``browser``), and
``open_page(html_text)``, which writes the page to a file, opens it and waits until it has
drawn. Without chromium or playwright the tests that use them skip, saying which is missing."""

from __future__ import annotations

import pytest
from support.browser import CHROMIUM, FLAGS, Page


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip(
            "Debian's chromium is not on PATH (scripts/install-browser.sh installs it with "
            "apt-get; it needs root)"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright (Python) is not installed: pip install -e '.[dev]'")
    pw = sync_playwright().start()
    try:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1100, "height": 800},
        )
    except Exception:
        pw.stop()
        raise
    yield ctx
    ctx.close()
    pw.stop()


@pytest.fixture
def open_page(browser, tmp_path):
    pages = []

    def _open(doc: str, name: str = "view.html") -> Page:
        path = tmp_path / name
        path.write_text(doc, encoding="utf-8")
        page = browser.new_page()
        p = Page(page, path.as_uri())
        page.on("console", lambda m: p.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: p.errors.append(str(e)))
        page.on("request", lambda r: p.requests.append(r.url))

        def on_dialog(d):
            p.dialogs.append(d.message)
            d.dismiss()

        page.on("dialog", on_dialog)
        page.goto(p.url)
        page.wait_for_function("document.body.dataset.drawn !== undefined", timeout=20_000)
        pages.append(p)
        return p

    yield _open
    for p in pages:
        p.page.close()
