"""Chrome's state through the DevTools Protocol on the VM's debugging port, and its profile files (OSWorld's
getters/chrome.py).

Profile getters read Chrome's files from the VM (`TaskContext.chrome_profile_dir`, Google Chrome's
`~/.config/google-chrome` on OSWorld's image) as OSWorld does; where OSWorld answers a default for a file
it cannot read, guirl answers the same default, and None where OSWorld's default is not a value of the
getter's type (its "Google" from the extension and startup getters). The page getters are in
`chrome_pages.py`, the relative-date rules in `chrome_dates.py`.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import aiohttp

from guirl.vmpool.client import UNAVAILABLE, VMClient, VMError, VMFatalError
from guirl.vmpool.tasks.getters.base import Getter, save
from guirl.vmpool.tasks.setup import TaskContext
from guirl.vmpool.tasks.setup_chrome import BrowserUnavailable

REQUIRES = ("lxml", "cssselect", "yaml")
"""Modules beyond guirl's own dependencies that this module's functions import (the `osworld` extra)."""

_AT_NS = {
    "st": "uri:deskat:state.at-spi.gnome.org",
    "attr": "uri:deskat:attributes.at-spi.gnome.org",
    "cp": "uri:deskat:component.at-spi.gnome.org",
    "doc": "uri:deskat:document.at-spi.gnome.org",
    "docattr": "uri:deskat:attributes.document.at-spi.gnome.org",
    "txt": "uri:deskat:text.at-spi.gnome.org",
    "val": "uri:deskat:value.at-spi.gnome.org",
    "act": "uri:deskat:action.at-spi.gnome.org",
}
_ADDRESS_BAR = "application[name={app}] entry[name=Address\\ and\\ search\\ bar]"
_FONT_DEFAULTS = {"default_fixed_font_size": 13, "default_font_size": 16, "minimum_font_size": 13}


# -- profile files -----------------------------------------------------------------------------------------


async def _profile_json(client: VMClient, ctx: TaskContext, name: str) -> dict[str, Any] | None:
    """A JSON file of Chrome's profile on the VM (`Default/Preferences`, `Local State`), None when the VM
    has none or it does not parse."""
    data = await client.get_file(f"{ctx.chrome_profile_dir}/{name}")
    if data is None:
        return None
    try:
        parsed = json.loads(data)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


async def _preferences(client: VMClient, ctx: TaskContext) -> dict[str, Any] | None:
    return await _profile_json(client, ctx, "Default/Preferences")


async def _profile_rows(client: VMClient, ctx: TaskContext, name: str, dest: str, query: str) -> list | None:
    """Rows of one of Chrome's SQLite databases, copied into the task's cache as `dest`."""
    data = await client.get_file(f"{ctx.chrome_profile_dir}/Default/{name}")
    if data is None:
        return None
    local = save(ctx, dest, data)
    try:
        with closing(sqlite3.connect(local)) as conn:
            return conn.execute(query).fetchall()
    except sqlite3.DatabaseError:
        return None


async def default_search_engine(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    prefs = await _preferences(client, ctx) or {}
    return (
        prefs.get("default_search_provider_data", {}).get("template_url_data", {}).get("short_name", "Google")
    )


async def cookie_data(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    return await _profile_rows(client, ctx, "Cookies", config.get("dest", "Cookies"), "SELECT * FROM cookies")


async def history(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    query = "SELECT url, title, last_visit_time FROM urls"
    return await _profile_rows(client, ctx, "History", config.get("dest", "History"), query)


async def enabled_experiments(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    state = await _profile_json(client, ctx, "Local State") or {}
    return state.get("browser", {}).get("enabled_labs_experiments", [])


async def profile_name(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    return ((await _preferences(client, ctx)) or {}).get("profile", {}).get("name")


async def chrome_font_size(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    prefs = await _preferences(client, ctx)
    if prefs is None:
        return {"default_fixed_font_size": 13, "default_font_size": 16}
    return prefs.get("webkit", {}).get("webprefs", dict(_FONT_DEFAULTS))


async def bookmarks(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    data = await client.get_file(f"{ctx.chrome_profile_dir}/Default/Bookmarks")
    if not data:
        return []
    try:
        return json.loads(data).get("roots", {})
    except ValueError:
        return []


async def _pref_flag(client: VMClient, ctx: TaskContext, *keys: str) -> str:
    """ "true" when any of the Preferences' dotted `keys` holds a true value, else "false"."""
    prefs = await _preferences(client, ctx) or {}
    for key in keys:
        node: Any = prefs
        for part in key.split("."):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if node:
            return "true"
    return "false"


