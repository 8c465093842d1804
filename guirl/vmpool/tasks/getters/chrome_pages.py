"""Chrome's pages through DevTools (OSWorld's Playwright getters in getters/chrome.py): the open tabs, the
active tab reloaded, a page's HTML, elements of the active tab, facts read off a web site, a page printed
to PDF.

Pages are opened in the profile's own context (its cookies and session), where OSWorld's `new_page()`
opens a fresh incognito-like one: a cart or a signed-in page then shows what the agent left there.
A site that does not load within the budget is read as far as it loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote

from guirl.vmpool.client import VMClient
from guirl.vmpool.tasks.getters.base import Getter
from guirl.vmpool.tasks.getters.chrome import active_url
from guirl.vmpool.tasks.setup import TaskContext
from guirl.vmpool.tasks.setup_chrome import PAGE_TIMEOUT_MS, BrowserUnavailable, default_context, devtools

REQUIRES = ("playwright",)
"""Modules beyond guirl's own dependencies that this module's functions import (the `osworld` extra)."""

SETTLE_MS = 10_000
"""How long a loaded page may take to go network-idle before it is read anyway."""
ELEMENT_TIMEOUT_MS = 10_000
"""How long `info_from_website` waits for an element (OSWorld's)."""

_DIRECT_TEXT = """(node) => Array.from(node.childNodes)
    .filter(n => n.nodeType === Node.TEXT_NODE).map(n => n.textContent.trim()).filter(Boolean)"""


async def _settle(page: Any) -> None:
    """Wait for the network to go quiet, within SETTLE_MS; a busy page is read as it is."""
    with contextlib.suppress(Exception):
        await page.wait_for_load_state("networkidle", timeout=SETTLE_MS)


@contextlib.asynccontextmanager
async def _new_tab(browser: Any) -> AsyncIterator[Any]:
    page = await default_context(browser).new_page()
    try:
        yield page
    finally:
        with contextlib.suppress(Exception):
            await page.close()


async def _load(browser: Any, url: str) -> dict[str, Any] | None:
    """`{title, url, content}` of `url` loaded in a new tab, None when it does not load at all."""
    async with _new_tab(browser) as page:
        try:
            await page.goto(url, wait_until="load", timeout=PAGE_TIMEOUT_MS)
        except Exception:  # noqa: BLE001  (Playwright's navigation errors: DNS, refused, timeout)
            # nothing arrived (Chrome's error page): OSWorld's None; a slow page is read as far as it got
            if page.url in ("", "about:blank") or page.url.startswith("chrome-error://"):
                return None
        await _settle(page)
        return {"title": await page.title(), "url": page.url, "content": await page.content()}


async def open_tabs_info(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """Every open tab's `{title, url}`."""

    async def tab(page: Any) -> dict[str, str]:
        await _settle(page)
        try:
            title = await page.title()
        except Exception:  # noqa: BLE001  (the page is navigating: OSWorld's placeholder title)
            title = "Error encountered"
        return {"title": title, "url": page.url}

    async with devtools(ctx) as browser:
        # the tabs settle together: each waits for half a second of network quiet
        return list(await asyncio.gather(*(tab(p) for c in browser.contexts for p in c.pages)))


async def active_tab_info(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """The active tab's URL reloaded in a new tab: `{title, url, content}` (None when it does not load)."""
    url = await active_url(config, client, ctx)
    if url is None:
        return None
    async with devtools(ctx) as browser:
        return await _load(browser, url)


async def page_info(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """`config["url"]` loaded in a new tab: `{title, url, content}`."""
    async with devtools(ctx) as browser:
        info = await _load(browser, config["url"])
    return info or {"title": "Connection failed", "url": config["url"], "content": ""}


async def pdf_from_url(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """`config["path"]` (a URL) printed to PDF by the VM's Chrome, saved as `dest` in the task's cache."""
    dest = ctx.cache_dir / config["dest"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    async with devtools(ctx) as browser, _new_tab(browser) as page:
        try:
            await page.goto(config["path"], wait_until="load", timeout=PAGE_TIMEOUT_MS)
        except Exception as exc:  # noqa: BLE001
            # the gold file of a task: not having it is the environment's fault (OSWorld scores an empty PDF)
            raise BrowserUnavailable(f"pdf_from_url: {config['path']} did not load: {exc}") from exc
        await _settle(page)
        await page.pdf(path=str(dest))
    return str(dest)


def _same_page(a: str, b: str) -> bool:
    return unquote(a).rstrip("/") == unquote(b).rstrip("/")


async def _texts(page: Any, selector: str) -> list[str]:
    return [(await e.text_content() or "").strip() for e in await page.query_selector_all(selector)]


async def _direct_texts(page: Any, selector: str) -> list[str]:
    """The first element's own text nodes (not its children's), as OSWorld reads `<div>SEA<div/>NYC</div>`."""
    elements = await page.query_selector_all(selector)
    return list(await elements[0].evaluate(_DIRECT_TEXT)) if elements else []


async def _h3_texts(page: Any, selector: str) -> list[str]:
    out = []
    for e in await page.query_selector_all(selector):
        h3 = await e.query_selector("h3")
        if h3 is not None:
            out.append((await h3.text_content() or "").strip())
    return out


async def _li_texts(page: Any, selector: str) -> list[str]:
    out = []
    for e in await page.query_selector_all(selector + " li.catAllProducts"):
        span = await e.query_selector("span")
        if span is not None:
            out.append((await span.inner_text()).strip())
    return out


def _by_rank(found: dict[str, Any], texts: list[Any], ranks: dict[str, str]) -> None:
    for rank, key in ranks.items():
        i = int(rank)
        found[key] = texts[i] if len(texts) > i else ""


async def _class_fields(page: Any, config: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, ranks in config.get("class_multiObject", {}).items():
        _by_rank(found, await _texts(page, "." + name), ranks)
    for name, ranks in config.get("class_multiObject_child", {}).items():
        _by_rank(found, await _direct_texts(page, "." + name), ranks)
    for name, ranks in config.get("class_multiObject_only_child", {}).items():
        _by_rank(found, await _h3_texts(page, "." + name), ranks)
    for name, wanted in config.get("class_multiObject_search_exist", {}).items():
        texts = await _texts(page, "." + name)
        for item in wanted:
            if item != "is_other_exist":
                found[item] = item in texts
        if "is_other_exist" in wanted:
            found["is_other_exist"] = any(t not in wanted for t in texts)
    for name, key in config.get("class_singleObject", {}).items():
        texts = await _texts(page, "." + name)
        found[key] = texts[0] if texts else ""
    return found


async def _first_text(page: Any, selector: str, value: bool = False) -> str:
    try:
        elements = page.locator(selector)
        if await elements.count() == 0:
            return ""
        text = await (elements.first.input_value() if value else elements.first.text_content())
    except Exception:  # noqa: BLE001  (a selector Playwright rejects, an element gone: OSWorld's "")
        return ""
    return (text or "").strip()


async def _filter_fields(page: Any, config: dict[str, Any]) -> dict[str, Any]:
    """OSWorld's "class&url" category: which filter names a listing shows, and which its URL carries."""
    found: dict[str, Any] = {}
    for key_kind, read in (("class_multiObject", _texts), ("class_multiObject_li", _li_texts)):
        for name, wanted in config.get(key_kind, {}).items():
            texts = await read(page, "." + name)
            for item in wanted:
                if any(item.lower() == t.lower() for t in texts):
                    found[item.lower()] = True
            if any(all(t.lower() not in w.lower() for w in wanted) for t in texts):
                found["is_other_exist"] = True
            found.setdefault("is_other_exist", False)
    url = page.url.lower()
    for key in config.get("url_include_expected", []):
        found.setdefault(key.lower(), key.lower() in url)
    for key, value in config.get("url_include_expected_multichoice", {}).items():
        found.setdefault(value.lower(), key.lower() in url)
    return found


async def active_tab_html_parse(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """Texts of elements of the active tab, by class, label, XPath or input (OSWorld's categories), in a
    dict keyed as the task says; {} when no open tab shows the active URL."""
    url = await active_url(config, client, ctx)
    if not isinstance(url, str):
        return None
    async with devtools(ctx) as browser:
        target = None
        for context in browser.contexts:
            for page in context.pages:
                if _same_page(page.url, url):
                    target = page
                    break
            if target is not None:
                break
        if target is None:
            return {}
        await _settle(target)
        category = config["category"]
        if category == "class":
            return await _class_fields(target, config)
        if category == "class&url":
            return await _filter_fields(target, config)
        if category == "label":
            return {
                key: await _first_text(target, f"text={label}")
                for label, key in config.get("labelObject", {}).items()
            }
        if category == "xpath":
            found = {}
            for xpath, key in config.get("xpathObject", {}).items():
                found[key] = await _first_text(target, f"xpath={xpath}") or await _first_text(target, xpath)
            return found
        if category == "input":
            return {
                key: await _first_text(target, f"xpath={xp}", value=True)
                for xp, key in config.get("inputObject", {}).items()
            }
        return {}  # a category OSWorld does not know either: its empty answer


async def _read_site(browser: Any, config: dict[str, Any]) -> list[Any]:
    async with _new_tab(browser) as page:
        page.set_default_timeout(ELEMENT_TIMEOUT_MS)
        await page.goto(config["url"], timeout=PAGE_TIMEOUT_MS)
        infos: list[Any] = []
        for info in config.get("infos", []):
            if page.url != config["url"]:
                await page.goto(config["url"], timeout=PAGE_TIMEOUT_MS)
            action = info.get("action", "inner_text")
            selectors = info["selector"] if action.startswith("click_and_") else [info["selector"]]
            for sel in selectors[:-1]:
                await (await page.wait_for_selector(sel, state="attached")).click()
                await page.wait_for_load_state("load")
            element = await page.wait_for_selector(selectors[-1], state="attached")
            if action in ("inner_text", "click_and_inner_text"):
                infos.append(await element.inner_text())
            elif action in ("attribute", "click_and_attribute"):
                infos.append(await element.get_attribute(info["attribute"]))
            else:
                raise ValueError(f"info_from_website: action {action!r} is not implemented")
        return infos


async def info_from_website(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """Texts or attributes read off `config["url"]`, following clicks; the task's `backups` when the site
    does not give them (OSWorld's fallback for facts that drift over time)."""
    async with devtools(ctx) as browser:
        try:
            return await _read_site(browser, config)
        except Exception:  # noqa: BLE001  (a changed or unreachable site: the task's own fallback)
            return config.get("backups")


async def gotoRecreationPage_and_get_html_content(  # noqa: N802
    config: dict[str, Any], client: VMClient, ctx: TaskContext
) -> Any:
    """OSWorld's recreation.gov script: search "Diamond", open the first result, jump to the next
    available date, and read one element by class: `{"expected": {class: text}}`."""
    cls = config["class"]
    async with devtools(ctx) as browser, _new_tab(browser) as page:
        page.set_default_timeout(PAGE_TIMEOUT_MS)
        try:
            await page.goto("https://www.recreation.gov/", timeout=PAGE_TIMEOUT_MS)
            await page.fill("input#hero-search-input", "Diamond")
            await page.click("button.nav-search-button")
            result = page.locator(".search-result-highlight--success").first
            await result.wait_for(state="visible")
            async with page.expect_popup() as popup:
                await result.click()
            site = await popup.value
            await site.wait_for_load_state("load")
            await _settle(site)
            with contextlib.suppress(Exception):  # OSWorld carries on when there is no such button
                await site.click("button.next-available", timeout=30_000)
                await _settle(site)
            elements = await site.query_selector_all("." + cls)
        except Exception as exc:  # noqa: BLE001
            # this reads the gold value off the live site: failing to is the environment's fault
            raise BrowserUnavailable(f"recreation.gov did not give the expected page: {exc}") from exc
        order = int(config.get("order", 0))
        if len(elements) <= order:
            return {"expected": {cls: "__EVALUATION_FAILED__"}}
        text = await elements[order].text_content()
        return {"expected": {cls: text.strip() if text else text}}


GETTERS: dict[str, Getter] = {
    "open_tabs_info": open_tabs_info,
    "active_tab_info": active_tab_info,
    "page_info": page_info,
    "pdf_from_url": pdf_from_url,
    "active_tab_html_parse": active_tab_html_parse,
    "info_from_website": info_from_website,
    "gotoRecreationPage_and_get_html_content": gotoRecreationPage_and_get_html_content,
}
"""The page getters, merged into `chrome.GETTERS`."""
