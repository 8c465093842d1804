"""Chrome's state: tabs, URLs, pages, bookmarks, history, settings, extensions (OSWorld's
metrics/chrome.py).

Results come from the getters in `getters/chrome.py`: a URL string or a `{title, url, content}` dict for
the active tab, a list of such dicts for the open tabs, the Bookmarks file's `roots`, rows of the Cookies
and History databases, Preferences values. A result the policy spoiled (None, the wrong type) scores 0.0.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from itertools import product
from typing import Any
from urllib.parse import ParseResult, urlparse, urlunparse

from guirl.vmpool.tasks.metrics import UnsupportedMetric

REQUIRES = ("tldextract",)
"""Modules beyond guirl's own dependencies that this module's functions import (the `osworld` extra)."""

_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+\-.]*://")


@functools.cache
def _tld_extract() -> Callable[[str], Any]:
    import tldextract

    # the Public Suffix List snapshot bundled with tldextract: no download at scoring time, the same answer
    # on every host (tldextract's default fetches the live list first)
    return tldextract.TLDExtract(suffix_list_urls=())


def _normalize_url(url: str, full: bool = True) -> str:
    """OSWorld's URL normal form: scheme defaulting to http, host without its public suffix and without a
    lone `www`, no trailing lone slash."""
    parsed = urlparse(url if _SCHEME.match(url) else f"http://{url}")
    host = _tld_extract()(parsed.netloc.lower())
    sub = "" if host.subdomain == "www" else host.subdomain
    return urlunparse(
        ParseResult(
            scheme=parsed.scheme.lower(),
            netloc=f"{sub}.{host.domain}" if sub else host.domain,
            path="" if parsed.path == "/" else parsed.path,
            params=parsed.params if full else "",
            query=parsed.query if full else "",
            fragment=parsed.fragment if full else "",
        )
    )


def same_url(a: str | None, b: str | None) -> bool:
    """OSWorld's `compare_urls`: `www.airbnb.com/` and `https://airbnb.com.sg` are the same page."""
    if a is None or b is None:
        return a == b
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    return _normalize_url(a) == _normalize_url(b)


def _url_of(tab: Any) -> str | None:
    """The URL in an active-tab result: the string itself, or a page dict's `url`."""
    if isinstance(tab, dict):
        url = tab.get("url")
        return url if isinstance(url, str) else None
    return tab if isinstance(tab, str) else None


def is_expected_active_tab(active_tab_info: Any, rule: dict[str, Any]) -> float:
    """1 when the active tab shows the rule's URL (compared as OSWorld's `compare_urls` does)."""
    if not active_tab_info or rule.get("type") != "url":
        return 0.0
    actual = _url_of(active_tab_info)
    return 1.0 if actual is not None and same_url(rule["url"], actual) else 0.0


def _without_query(url: str) -> str:
    return urlunparse(urlparse(url)._replace(query=""))


def is_expected_active_tab_approximate(active_tab_info: Any, rule: dict[str, Any]) -> float:
    """1 when the active tab's URL equals the rule's, query strings ignored (exact otherwise)."""
    if not active_tab_info or rule.get("type") != "url":
        return 0.0
    actual = _url_of(active_tab_info)
    return 1.0 if actual is not None and _without_query(rule["url"]) == _without_query(actual) else 0.0


def is_expected_url_pattern_match(result: Any, rules: dict[str, Any]) -> float:
    """1 when every regular expression in `rules["expected"]` is found in the active tab's URL."""
    url = _url_of(result)
    if not result or url is None:
        return 0.0
    return 1.0 if all(re.search(pattern, url) for pattern in rules["expected"]) else 0.0


def is_expected_installed_extensions(installed_extensions: Any, expected: dict[str, Any]) -> float:
    """1 when every expected extension name is among the installed ones."""
    if not installed_extensions or not isinstance(installed_extensions, list):
        return 0.0
    return 1.0 if set(expected["expected"]) <= set(installed_extensions) else 0.0


def is_expected_tabs(open_tabs: Any, rule: dict[str, Any]) -> float:
    """1 when the open tabs are the rule's URLs: as many, and each expected URL matched by an open one."""
    if not open_tabs or not isinstance(open_tabs, list) or rule.get("type") != "url":
        return 0.0
    actual = [_url_of(tab) for tab in open_tabs]
    expected = rule["urls"]
    if len(actual) != len(expected):
        return 0.0
    return 1.0 if all(any(same_url(e, a) for a in actual) for e in expected) else 0.0


def _children(node: Any) -> list[dict[str, Any]]:
    kids = node.get("children", []) if isinstance(node, dict) else []
    return [k for k in kids if isinstance(k, dict)]