async def enable_do_not_track(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    return await _pref_flag(client, ctx, "enable_do_not_track")


async def enable_safe_browsing(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    return await _pref_flag(client, ctx, "safebrowsing.enhanced", "safebrowsing.enabled")


async def new_startup_page(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    prefs = await _preferences(client, ctx)
    if prefs is None:
        return None
    # no "session" yet: a fresh profile, which opens the New Tab page (restore_on_startup 5)
    if "session" not in prefs:
        return "true"
    return "true" if prefs["session"].get("restore_on_startup") == 5 else "false"


async def _extension_settings(client: VMClient, ctx: TaskContext) -> list[dict[str, Any]] | None:
    prefs = await _preferences(client, ctx)
    if prefs is None:
        return None
    settings = prefs.get("extensions", {}).get("settings", {})
    return [s for s in settings.values() if isinstance(s, dict)]


async def find_unpacked_extension_path(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    settings = await _extension_settings(client, ctx)
    # component extensions have no path: skipped (OSWorld's KeyError there loses every path)
    return None if settings is None else [s["path"] for s in settings if "path" in s]


async def find_installed_extension_name(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    settings = await _extension_settings(client, ctx)
    if settings is None:
        return None
    return [
        s["manifest"]["name"]
        for s in settings
        if isinstance(s.get("manifest"), dict) and "name" in s["manifest"]
    ]


async def data_delete_automacally(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    prefs = await _preferences(client, ctx)
    if prefs is None or not isinstance(prefs.get("profile"), dict):
        return None
    return "true" if prefs["profile"].get("default_content_setting_values") is not None else "false"


async def shortcuts_on_desktop(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """The Desktop's .desktop files: `{name: content}`."""
    try:
        body = (await client._call("POST", "/desktop_path", idempotent=True))[1]
        desktop = json.loads(body)["desktop_path"]
        tree = await client.list_directory(desktop)
    except VMFatalError:  # no Desktop: the VM answered an error, None as OSWorld's getters give
        return None
    shortcuts = {}
    for entry in tree.get("children", []):
        name = entry["name"]
        if name.endswith(".desktop"):
            data = await client.get_file(f"{desktop}/{name}")
            if data is not None:
                shortcuts[name] = data.decode("utf-8", errors="replace")
    return shortcuts


# -- the active tab's URL ----------------------------------------------------------------------------------


def address_bar_text(accessibility_tree: str) -> str | None:
    """The text of Chrome's (or Chromium's) address bar in an AT-SPI tree as OSWorld's VM server writes it."""
    import lxml.etree
    from lxml.cssselect import CSSSelector

    try:
        root = lxml.etree.fromstring(accessibility_tree.encode())
    except (ValueError, lxml.etree.XMLSyntaxError):
        return None
    for app in ("Google\\ Chrome", "Chromium"):
        found = CSSSelector(_ADDRESS_BAR.format(app=app), namespaces=_AT_NS)(root)
        if found:  # OSWorld's reading: the first bar's text, None when the last one's is empty
            return found[0].text if found[-1].text else None
    return None


async def _devtools_active_url(ctx: TaskContext) -> str | None:
    """The URL of the tab the user last brought to front: Chrome's `/json/list` orders pages by their last
    activation."""
    if not ctx.devtools_url:
        raise BrowserUnavailable(
            "the active tab's URL needs the VM's accessibility tree or Chrome's DevTools endpoint: "
            "set env.chromium_port (9222, where OSWorld's tasks expose it)"
        )
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            async with http.get(ctx.devtools_url.rstrip("/") + "/json/list") as resp:
                targets = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise BrowserUnavailable(f"Chrome's DevTools at {ctx.devtools_url} did not answer: {exc}") from exc
    # tabs only: not DevTools windows, nor Chrome's own UI pages (the omnibox popup, tab search)
    pages = [
        t
        for t in targets
        if t.get("type") == "page"
        and not str(t.get("url")).startswith("devtools://")
        and ".top-chrome/" not in str(t.get("url"))
    ]
    return pages[0]["url"] if pages else None


async def active_url(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> str | None:
    """The active tab's URL: from the address bar in the VM's accessibility tree, with `goto_prefix`
    (default "https://") before it, as OSWorld reads it; where the VM has no accessibility tree (a server
    without the route, a desktop without AT-SPI) or cannot read it now, the page's full URL from DevTools."""
    try:
        tree = await client.accessibility_tree(timeout_s=120.0)
    except VMError as exc:
        # 404: a server without the route; UNAVAILABLE: no AT-SPI, or no tree in time. Anything else (no
        # answer) is the VM's fault and propagates.
        if exc.status not in (404, *UNAVAILABLE):
            raise
        return await _devtools_active_url(ctx)
    text = address_bar_text(tree or "")
    return None if text is None else f"{config.get('goto_prefix', 'https://')}{text}"


async def active_url_from_accessTree(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    return await active_url(config, client, ctx)


def url_query_fields(url: str, config: dict[str, Any]) -> dict[str, Any]:
    """OSWorld's `active_tab_url_parse` on a URL: the first value of each `parse_keys` query parameter
    ("" when absent), renamed by `replace`, split on commas with `split_list`."""
    query = parse_qs(urlparse(url).query)
    fields: dict[str, Any] = {key: query.get(key, [""])[0] for key in config["parse_keys"]}
    for old, new in config.get("replace", {}).items():
        fields[new] = fields.pop(old)
    if config.get("split_list", False):
        fields = {k: v.split(",") for k, v in fields.items()}
    return fields


def url_dash_part(url: str, config: dict[str, Any]) -> Any:
    """OSWorld's `url_dashPart`: the `partIndex`-th "/"-separated part of the URL, as a string or
    `{key: part}`; None for an index out of range."""
    try:
        index = int(config["partIndex"])
    except (ValueError, TypeError):
        return None
    parts = url.split("/")
    if index >= len(parts) or index < -len(parts):
        return None
    part = parts[index]
    if config.get("needDeleteId", False):
        part = part.split("?")[0]
    if config["returnType"] == "string":
        return part
    return {config["key"]: part} if config["returnType"] == "json" else None


def macys_path_fields(url: str, config: dict[str, Any]) -> dict[str, Any]:
    """OSWorld's `url_path_parse` (Macy's product listing): the facet `key,key/value,value` path segments,
    and whether the path is for men's short-sleeve shirts."""
    path = unquote(urlparse(url).path)
    facets: dict[str, Any] = {}
    shirts, short_sleeve = "shirts" in path, "short-sleeve" in path
    parts = path.strip("/").split("/")
    for keys, values in zip(parts, parts[1:], strict=False):
        if "," in keys and "," in values:
            for k, v in zip(
                (k.strip() for k in keys.split(",")), (v.strip() for v in values.split(",")), strict=False
            ):
                if k == "Price_discount_range":
                    facets[k] = [item.strip() for item in v.split("|")] if v else None
                else:
                    facets[k] = v or None
                shirts |= k == "Product_department" and v in ("shirts", "Shirts", "Shirt")
                short_sleeve |= k == "Sleeve_length" and v in ("short-sleeve", "Short Sleeve")
            break  # the first facet pair only, as OSWorld reads
    for name in ("Men_regular_size_t", "Price_discount_range"):
        facets.setdefault(name, None)
    result: dict[str, Any] = {
        "mens_clothing": True if "mens-clothing" in path else None,
        "shirts": True if shirts else None,
        "short_sleeve": True if short_sleeve else None,
    }
    for key in config["parse_keys"]:
        if key not in facets:
            continue
        if key == "Price_discount_range":
            ranges = facets[key] or []
            only_50 = "50_PERCENT_ off & more" in ranges and not {
                "30_PERCENT_ off & more",
                "20_PERCENT_ off & more",
            } & set(ranges)
            result[key] = "50_PERCENT_ off & more" if only_50 else "not_50_PERCENT_ off & more"
        else:
            result[key] = facets[key]
    return result


async def active_tab_url_parse(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    url = await active_url(config, client, ctx)
    return None if url is None else url_query_fields(url, config)


async def url_dashPart(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:  # noqa: N802
    url = await active_url(config, client, ctx)
    return None if url is None else url_dash_part(url, config)


async def url_path_parse(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    url = await active_url(config, client, ctx)
    return None if url is None else macys_path_fields(url, config)


async def googledrive_file(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """Files from the Google Drive, by per-level `query` or `path` (or lists of them with `_list`), saved
    in the task's cache as `dest`; None for one that is not there."""
    from guirl.vmpool.tasks.google_drive import GoogleDrive, path_queries

    if "query" in config:
        wanted, single = [(config["query"], config["dest"])], True
    elif "path" in config:
        wanted, single = [(path_queries(config["path"]), config["dest"])], True
    elif "query_list" in config:
        wanted, single = list(zip(config["query_list"], config["dest"], strict=True)), False
    else:
        paths = [path_queries(p) for p in config["path_list"]]
        wanted, single = list(zip(paths, config["dest"], strict=True)), False
    async with GoogleDrive.from_settings(ctx.google_drive_settings) as drive:
        got = [await drive.download(queries, ctx.cache_dir / dest) for queries, dest in wanted]
    out = [None if p is None else str(p) for p in got]
    return out[0] if single else out


GETTERS: dict[str, Getter] = {
    "default_search_engine": default_search_engine,
    "cookie_data": cookie_data,
    "history": history,
    "enabled_experiments": enabled_experiments,
    "profile_name": profile_name,
    "chrome_font_size": chrome_font_size,
    "bookmarks": bookmarks,
    "enable_do_not_track": enable_do_not_track,
    "enable_safe_browsing": enable_safe_browsing,
    "new_startup_page": new_startup_page,
    "find_unpacked_extension_path": find_unpacked_extension_path,
    "find_installed_extension_name": find_installed_extension_name,
    "data_delete_automacally": data_delete_automacally,
    "shortcuts_on_desktop": shortcuts_on_desktop,
    "active_url_from_accessTree": active_url_from_accessTree,
    "active_tab_url_parse": active_tab_url_parse,
    "url_dashPart": url_dashPart,
    "url_path_parse": url_path_parse,
    "googledrive_file": googledrive_file,
}
"""This family's getters, by OSWorld's names."""


def _merge() -> None:
    from guirl.vmpool.tasks.getters import chrome_dates, chrome_pages

    for module in (chrome_pages, chrome_dates):
        clash = GETTERS.keys() & module.GETTERS.keys()
        assert not clash, f"getters defined twice: {sorted(clash)}"
        GETTERS.update(module.GETTERS)


_merge()
