"""Headless Chromium for the tests that check a page in a real browser.

The browser is the system's (Debian's `chromium` package, which `.ci/run` installs), driven by
Playwright's Python package through `executable_path`, so nothing is downloaded: no
`playwright install`. Where either is missing the tests skip, saying which.

Usage (the fixtures are registered in tests/conftest.py):

    def test_page(open_page, tmp_path):
        view = open_page(tmp_path / "report.html")       # every network request blocked
        view.page.click("#some-button")
        assert view.errors == []                          # console errors and uncaught exceptions

    view = open_page("http://127.0.0.1:8080/", allow_hosts=("127.0.0.1",))  # a local server

A page sees only file:, data: and blob: URLs, and the hosts it is told to allow; every other
request is aborted and listed in `view.blocked`, so a page that would fetch a font or a script
from the network fails its test rather than passing on a connected machine.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

CHROMIUM = os.environ.get("GRAPHLLM_CHROMIUM", "/usr/bin/chromium")
_LOCAL_SCHEMES = ("file", "data", "blob", "about")


def chromium_path() -> str | None:
    """The system Chromium's path, or None when it is not installed."""
    if Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    return shutil.which("chromium")


@dataclass
class BrowserPage:
    """One open page: the Playwright `page`, and what went wrong on it so far."""

    page: Any
    errors: list[str] = field(default_factory=list)  # console errors, uncaught exceptions
    blocked: list[str] = field(default_factory=list)  # requests aborted as network access


@pytest.fixture(scope="session")
def chromium_browser() -> Iterator[Any]:
    """One headless Chromium for the session (starting it costs seconds)."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright (the dev extra) is not installed"
    )
    path = chromium_path()
    if path is None:
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def open_page(chromium_browser) -> Iterator[Callable[..., BrowserPage]]:
    """(target, allow_hosts=(), viewport=(1280, 900)) -> BrowserPage, loaded; `target` is a
    path (opened as file://) or a URL. Pages close when the test ends."""
    contexts = []

    def open_(
        target: str | Path,
        allow_hosts: tuple[str, ...] = (),
        viewport: tuple[int, int] = (1280, 900),
    ) -> BrowserPage:
        context = chromium_browser.new_context(
            viewport={"width": viewport[0], "height": viewport[1]}
        )
        contexts.append(context)
        page = context.new_page()
        view = BrowserPage(page)

        def route(r: Any) -> None:
            url = urlsplit(r.request.url)
            if url.scheme in _LOCAL_SCHEMES or url.hostname in allow_hosts:
                r.continue_()
            else:
                view.blocked.append(r.request.url)
                r.abort()

        context.route("**/*", route)
        page.on("console", lambda m: view.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: view.errors.append(f"uncaught: {e}"))
        text = str(target)
        url = text if "://" in text else Path(text).resolve().as_uri()
        page.goto(url, wait_until="load")
        return view

    yield open_
    for context in contexts:
        context.close()
