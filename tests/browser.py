"""A real browser for the viewer's tests: Debian's Chromium, headless, driven through Playwright.

Every request a page makes is recorded, and any that is not for a local file (or the loopback server of
`guirl view --serve`, when a test allows it) is refused and kept in `refused`: the site must work offline.
JavaScript errors on a page are kept in `errors`. Screenshots go to `ARTIFACTS` (the test artifacts: set
GUIRL_TEST_ARTIFACTS to put them elsewhere).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("GUIRL_TEST_ARTIFACTS") or ROOT / "build" / "test-artifacts") / "viewer"
CHROMIUM = shutil.which("chromium")


class Browser:
    def __init__(self, browser: Any) -> None:
        self.browser = browser
        self.requests: list[str] = []
        self.refused: list[str] = []
        self.errors: list[str] = []
        self.allowed_prefixes: tuple[str, ...] = ("file://",)

    @contextmanager
    def page(self, url: str, *, width: int = 1400, height: int = 1000) -> Iterator[Any]:
        context = self.browser.new_context(viewport={"width": width, "height": height})
        context.route("**/*", self._route)
        page = context.new_page()
        page.on("pageerror", lambda exc: self.errors.append(f"{url}: {exc}"))
        try:
            page.goto(url, wait_until="load")
            # every image on the page decoded (lazy ones are brought into view first)
            page.evaluate("() => document.querySelectorAll('img').forEach(i => i.loading = 'eager')")
            page.wait_for_function("() => [...document.images].every(i => i.complete)")
            yield page
        finally:
            context.close()

    def _route(self, route: Any) -> None:
        url = route.request.url
        self.requests.append(url)
        if url.startswith(self.allowed_prefixes) or url.startswith("data:"):
            route.continue_()
        else:
            self.refused.append(url)
            route.abort()

    def screenshot(self, page: Any, name: str, *, full_page: bool = False) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=full_page)
        return path


@contextmanager
def chromium() -> Iterator[Browser]:
    if CHROMIUM is None:
        pytest.fail("needs Debian's chromium package (make setup installs it)", pytrace=False)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("needs Playwright (guirl's `osworld` extra, installed by make setup-test)", pytrace=False)
    with sync_playwright() as pw:
        # root in a container has no user namespaces for Chromium's sandbox
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield Browser(b)
        finally:
            b.close()


def box(page: Any, selector: str) -> dict[str, float]:
    found = page.locator(selector)
    assert found.count() >= 1, f"nothing on the page matches {selector}"
    b = found.first.bounding_box()
    assert b is not None, f"{selector} is not shown"
    return b


def centre(b: dict[str, float]) -> tuple[float, float]:
    return b["x"] + b["width"] / 2, b["y"] + b["height"] / 2


def on_image(page: Any, img_selector: str, x: float, y: float) -> tuple[float, float]:
    """Where the image's pixel (x, y) is on the page, as laid out (the image may be scaled)."""
    b = box(page, img_selector)
    natural = page.locator(img_selector).first.evaluate("i => [i.naturalWidth, i.naturalHeight]")
    return b["x"] + x * b["width"] / natural[0], b["y"] + y * b["height"] / natural[1]