def is_expected_bookmarks(bookmarks: Any, rule: dict[str, Any]) -> float:
    """1 when the bookmark bar holds the rule's folders, or URLs, or a "Liked Authors" folder whose URLs are
    one pick from each of the rule's alternatives."""
    kind = rule.get("type")
    if kind not in (
        "bookmark_bar_folders_names",
        "bookmark_bar_websites_urls",
        "liked_authors_websites_urls",
    ):
        raise UnsupportedMetric(f"is_expected_bookmarks: rule type {kind!r} is not implemented")
    if not bookmarks or not isinstance(bookmarks, dict):
        return 0.0
    bar = _children(bookmarks.get("bookmark_bar"))
    if kind == "bookmark_bar_folders_names":
        names = {b.get("name") for b in bar if b.get("type") == "folder"}
        return 1.0 if names == set(rule["names"]) else 0.0
    if kind == "bookmark_bar_websites_urls":
        urls = {b.get("url") for b in bar if b.get("type") == "url"}
        return 1.0 if urls == set(rule["urls"]) else 0.0
    folder = next((b for b in bar if b.get("type") == "folder" and b.get("name") == "Liked Authors"), None)
    if folder is None:
        return 0.0
    liked = {b.get("url") for b in _children(folder) if b.get("type") == "url"}
    choices = [[u] if isinstance(u, str) else list(u) for u in rule["urls"]]
    return 1.0 if any(set(pick) == liked for pick in product(*choices)) else 0.0


def is_expected_search_query(active_tab_info: Any, rules: dict[str, Any]) -> float:
    """1 when the active tab's URL matches the rule's search pattern."""
    url = _url_of(active_tab_info) if isinstance(active_tab_info, dict) else None
    if not active_tab_info or url is None:
        return 0.0
    return 1.0 if re.search(rules["expect"]["pattern"], url) else 0.0


def is_cookie_deleted(cookie_data: Any, rule: dict[str, Any]) -> float:
    """1 when no cookie's host (the Cookies table's second column, host_key) is one of the rule's
    domains."""
    if rule.get("type") != "domains":
        raise UnsupportedMetric(f"is_cookie_deleted: rule type {rule.get('type')!r} is not implemented")
    if not isinstance(cookie_data, list):
        return 0.0
    hosts = [row[1] for row in cookie_data]
    return 0.0 if any(same_url(d, h) for d in rule["domains"] for h in hosts) else 1.0


def is_shortcut_on_desktop(shortcuts: Any, rule: dict[str, Any]) -> float:
    """1 when a .desktop file on the Desktop has the rule's `Name=` or `Exec=` line."""
    kind = rule.get("type")
    if kind not in ("name", "exec"):
        raise UnsupportedMetric(f"is_shortcut_on_desktop: rule type {kind!r} is not implemented")
    if not isinstance(shortcuts, dict):
        return 0.0
    line = ("Name=" + rule["name"] if kind == "name" else "Exec=" + rule["exec"]) + "\n"
    return 1.0 if any(line in str(content) for content in shortcuts.values()) else 0.0


def check_history_deleted(history_data: Any, rule: dict[str, Any]) -> float:
    """1 when no URL in the browsing history contains one of the rule's keywords."""
    if rule.get("type") != "keywords":
        raise UnsupportedMetric(f"check_history_deleted: rule type {rule.get('type')!r} is not implemented")
    if not isinstance(history_data, list):
        return 0.0
    urls = [str(row[0]) for row in history_data]
    return 0.0 if any(k in u for k in rule["keywords"] for u in urls) else 1.0


def check_enabled_experiments(enabled_experiments: Any, rule: dict[str, Any]) -> float:
    """1 when the enabled chrome://flags experiments are exactly the rule's names, in order."""
    if rule.get("type") != "names":
        raise UnsupportedMetric(
            f"check_enabled_experiments: rule type {rule.get('type')!r} is not implemented"
        )
    if not isinstance(enabled_experiments, list):
        return 0.0
    names = [str(e).split("@")[0] for e in enabled_experiments]
    return 1.0 if names == rule["names"] else 0.0


def check_font_size(font_size: Any, rule: dict[str, Any]) -> float:
    """1 when Chrome's default font size equals the rule's value, or lies strictly inside its range."""
    kind = rule.get("type")
    if kind not in ("value", "range"):
        raise UnsupportedMetric(f"check_font_size: rule type {kind!r} is not implemented")
    size = font_size.get("default_font_size") if isinstance(font_size, dict) else None
    if not isinstance(size, int | float):
        return 0.0
    if kind == "value":
        return 1.0 if size == rule["value"] else 0.0
    return 1.0 if rule["min"] < size < rule["max"] else 0.0


def is_added_to_steam_cart(active_tab_info: Any, rule: dict[str, Any]) -> float:
    """1 when every item name appears in the cart page's HTML."""
    content = active_tab_info.get("content") if isinstance(active_tab_info, dict) else None
    if not isinstance(content, str):
        return 0.0
    return 1.0 if all(item in content for item in rule["items"]) else 0.0


METRICS: dict[str, Callable[..., float]] = {
    "is_expected_active_tab": is_expected_active_tab,
    "is_expected_active_tab_approximate": is_expected_active_tab_approximate,
    "is_expected_url_pattern_match": is_expected_url_pattern_match,
    "is_expected_installed_extensions": is_expected_installed_extensions,
    "is_expected_tabs": is_expected_tabs,
    "is_expected_bookmarks": is_expected_bookmarks,
    "is_expected_search_query": is_expected_search_query,
    "is_cookie_deleted": is_cookie_deleted,
    "is_shortcut_on_desktop": is_shortcut_on_desktop,
    "check_history_deleted": check_history_deleted,
    "check_enabled_experiments": check_enabled_experiments,
    "check_font_size": check_font_size,
    "is_added_to_steam_cart": is_added_to_steam_cart,
}
"""This family's metrics, by OSWorld's names."""
