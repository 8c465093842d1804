"""Chrome's setup steps (OSWorld's `chrome_open_tabs`, `chrome_close_tabs`, `update_browse_history`,
`googledrive`, `login`), and the DevTools connection the browser getters share.

OSWorld drives the VM's Chrome from the host through its remote-debugging port with Playwright's
`connect_over_cdp`; guirl does the same, at `TaskContext.devtools_url`. Playwright's Python package
connects over CDP without downloading a browser of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import sqlite3
import tempfile
import urllib.parse
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from guirl.runtime.retry import retry_idempotent
from guirl.vmpool.client import VMClient, VMError
from guirl.vmpool.tasks.files import fetch

REQUIRES = ("playwright", "yaml")
"""Modules beyond guirl's own dependencies that this module's functions import (the `osworld` extra)."""

if TYPE_CHECKING:  # setup.py registers these handlers: no import back at run time
    from guirl.vmpool.tasks.setup import TaskContext

CONNECT_TIMEOUT_S = 30.0
"""How long one attempt to connect to the DevTools endpoint may take."""
CONNECT_ATTEMPTS = 8
"""Attempts to connect (about a minute of backoff in all) before the browser counts as unreachable."""
PAGE_TIMEOUT_MS = 60_000
"""A page's navigation budget (OSWorld's)."""

HISTORY_TEMPLATE_URL = (
    "https://huggingface.co/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main/chrome/"
    "44ee5668-ecd5-4366-a6ce-c1c9b8d4e938/history_empty.sqlite?download=true"
)
"""OSWorld's empty Chrome History database, which `update_browse_history` fills."""

_CHROME_EPOCH = datetime(1601, 1, 1)
_TYPED_LINK = 805306368
"""The `visits.transition` OSWorld writes (a link, chain start and end)."""


class BrowserUnavailable(VMError):
    """The VM's Chrome cannot be reached (no DevTools endpoint configured, or none answers), or a setting a
    browser step needs is missing: an environment fault, never the policy's."""


def devtools_url(vm_address: str, port: int) -> str | None:
    """Chrome's DevTools endpoint on the VM whose server is at `vm_address` (`http://HOST:PORT`): the same
    host at `port`, as OSWorld reaches it. None for a VM on a Unix socket (a local desktop has no network)
    or with no port configured."""
    parsed = urllib.parse.urlsplit(vm_address)
    if not port or parsed.scheme not in ("http", "https") or not parsed.hostname:
        return None
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    return f"http://{host}:{port}"


async def browser_endpoint(url: str) -> str:
    """The browser's WebSocket endpoint at the DevTools endpoint `url` (`/json/version`), pointed at `url`'s
    own host and port: what the VM names is not followed elsewhere (Playwright would connect to any host the
    VM's answer names), and a tunnelled endpoint stays in its tunnel."""
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CONNECT_TIMEOUT_S)) as http:
            async with http.get(url.rstrip("/") + "/json/version") as resp:
                version = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise BrowserUnavailable(f"Chrome's DevTools at {url} did not answer: {exc}") from exc
    named = version.get("webSocketDebuggerUrl") if isinstance(version, dict) else None
    path = urllib.parse.urlsplit(named).path if isinstance(named, str) else ""
    if not path.startswith("/devtools/browser/"):
        raise BrowserUnavailable(f"Chrome's DevTools at {url} named no browser endpoint: {named!r}")
    return f"ws://{urllib.parse.urlsplit(url).netloc}{path}"


@contextlib.asynccontextmanager
async def devtools(ctx: TaskContext) -> AsyncIterator[Any]:
    """A Playwright `Browser` connected over CDP to the VM's Chrome; disconnected (Chrome keeps running)
    on exit."""
    if not ctx.devtools_url:
        raise BrowserUnavailable(
            "this step needs the VM's Chrome DevTools endpoint (Chrome started with --remote-debugging-port, "
            "reachable from the host): set env.chromium_port (9222, where OSWorld's tasks expose it)"
        )
    try:
        from playwright.async_api import Error as PlaywrightError
        from playwright.async_api import async_playwright
    except ImportError as exc:
        raise BrowserUnavailable(
            "the browser steps need Playwright: install guirl's `osworld` extra"
        ) from exc
    url = ctx.devtools_url
    async with async_playwright() as pw:

        async def connect() -> Any:
            endpoint = await browser_endpoint(url)  # refused or silent: Chrome may still be starting
            try:
                return await pw.chromium.connect_over_cdp(endpoint, timeout=CONNECT_TIMEOUT_S * 1000)
            except PlaywrightError as exc:
                raise BrowserUnavailable(f"Chrome's DevTools at {url} did not answer: {exc}") from exc

        # OSWorld tries for over a minute (Chrome is launched by the step before); connecting is idempotent
        browser = await retry_idempotent(
            connect, attempts=CONNECT_ATTEMPTS, initial=1.0, cap=8.0, is_transient=lambda e: True
        )
        try:
            yield browser
        except PlaywrightError as exc:  # the browser went away or refused a command mid-step
            raise BrowserUnavailable(f"Chrome's DevTools at {url}: {exc}") from exc
        finally:
            # for a CDP connection this only disconnects: Chrome and the profile's tabs stay
            with contextlib.suppress(Exception):
                await browser.close()


