"""Chrome's setup steps and getters against a real headless Chromium, and parity with OSWorld's.

One Chromium per module, started as OSWorld's image starts Chrome (a user-data directory in the VM
user's home, a remote-debugging port, here chosen by Chromium: `--remote-debugging-port=0`, read from the
"DevTools listening on" line it prints). Pages come from an HTTP server on 127.0.0.1, profile files are
read through a real local VM whose home holds that user-data directory. OSWorld's own getters
(desktop-env 1.0.2 `getters/chrome.py`) run against the same Chromium and files, from a thread (they use
Playwright's sync API), given an `env` that answers what they ask: the VM's files, and an
accessibility tree whose address bar shows the active tab (OSWorld's VM server reads that from AT-SPI; the
browser here is not on the VM's desktop, whose accessibility is turned off: guirl's getters fall back to
DevTools, as on any desktop without a tree). Metrics are checked for parity on the getters' real outputs.

The tests share the browser and run in file order; the last one shuts Chromium down so that it writes
its profile (History, Cookies, Preferences) to disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import re
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import pytest
from aiohttp import web

from guirl.vmpool.client import VMClient
from guirl.vmpool.local import LocalProvider
from guirl.vmpool.tasks.files import cache_path
from guirl.vmpool.tasks.getters import GETTERS
from guirl.vmpool.tasks.metrics import METRICS
from guirl.vmpool.tasks.setup import TaskContext
from guirl.vmpool.tasks.setup_chrome import HANDLERS, HISTORY_TEMPLATE_URL, BrowserUnavailable
from tests.osworld_reference import reference

CHROMIUM = shutil.which("chromium")

REF = reference("getters.chrome", absent=["pydrive", "pydrive.auth", "pydrive.drive"])
REF_METRICS = reference("metrics.chrome", absent=["borb", "borb.pdf"])
PROFILE = ".config/google-chrome"

_PAGE = """<html><head><title>{title}</title></head><body>
<div class="location-info">Boston Logan</div><div class="location-info">New York</div>
<div class="sep">SEA<div class="aura"></div>NYC</div>
<span class="chip">Black</span><span class="chip">On sale</span><span class="chip">Blue</span>
<div class="card"><h3> First card </h3></div><div class="card"><p>no heading</p></div>
<a class="filter-selector-link">Women</a><a class="filter-selector-link">Nike</a>
<form><label>Name</label><input id="q" value=" typed text "></form>
<p id="rank"> 42 </p><a id="next" href="/page/second">next</a>
<ul class="cats"><li class="catAllProducts"><span>Shoes</span></li></ul>
</body></html>"""


async def _page(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    items = request.query.get("items", "")
    body = _PAGE.format(title=name.capitalize()) + "".join(f"<p>{i}</p>" for i in items.split(",") if i)
    resp = web.Response(text=body, content_type="text/html")
    resp.set_cookie("visited", name, max_age=3600)
    return resp


@dataclass
class Browser:
    """The module's Chromium, its pages' server, the VM holding its profile, and how to reach each."""

    loop: asyncio.AbstractEventLoop
    client: VMClient
    ctx: TaskContext
    home: Path
    site: str
    port: int
    proc: asyncio.subprocess.Process

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, 60))

    def get(self, config: dict[str, Any]) -> Any:
        return self.run(GETTERS[config["type"]](config, self.client, self.ctx))

    def both(self, calls: list[tuple[dict[str, Any], str | None, str | None]]) -> list[tuple[Any, Any]]:
        """guirl's getter and OSWorld's (`ref_fn`, given `omnibox` as the address bar; None: guirl's alone)
        for each config, all at once (each waits for its pages to go network-idle): `[(ours, theirs)]`."""

        async def nothing() -> None:
            return None

        async def main() -> list[Any]:
            ours = [GETTERS[c["type"]](c, self.client, self.ctx) for c, _, _ in calls]
            theirs = [
                asyncio.to_thread(getattr(REF, fn), _ref_env(self, box), dict(c)) if fn else nothing()
                for c, fn, box in calls
            ]
            return await asyncio.gather(*ours, *theirs)

        got = self.run(main())
        return list(zip(got[: len(calls)], got[len(calls) :], strict=True))

    def setup(self, kind: str, **parameters: Any) -> None:
        self.run(HANDLERS[kind](self.client, self.ctx, **parameters))


def _seed_profile(root: Path, bookmarks: dict[str, Any]) -> None:
    """Settings a task would have changed, written before Chromium starts (it keeps and rewrites them)."""
    (root / "Default").mkdir(parents=True)
    prefs = {
        "webkit": {"webprefs": {"default_font_size": 20}},
        "enable_do_not_track": True,
        "profile": {"name": "Research", "default_content_setting_values": {"images": 1}},
        "session": {"restore_on_startup": 5},
        "safebrowsing": {"enabled": False},
        "default_search_provider_data": {"template_url_data": {"short_name": "Bing", "keyword": "bing.com"}},
    }
    (root / "Default" / "Preferences").write_text(json.dumps(prefs))
    (root / "Local State").write_text(
        json.dumps({"browser": {"enabled_labs_experiments": ["smooth-scrolling@2"]}})
    )
    (root / "Default" / "Bookmarks").write_text(json.dumps(bookmarks))


BOOKMARKS = {
    "version": 1,
    "roots": {
        "bookmark_bar": {
            "type": "folder",
            "name": "Bookmarks bar",
            "id": "1",
            "children": [
                {"type": "folder", "name": "Favorites", "id": "4", "children": []},
                {
                    "type": "folder",
                    "name": "Liked Authors",
                    "id": "5",
                    "children": [
                        {"type": "url", "name": "Jim", "id": "6", "url": "https://jimfan.me/"},
                        {"type": "url", "name": "Ann", "id": "7", "url": "https://ann.example/"},
                    ],
                },
                {
                    "type": "url",
                    "name": "Transformer",
                    "id": "8",
                    "url": "https://jalammar.github.io/illustrated-transformer/",
                },
            ],
        },
        "other": {"type": "folder", "name": "Other bookmarks", "id": "2", "children": []},
        "synced": {"type": "folder", "name": "Mobile bookmarks", "id": "3", "children": []},
    },
}


async def _start(tmp: Path) -> tuple[Any, ...]:
    app = web.Application()
    app.router.add_get("/page/{name}", _page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    # the browser runs beside the VM: a tree of the VM's desktop would not show it (no AT-SPI there, so the
    # active tab comes from DevTools)
    provider = LocalProvider(tmp / "vms", width=800, height=600, accessibility=False)
    vm = await provider.create("chrome")
    home = provider.vms[vm].dir / "home"
    _seed_profile(home / PROFILE, BOOKMARKS)
    extension = tmp / "extension"
    extension.mkdir()
    (extension / "manifest.json").write_text(
        json.dumps({"manifest_version": 3, "name": "Probe", "version": "1"})
    )
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM,
        "--headless=new",
        "--no-sandbox",
        "--no-first-run",
        "--no-default-browser-check",
        "--remote-debugging-port=0",
        f"--user-data-dir={home / PROFILE}",
        f"--load-extension={extension}",
        "--disable-features=DisableLoadExtensionCommandLineSwitch",
        "about:blank",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    while (
        line := await asyncio.wait_for(proc.stderr.readline(), 30)
    ) and b"DevTools listening on" not in line:
        pass
    match = re.search(rb"ws://([\d.]+:\d+)/", line)
    assert match, f"Chromium did not say where DevTools listens: {line!r}"
    # Chromium keeps writing to stderr: drain it so it never blocks on a full pipe
    drain = asyncio.ensure_future(proc.stderr.read())
    ctx = TaskContext(
        task_id="chrome",
        cache_dir=tmp / "cache",
        download_cache=tmp / "downloads",
        devtools_url=f"http://{match.group(1).decode()}",
    )
    ctx.cache_dir.mkdir()
    client = VMClient(provider.address(vm), timeout_s=30)
    return runner, provider, vm, home, proc, drain, ctx, client, port


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    if CHROMIUM is None:
        pytest.fail("needs Debian's chromium package (apt-get install chromium)", pytrace=False)
    if importlib.util.find_spec("playwright") is None:
        pytest.fail("needs Playwright (guirl's `osworld` extra)", pytrace=False)
    loop = asyncio.new_event_loop()
    tmp = tmp_path_factory.mktemp("chrome")
    runner, provider, vm, home, proc, drain, ctx, client, port = loop.run_until_complete(_start(tmp))
    try:
        yield Browser(loop, client, ctx, home, f"http://127.0.0.1:{port}", port, proc)
    finally:
        if proc.returncode is None:
            proc.kill()
        loop.run_until_complete(proc.wait())
        drain.cancel()
        with contextlib.suppress(BaseException):
            loop.run_until_complete(drain)
        loop.run_until_complete(client.close())
        loop.run_until_complete(provider.delete(vm))
        loop.run_until_complete(runner.cleanup())
        loop.close()


class _Controller:
    """What OSWorld's getters ask of `env.controller`, answered from this VM's home and the browser."""

    def __init__(self, home: Path, omnibox: str | None) -> None:
        self.home, self.omnibox = home, omnibox

    def _local(self, path: str) -> Path:
        return self.home / Path(path).relative_to("/home/user")

    def execute_python_command(self, code: str) -> dict[str, str]:
        out = subprocess.run(
            ["python3", "-c", code], env={"HOME": "/home/user"}, capture_output=True, text=True
        )
        return {"output": out.stdout}

    def get_file(self, path: str) -> bytes | None:
        local = self._local(path)
        return local.read_bytes() if local.is_file() else None

    def get_vm_desktop_path(self) -> str:
        return "/home/user/Desktop"

    def get_vm_directory_tree(self, path: str) -> dict[str, Any]:
        return {"children": [{"name": p.name} for p in sorted(self._local(path).iterdir())]}

    def get_accessibility_tree(self) -> str:
        # the shape of OSWorld's AT-SPI tree around Chrome's address bar
        ns = 'xmlns:st="uri:deskat:state.at-spi.gnome.org"'
        entry = f'<entry name="Address and search bar">{escape(self.omnibox)}</entry>' if self.omnibox else ""
        app = f'<application name="Google Chrome"><frame>{entry}</frame></application>'
        return f"<desktop-frame {ns}>{app}</desktop-frame>"


@dataclass
class _Env:
    controller: _Controller
    cache_dir: str
    chromium_port: int
    vm_ip: str = "127.0.0.1"
    server_port: int = 1
    vm_platform: str = "Linux"
    current_use_proxy: bool = False


def _ref_env(b: Browser, omnibox: str | None = None) -> _Env:
    port = int(b.ctx.devtools_url.rsplit(":", 1)[1]) if b.ctx.devtools_url else 0
    return _Env(_Controller(b.home, omnibox), str(b.ctx.cache_dir), port)


def _ref(b: Browser, fn: str, config: dict[str, Any], omnibox: str | None = None) -> Any:
    """OSWorld's getter `fn`, run in a thread: its sync Playwright cannot run inside this event loop."""
    env = _ref_env(b, omnibox)
    return b.run(asyncio.to_thread(getattr(REF, fn), env, dict(config)))


def _both(metric: str, result: Any, rule: Any, expected_score: float) -> None:
    ours = METRICS[metric](result, rule)
    theirs = getattr(REF_METRICS, metric)(result, json.loads(json.dumps(rule)))
    assert (float(ours), float(theirs)) == (expected_score, expected_score), metric


def _hostless(url: str) -> str:
    """What Chrome's address bar shows for a loopback URL (the scheme elided)."""
    return url.removeprefix("http://")


def _sorted(tabs: list[dict[str, str]]) -> list[tuple[str, str]]:
    return sorted((t["url"], t["title"]) for t in tabs)


def test_open_and_close_tabs_then_the_tabs_getter(browser: Browser) -> None:
    site = browser.site
    urls = [f"{site}/page/alpha", f"{site}/page/beta", f"{site}/page/gamma"]
    browser.setup("chrome_open_tabs", urls_to_open=urls)
    browser.setup("chrome_close_tabs", urls_to_close=[f"{site}/page/beta", f"{site}/page/none"])
    [(tabs, theirs)] = browser.both([({"type": "open_tabs_info"}, "get_open_tabs_info", None)])
    # the blank start tab closed as OSWorld does, and beta; DevTools lists tabs in no set order
    assert _sorted(tabs) == _sorted(theirs) == [(urls[0], "Alpha"), (urls[2], "Gamma")]
    _both("is_expected_tabs", tabs, {"type": "url", "urls": [urls[2], urls[0]]}, 1.0)
    _both("is_expected_tabs", tabs, {"type": "url", "urls": ["https://www.127.0.0.1/", urls[0]]}, 0.0)
    _both("is_expected_tabs", tabs, {"type": "url", "urls": urls}, 0.0)


def _front(browser: Browser, url: str) -> None:
    async def go() -> None:
        from playwright.async_api import async_playwright

        async with async_playwright() as pw:
            b = await pw.chromium.connect_over_cdp(browser.ctx.devtools_url)
            page = await b.contexts[0].new_page()
            await page.goto(url)
            await page.bring_to_front()

    browser.run(go())


def test_active_tab_getters_and_their_metrics(browser: Browser) -> None:
    url = f"{browser.site}/page/search?q=nereida&hl=en&tags=a,b"
    _front(browser, url)
    # the VM has no AT-SPI tree: the active tab comes from DevTools, whole
    assert browser.get({"type": "active_url_from_accessTree", "goto_prefix": "https://www."}) == url
    [(info, theirs)] = browser.both(
        [({"type": "active_tab_info", "goto_prefix": "http://"}, "get_active_tab_info", _hostless(url))]
    )
    assert (
        {k: info[k] for k in ("title", "url")}
        == {k: theirs[k] for k in ("title", "url")}
        == {
            "title": "Search",
            "url": url,
        }
    )
    assert "typed text" in info["content"] and info["content"] == theirs["content"]
    _both("is_expected_active_tab", info, {"type": "url", "url": url}, 1.0)
    _both("is_expected_active_tab", info, {"type": "url", "url": f"{browser.site}/page/other"}, 0.0)
    _both("is_expected_url_pattern_match", info, {"expected": ["/page/search", "q=nereida"]}, 1.0)
    _both("is_expected_url_pattern_match", info, {"expected": ["/page/search", "q=other"]}, 0.0)
    _both("is_expected_search_query", info, {"expect": {"pattern": r"(?i)search\?q=nereida(?:&|$)"}}, 1.0)
    _both(
        "is_expected_active_tab_approximate", info, {"type": "url", "url": f"{browser.site}/page/search"}, 1.0
    )
    # the URL getters parse what the active tab shows, as OSWorld's do
    parse = {"type": "active_tab_url_parse", "parse_keys": ["q", "hl", "missing"], "replace": {"hl": "lang"}}
    assert (
        browser.get(parse)
        == _ref(browser, "get_active_tab_url_parse", parse, omnibox=url)
        == {
            "q": "nereida",
            "missing": "",
            "lang": "en",
        }
    )
    split = {"type": "active_tab_url_parse", "parse_keys": ["tags"], "split_list": True}
    assert browser.get(split) == {"tags": ["a", "b"]}
    dash = {
        "type": "url_dashPart",
        "partIndex": -1,
        "needDeleteId": True,
        "returnType": "json",
        "key": "time",
    }
    assert browser.get(dash) == _ref(browser, "get_url_dashPart", dash, omnibox=url) == {"time": "search"}


def test_html_parse_reads_the_active_tab_as_osworld_does(browser: Browser) -> None:
    url = f"{browser.site}/page/listing"
    browser.setup("chrome_open_tabs", urls_to_open=[url])  # the new tab is the active one
    configs = [
        {
            "category": "class",
            "class_multiObject": {"location-info": {"0": "start", "1": "end", "5": "absent"}},
            "class_multiObject_child": {"sep": {"0": "from", "1": "to"}},
            "class_multiObject_only_child": {"card": {"0": "heading"}},
            "class_multiObject_search_exist": {"chip": ["Black", "On sale", "Red", "is_other_exist"]},
            "class_singleObject": {"chip": "first_chip", "nothing-here": "none"},
        },
        {"category": "xpath", "xpathObject": {"/html/body/p[1]": "rank", "/html/body/table": "missing"}},
        {
            "category": "class&url",
            "class_multiObject": {"filter-selector-link": ["women", "nike"]},
            "class_multiObject_li": {"cats": ["shoes"]},
            "url_include_expected": ["listing", "jerseys"],
            "url_include_expected_multichoice": {"page/": "paged"},
        },
    ]
    expected = [
        {
            "start": "Boston Logan",
            "end": "New York",
            "absent": "",
            "from": "SEA",
            "to": "NYC",
            "heading": "First card",
            "Black": True,
            "On sale": True,
            "Red": False,
            "is_other_exist": True,
            "first_chip": "Black",
            "none": "",
        },
        {"rank": "42", "missing": ""},
        {
            "women": True,
            "nike": True,
            "is_other_exist": False,
            "shoes": True,
            "listing": True,
            "jerseys": False,
            "paged": True,
        },
    ]
    # the suite's categories; OSWorld's getter checked on two (each call waits for every tab to settle)
    refs = ["get_active_tab_html_parse", None, "get_active_tab_html_parse"]
    calls = [
        ({"type": "active_tab_html_parse", "goto_prefix": "http://", **c}, fn, _hostless(url))
        for c, fn in zip(configs, refs, strict=True)
    ]
    for (ours, theirs), fn, want in zip(browser.both(calls), refs, expected, strict=True):
        assert ours == want and (fn is None or theirs == want)


def test_page_info_cart_pdf_and_website_facts(browser: Browser) -> None:
    cart = f"{browser.site}/page/cart?items=The%20Dota%202%20Official%20Soundtrack"
    facts = {
        "type": "info_from_website",
        "url": f"{browser.site}/page/profile",
        "infos": [
            {"action": "inner_text", "selector": "#rank"},
            {"action": "attribute", "selector": "#next", "attribute": "href"},
            {"action": "click_and_inner_text", "selector": ["#next", "title"]},
        ],
        "backups": ["fallback"],
    }
    gone = {**facts, "url": "http://127.0.0.1:1/"}  # a site that does not answer: the task's backups
    pdf = {"type": "pdf_from_url", "path": f"{browser.site}/page/article", "dest": "article.pdf"}
    # OSWorld's page_info loads a URL as its active_tab_info does (checked above): guirl's alone here
    (info, _), (read, their_read), (backup, _), (printed, _) = browser.both(
        [
            ({"type": "page_info", "url": cart}, None, None),
            (facts, "get_info_from_website", None),
            (gone, None, None),
            (pdf, None, None),
        ]
    )
    assert (info["title"], info["url"]) == ("Cart", cart) and "Soundtrack" in info["content"]
    _both("is_added_to_steam_cart", info, {"items": ["The Dota 2 Official Soundtrack"]}, 1.0)
    _both("is_added_to_steam_cart", info, {"items": ["The Dota 2 Official Soundtrack", "Portal"]}, 0.0)
    assert read == their_read == ["42", "/page/second", "Second"]
    assert backup == ["fallback"]
    assert Path(printed).read_bytes()[:5] == b"%PDF-" and Path(printed).stat().st_size > 1000


def test_no_devtools_endpoint_is_an_environment_error(browser: Browser) -> None:
    bare = TaskContext(
        task_id="t", cache_dir=browser.ctx.cache_dir, download_cache=browser.ctx.download_cache
    )
    with pytest.raises(BrowserUnavailable, match="env.chromium_port"):
        browser.run(HANDLERS["chrome_open_tabs"](browser.client, bare, urls_to_open=["http://127.0.0.1:1/"]))
    with pytest.raises(BrowserUnavailable, match="env.chromium_port"):
        browser.run(GETTERS["open_tabs_info"]({"type": "open_tabs_info"}, browser.client, bare))
    with pytest.raises(BrowserUnavailable, match="env.chromium_port"):  # no AT-SPI on this VM, no DevTools
        browser.run(GETTERS["active_tab_info"]({"type": "active_tab_info"}, browser.client, bare))
    with pytest.raises(BrowserUnavailable, match="google_drive_settings"):
        browser.run(HANDLERS["googledrive"](browser.client, bare, operation=["delete"], args=[{"query": ""}]))
    drive = {"type": "googledrive_file", "path": ["a", "b.pdf"], "dest": "b.pdf"}
    with pytest.raises(BrowserUnavailable, match="google_drive_settings"):
        browser.run(GETTERS["googledrive_file"](drive, browser.client, bare))
    with pytest.raises(BrowserUnavailable, match="google_account"):
        browser.run(HANDLERS["login"](browser.client, bare, platform="googledrive", settings_file="x.json"))


PROFILE_GETTERS = {
    "default_search_engine": "get_default_search_engine",
    "profile_name": "get_profile_name",
    "chrome_font_size": "get_chrome_font_size",
    "bookmarks": "get_bookmarks",
    "enable_do_not_track": "get_enable_do_not_track",
    "enable_safe_browsing": "get_enable_safe_browsing",
    "new_startup_page": "get_new_startup_page",
    "find_unpacked_extension_path": "get_find_unpacked_extension_path",
    "data_delete_automacally": "get_data_delete_automacally",
    "enabled_experiments": "get_enabled_experiments",
}


def test_profile_files_chromium_wrote(browser: Browser) -> None:
    """Last: Chromium is shut down so that it writes its profile, then read through the VM."""

    async def shut_down() -> None:
        from playwright.async_api import async_playwright

        async with async_playwright() as pw:
            b = await pw.chromium.connect_over_cdp(browser.ctx.devtools_url)
            await (await b.new_browser_cdp_session()).send("Browser.close")
        await asyncio.wait_for(browser.proc.wait(), 30)

    browser.run(shut_down())
    got = {name: browser.get({"type": name}) for name in PROFILE_GETTERS}
    assert got == {name: _ref(browser, fn, {}) for name, fn in PROFILE_GETTERS.items()}
    assert got["default_search_engine"] == "Bing" and got["profile_name"] == "Research"
    assert got["chrome_font_size"]["default_font_size"] == 20
    assert (got["enable_do_not_track"], got["enable_safe_browsing"], got["new_startup_page"]) == (
        "true",
        "false",
        "true",
    )
    assert got["data_delete_automacally"] == "true" and got["enabled_experiments"] == ["smooth-scrolling@2"]
    assert any(p.endswith("/extension") for p in got["find_unpacked_extension_path"])
    _both("check_font_size", got["chrome_font_size"], {"type": "range", "min": 16, "max": 99999}, 1.0)
    _both("check_font_size", got["chrome_font_size"], {"type": "value", "value": 16}, 0.0)
    _both(
        "check_enabled_experiments",
        got["enabled_experiments"],
        {"type": "names", "names": ["smooth-scrolling"]},
        1.0,
    )
    _both("check_enabled_experiments", got["enabled_experiments"], {"type": "names", "names": []}, 0.0)
    marks = got["bookmarks"]
    _both(
        "is_expected_bookmarks",
        marks,
        {"type": "bookmark_bar_folders_names", "names": ["Liked Authors", "Favorites"]},
        1.0,
    )
    _both("is_expected_bookmarks", marks, {"type": "bookmark_bar_folders_names", "names": ["Favorites"]}, 0.0)
    transformer = "https://jalammar.github.io/illustrated-transformer/"
    _both("is_expected_bookmarks", marks, {"type": "bookmark_bar_websites_urls", "urls": [transformer]}, 1.0)
    liked = {
        "type": "liked_authors_websites_urls",
        "urls": [["https://x.example/", "https://jimfan.me/"], "https://ann.example/"],
    }
    _both("is_expected_bookmarks", marks, liked, 1.0)
    _both("is_expected_bookmarks", marks, {**liked, "urls": [["https://jimfan.me/"]]}, 0.0)
    # the extension loaded from a directory has no manifest in Preferences: OSWorld's getter fails on it
    # (its "Google" fallback), guirl's lists the names it can read
    assert _ref(browser, "get_find_installed_extension_name", {}) == "Google"
    names = browser.get({"type": "find_installed_extension_name"})
    assert "Chromium PDF Viewer" in names
    _both("is_expected_installed_extensions", names, {"expected": ["Chromium PDF Viewer"]}, 1.0)
    _both("is_expected_installed_extensions", names, {"expected": ["Zoom Chrome Extension"]}, 0.0)

    cookies = browser.get({"type": "cookie_data", "dest": "Cookies"})
    assert cookies == _ref(browser, "get_cookie_data", {"dest": "Cookies-ref"})
    assert {row[1] for row in cookies} == {"127.0.0.1"}
    _both("is_cookie_deleted", cookies, {"type": "domains", "domains": ["127.0.0.1"]}, 0.0)
    _both("is_cookie_deleted", cookies, {"type": "domains", "domains": [".amazon.com"]}, 1.0)
    visited = browser.get({"type": "history", "dest": "history.sqlite"})
    assert visited == _ref(browser, "get_history", {"dest": "history-ref.sqlite"})
    assert any("/page/alpha" in row[0] for row in visited)
    _both("check_history_deleted", visited, {"type": "keywords", "keywords": ["alpha"]}, 0.0)
    _both("check_history_deleted", visited, {"type": "keywords", "keywords": ["youtube"]}, 1.0)

    # update_browse_history: OSWorld's empty History (here Chromium's own, emptied) gets the fake visits
    template = cache_path(browser.ctx.download_cache, HISTORY_TEMPLATE_URL)
    template.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(browser.ctx.cache_dir / "history.sqlite", template)
    with contextlib.closing(sqlite3.connect(template)) as conn, conn:
        conn.execute("DELETE FROM urls")
        conn.execute("DELETE FROM visits")
    fake = [
        {"url": "https://www.youtube.com/watch?v=1", "title": "Video", "visit_time_from_now_in_seconds": 3600}
    ]
    browser.setup("update_browse_history", history=fake)
    visited = browser.get({"type": "history", "dest": "history2.sqlite"})
    assert [row[:2] for row in visited] == [("https://www.youtube.com/watch?v=1", "Video")]
    _both("check_history_deleted", visited, {"type": "keywords", "keywords": ["youtube"]}, 0.0)

    # shortcuts on the Desktop (files an agent's "Install as app" writes)
    desktop = browser.home / "Desktop"
    desktop.mkdir(exist_ok=True)
    (desktop / "chrome-app.desktop").write_text(
        "[Desktop Entry]\nName=Tetris\nExec=/opt/google/chrome/google-chrome --app-id=x\n"
    )
    (desktop / "notes.txt").write_text("Name=Tetris\n")
    shortcuts = browser.get({"type": "shortcuts_on_desktop"})
    assert shortcuts == _ref(browser, "get_shortcuts_on_desktop", {}) and list(shortcuts) == [
        "chrome-app.desktop"
    ]
    _both("is_shortcut_on_desktop", shortcuts, {"type": "name", "name": "Tetris"}, 1.0)
    _both(
        "is_shortcut_on_desktop",
        shortcuts,
        {"type": "exec", "exec": "/opt/google/chrome/google-chrome --app-id=x"},
        1.0,
    )
    _both("is_shortcut_on_desktop", shortcuts, {"type": "name", "name": "Tetr"}, 0.0)