def default_context(browser: Any) -> Any:
    """The profile's own browsing context (its cookies and tabs), as OSWorld's `browser.contexts[0]`."""
    if not browser.contexts:
        raise BrowserUnavailable("Chrome's DevTools shows no browsing context (no window open)")
    return browser.contexts[0]


async def _chrome_open_tabs(client: VMClient, ctx: TaskContext, urls_to_open: list[str]) -> None:
    async with devtools(ctx) as browser:
        context = default_context(browser)
        blank = list(context.pages[:1])
        for url in urls_to_open:
            page = await context.new_page()
            try:
                await page.goto(url, timeout=PAGE_TIMEOUT_MS)
            except Exception:  # noqa: BLE001  (a slow or failing site still leaves its tab, as in OSWorld)
                pass
        for page in blank:  # OSWorld closes the tab Chrome started with, once the first URL has a tab
            if urls_to_open:
                await page.close()


async def _chrome_close_tabs(client: VMClient, ctx: TaskContext, urls_to_close: list[str]) -> None:
    from guirl.vmpool.tasks.metrics.browser import same_url

    async with devtools(ctx) as browser:
        context = default_context(browser)
        for url in urls_to_close:
            page = next((p for p in context.pages if same_url(p.url, url)), None)
            if page is not None:  # the first tab showing it, as OSWorld closes
                await page.close()


def _chrome_time(moment: datetime) -> int:
    """Chrome's timestamps: microseconds since 1601-01-01."""
    return int((moment - _CHROME_EPOCH).total_seconds() * 1_000_000)


def add_history(db: Path, history: list[dict[str, Any]], now: datetime | None = None) -> None:
    """Add OSWorld's fake visits (`url`, `title`, `visit_time_from_now_in_seconds`) to a History database."""
    now = now or datetime.now()
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        for item in history:
            stamp = _chrome_time(now - timedelta(seconds=item["visit_time_from_now_in_seconds"]))
            cursor = conn.execute(
                "INSERT INTO urls (url, title, visit_count, typed_count, last_visit_time, hidden) "
                "VALUES (?, ?, 1, 0, ?, 0)",
                (item["url"], item["title"], stamp),
            )
            conn.execute(
                "INSERT INTO visits (url, visit_time, from_visit, transition, segment_id, visit_duration) "
                "VALUES (?, ?, 0, ?, 0, 0)",
                (cursor.lastrowid, stamp, _TYPED_LINK),
            )


async def _update_browse_history(client: VMClient, ctx: TaskContext, history: list[dict[str, Any]]) -> None:
    template = await fetch(HISTORY_TEMPLATE_URL, ctx.download_cache)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "History"
        db.write_bytes(template.read_bytes())
        await asyncio.to_thread(add_history, db, history)
        target = f"{ctx.chrome_profile_dir}/Default/History"
        await client.upload(target, db.read_bytes())
    # the path may start with ~ (the home, from the shell's $HOME); the rest is quoted
    home, rest = ('"$HOME"', target[1:]) if target.startswith("~/") else ("", target)
    await client.execute(["bash", "-c", f"chown -R user:user {home}{shlex.quote(rest)} 2>/dev/null || true"])


async def _googledrive(client: VMClient, ctx: TaskContext, **config: Any) -> None:
    from guirl.vmpool.tasks.google_drive import GoogleDrive

    async with GoogleDrive.from_settings(ctx.google_drive_settings) as drive:
        await drive.run_setup(config, ctx.download_cache)


async def _login(client: VMClient, ctx: TaskContext, platform: str, settings_file: str = "") -> None:
    if platform != "googledrive":
        raise BrowserUnavailable(f"login: platform {platform!r} is not implemented (OSWorld has googledrive)")
    if not ctx.google_account:
        raise BrowserUnavailable(
            "login needs the Google account: set env.google_account to a JSON file {email, password}"
        )
    account = json.loads(Path(ctx.google_account).read_text())
    async with devtools(ctx) as browser:
        page = await default_context(browser).new_page()
        try:
            await page.goto("https://drive.google.com/drive/my-drive", timeout=PAGE_TIMEOUT_MS)
        except Exception:  # noqa: BLE001  (OSWorld carries on with a slow page)
            pass
        try:  # OSWorld's sign-in sequence; a page that is not the sign-in form ends the step, as there
            await page.wait_for_selector('input[type="email"]', state="visible", timeout=3000)
            await page.fill('input[type="email"]', account["email"])
            await page.click("#identifierNext > div > button")
            await page.wait_for_selector('input[type="password"]', state="visible", timeout=5000)
            await page.fill('input[type="password"]', account["password"])
            await page.click("#passwordNext > div > button")
            await page.wait_for_load_state("load", timeout=5000)
        except Exception:  # noqa: BLE001  (Playwright's timeout: already signed in, or a changed page)
            pass


HANDLERS = {
    "chrome_open_tabs": _chrome_open_tabs,
    "chrome_close_tabs": _chrome_close_tabs,
    "update_browse_history": _update_browse_history,
    "googledrive": _googledrive,
    "login": _login,
}
"""Setup step types for setup.py's `_HANDLERS`, by OSWorld's names."""
