"""Parity of guirl's browser metrics and the browser getters' pure parts with OSWorld's (desktop-env 1.0.2
`metrics/chrome.py`, `metrics/utils.compare_urls`, `getters/chrome.py`, `getters/misc.py`).

Inputs have the shapes the getters produce (a URL string, a page dict, the tabs' list, Bookmarks
`roots`, Cookies and History rows, Preferences values) and the rules are the suite's task files' own.
Each case states the score both implementations must give. The same functions run on a real Chromium's
outputs in `test_chrome_getters.py`. Deliberate differences are in the last test, one line each;
two cannot be shown offline: without a timezone, OSWorld's `rule_relativeTime` asks ipapi.co for the
scoring host's (guirl takes UTC, OSWorld's own fallback, so expected dates do not depend on where the
scorer runs), and OSWorld's `compare_urls` lets tldextract download the live Public Suffix List (guirl's
uses the snapshot bundled with tldextract).
"""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any
from xml.sax.saxutils import escape

import pytest
from aiohttp import web

from guirl.vmpool.client import VMClient
from guirl.vmpool.tasks.getters import GETTERS
from guirl.vmpool.tasks.getters.chrome import (
    address_bar_text,
    macys_path_fields,
    url_dash_part,
    url_query_fields,
)
from guirl.vmpool.tasks.getters.chrome_dates import relative_time_rules
from guirl.vmpool.tasks.metrics import METRICS, UnsupportedMetric
from guirl.vmpool.tasks.metrics.browser import same_url
from guirl.vmpool.tasks.setup import TaskContext
from tests.helpers import run
from tests.osworld_reference import reference

REF = reference("metrics.chrome", absent=["borb", "borb.pdf"])
REF_UTILS = reference("metrics.utils")
REF_GET = reference("getters.chrome", absent=["pydrive", "pydrive.auth", "pydrive.drive"])
REF_MISC = reference("getters.misc")


def _score(name: str, result: Any, rule: Any) -> tuple[float, float]:
    """(guirl's score, OSWorld's score); the rule is copied for each (OSWorld's mutates some)."""
    ours = METRICS[name](copy.deepcopy(result), copy.deepcopy(rule))
    theirs = getattr(REF, name)(copy.deepcopy(result), copy.deepcopy(rule))
    return float(ours), float(theirs)


def _page(url: str, content: str = "<html></html>") -> dict[str, str]:
    return {"title": "t", "url": url, "content": content}


NPC = {"type": "url", "url": "https://www.drugs.com/npc/"}
PASSWORDS = {"type": "url", "url": "chrome://password-manager/passwords"}
SCHOLAR = {
    "type": "url",
    "url": "?hl=en&",
    "expected": ["https://scholar.google.com/citations", "user=qRAQ5BsAAAAJ"],
}
TABS = {
    "type": "url",
    "urls": ["https://www.lonelyplanet.com", "https://www.airbnb.com", "https://www.tripadvisor.com"],
}
LOCAL_TABS = {"type": "url", "urls": ["https://github.com", "file:///home/user/Desktop/report.html"]}
MARKS = {
    "bookmark_bar": {
        "children": [
            {"type": "folder", "name": "Favorites", "children": []},
            {
                "type": "folder",
                "name": "Liked Authors",
                "children": [
                    {"type": "url", "name": "a", "url": "https://jimfan.me/"},
                    {"type": "url", "name": "b", "url": "https://research.nvidia.com/person/yuke-zhu"},
                ],
            },
            {"type": "url", "name": "t", "url": "https://jalammar.github.io/illustrated-transformer/"},
        ]
    },
    "other": {"children": []},
}
LIKED = {
    "type": "liked_authors_websites_urls",
    "names": ["Liked Authors"],
    "urls": [
        ["https://jimfan.me/", "https://research.nvidia.com/person/linxi-jim-fan"],
        ["https://research.nvidia.com/person/yuke-zhu", "https://yukezhu.me/"],
    ],
}
APP_EXEC = (
    "/opt/google/chrome/google-chrome --profile-directory=Default --app-id=poahllcmmahlafplfhgjomkjmeblpapf"
)
COOKIES = [
    (13340000000000000, ".amazon.com", "", "session-id", "x", b"", "/", 0, 1, 1, 0, 1, 1, 1, 1, 0, 443, 0)
]

CASES: list[tuple[str, Any, Any, float]] = [
    # the active tab: a URL string (active_url_from_accessTree) or a page dict (active_tab_info)
    ("is_expected_active_tab", "https://www.drugs.com/npc/", NPC, 1.0),
    ("is_expected_active_tab", "https://drugs.com/npc/", NPC, 1.0),  # a lone www is dropped
    ("is_expected_active_tab", _page("https://www.drugs.com/npc/"), NPC, 1.0),
    ("is_expected_active_tab", "https://www.drugs.com/npc", NPC, 0.0),  # the path's slash counts
    ("is_expected_active_tab", "https://www.drugs.com/npp/", NPC, 0.0),
    (
        "is_expected_active_tab",
        "https://www.airbnb.com.sg/",
        {"type": "url", "url": "https://airbnb.com"},
        1.0,
    ),
    ("is_expected_active_tab", "https://www.airbnb.com.sg/", {"type": "url", "url": "airbnb.com"}, 0.0),
    ("is_expected_active_tab", "https://www.drugs.com/npc/", {"type": "title", "url": "x"}, 0.0),
    ("is_expected_active_tab", None, NPC, 0.0),
    ("is_expected_active_tab", {}, NPC, 0.0),
    ("is_expected_active_tab_approximate", "chrome://password-manager/passwords?q=a", PASSWORDS, 1.0),
    ("is_expected_active_tab_approximate", "chrome://password-manager/settings", PASSWORDS, 0.0),
    ("is_expected_active_tab_approximate", None, PASSWORDS, 0.0),
    ("is_expected_active_tab_approximate", {"title": "no url"}, PASSWORDS, 0.0),
    (
        "is_expected_url_pattern_match",
        "https://www.accuweather.com/en/gb/manchester/m15-6/x",
        {"expected": ["/manchester/"]},
        1.0,
    ),
    (
        "is_expected_url_pattern_match",
        _page("https://www.united.com/en/us/checked-bag-fee-calculator/any"),
        {"expected": ["united.com/en/us/checked-bag-fee-calculator"]},
        1.0,
    ),
    (
        "is_expected_url_pattern_match",
        "https://dmv.virginia.gov/licenses-ids/license/applying/eligibility",
        {"expected": ["^https://(www\\.)?dmv\\.virginia\\.gov/licenses-ids/license/applying/eligibility"]},
        1.0,
    ),
    (
        "is_expected_url_pattern_match",
        "https://scholar.google.com/citations?user=qRAQ5BsAAAAJ&hl=en",
        SCHOLAR,
        1.0,
    ),
    ("is_expected_url_pattern_match", "https://scholar.google.com/citations?user=other", SCHOLAR, 0.0),
    ("is_expected_url_pattern_match", {"title": "no url"}, {"expected": ["x"]}, 0.0),
    ("is_expected_url_pattern_match", None, {"expected": ["x"]}, 0.0),
    (
        "is_expected_search_query",
        _page("https://www.google.com/search?q=nereida&sca=1"),
        {"expect": {"pattern": "(?i)https?://(?:www\\.)?google\\.com/search\\?q=nereida(?:&|$|#).*"}},
        1.0,
    ),
    (
        "is_expected_search_query",
        _page("https://www.google.com/search?q=nereidas"),
        {"expect": {"pattern": "(?i)https?://(?:www\\.)?google\\.com/search\\?q=nereida(?:&|$|#).*"}},
        0.0,
    ),
    ("is_expected_search_query", None, {"expect": {"pattern": "x"}}, 0.0),
    (
        "is_added_to_steam_cart",
        _page("u", "<div>The Dota 2 Official Soundtrack</div>"),
        {"items": ["The Dota 2 Official Soundtrack"]},
        1.0,
    ),
    (
        "is_added_to_steam_cart",
        _page("u", "<div>Your cart is empty</div>"),
        {"items": ["The Dota 2 Official Soundtrack"]},
        0.0,
    ),
    # the open tabs: as many as expected, each expected URL among them
    (
        "is_expected_tabs",
        [
            _page(u)
            for u in ("https://www.tripadvisor.com/", "https://lonelyplanet.com/", "https://www.airbnb.com/")
        ],
        TABS,
        1.0,
    ),
    (
        "is_expected_tabs",
        [_page(u) for u in ("https://www.tripadvisor.com/", "https://www.airbnb.com/")],
        TABS,
        0.0,
    ),
    (
        "is_expected_tabs",
        [_page(u) for u in ("https://github.com/", "file:///home/user/Desktop/report.html")],
        LOCAL_TABS,
        1.0,
    ),
    (
        "is_expected_tabs",
        [_page(u) for u in ("https://github.com/", "file:///home/user/Desktop/other.html")],
        LOCAL_TABS,
        0.0,
    ),
    ("is_expected_tabs", [], TABS, 0.0),
    ("is_expected_tabs", None, TABS, 0.0),
    # Bookmarks' roots
    (
        "is_expected_bookmarks",
        MARKS,
        {"type": "bookmark_bar_folders_names", "names": ["Favorites", "Liked Authors"]},
        1.0,
    ),
    ("is_expected_bookmarks", MARKS, {"type": "bookmark_bar_folders_names", "names": ["Favorites"]}, 0.0),
    (
        "is_expected_bookmarks",
        MARKS,
        {
            "type": "bookmark_bar_websites_urls",
            "urls": ["https://jalammar.github.io/illustrated-transformer/"],
        },
        1.0,
    ),
    ("is_expected_bookmarks", MARKS, {"type": "bookmark_bar_websites_urls", "urls": []}, 0.0),
    ("is_expected_bookmarks", MARKS, LIKED, 1.0),
    ("is_expected_bookmarks", MARKS, {**LIKED, "urls": [["https://jimfan.me/"]]}, 0.0),
    ("is_expected_bookmarks", {"bookmark_bar": {"children": []}}, LIKED, 0.0),
    ("is_expected_bookmarks", [], LIKED, 0.0),  # no Bookmarks file
    # profile databases and settings
    ("is_cookie_deleted", COOKIES, {"type": "domains", "domains": [".amazon.com"]}, 0.0),
    ("is_cookie_deleted", COOKIES, {"type": "domains", "domains": ["amazon.com"]}, 0.0),
    ("is_cookie_deleted", COOKIES, {"type": "domains", "domains": [".google.com"]}, 1.0),
    ("is_cookie_deleted", [], {"type": "domains", "domains": [".amazon.com"]}, 1.0),
    (
        "check_history_deleted",
        [("https://www.youtube.com/watch?v=1", "v", 1)],
        {"type": "keywords", "keywords": ["youtube"]},
        0.0,
    ),
    (
        "check_history_deleted",
        [("https://www.google.com/", "g", 1)],
        {"type": "keywords", "keywords": ["youtube"]},
        1.0,
    ),
    ("check_history_deleted", [], {"type": "keywords", "keywords": ["youtube"]}, 1.0),
    (
        "check_enabled_experiments",
        ["chrome-refresh-2023@1", "chrome-webui-refresh-2023"],
        {"type": "names", "names": ["chrome-refresh-2023", "chrome-webui-refresh-2023"]},
        1.0,
    ),
    (
        "check_enabled_experiments",
        ["chrome-webui-refresh-2023", "chrome-refresh-2023@1"],
        {"type": "names", "names": ["chrome-refresh-2023", "chrome-webui-refresh-2023"]},
        0.0,
    ),
    ("check_enabled_experiments", [], {"type": "names", "names": ["chrome-refresh-2023"]}, 0.0),
    ("check_font_size", {"default_font_size": 20}, {"type": "range", "min": 16, "max": 99999}, 1.0),
    ("check_font_size", {"default_font_size": 16}, {"type": "range", "min": 16, "max": 99999}, 0.0),
    ("check_font_size", {"default_font_size": 16}, {"type": "value", "value": 16}, 1.0),
    (
        "is_expected_installed_extensions",
        ["Zoom Chrome Extension", "Momentum", "Google Translate", "Other"],
        {"expected": ["Zoom Chrome Extension", "Momentum", "Google Translate"]},
        1.0,
    ),
    (
        "is_expected_installed_extensions",
        ["Momentum"],
        {"expected": ["Zoom Chrome Extension", "Momentum"]},
        0.0,
    ),
    ("is_expected_installed_extensions", [], {"expected": ["Momentum"]}, 0.0),
    (
        "is_shortcut_on_desktop",
        {"a.desktop": f"[Desktop Entry]\nName=Tetris\nExec={APP_EXEC}\n"},
        {
            "type": "exec",
            "exec": APP_EXEC,
        },
        1.0,
    ),
    (
        "is_shortcut_on_desktop",
        {"a.desktop": "[Desktop Entry]\nName=Tetris\n"},
        {"type": "name", "name": "Tetris"},
        1.0,
    ),
    (
        "is_shortcut_on_desktop",
        {"a.desktop": "[Desktop Entry]\nName=Tetris Online\n"},
        {"type": "name", "name": "Tetris"},
        0.0,
    ),
    ("is_shortcut_on_desktop", {}, {"type": "name", "name": "Tetris"}, 0.0),
]


@pytest.mark.parametrize(
    ("name", "result", "rule", "score"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_metric_parity(name: str, result: Any, rule: Any, score: float) -> None:
    assert _score(name, result, rule) == (score, score)


URL_PAIRS = [
    ("https://www.airbnb.com/", "https://airbnb.com.sg", True),
    ("https://www.airbnb.com/", "airbnb.com.sg", False),  # no scheme: http
    ("https://www.drugs.com/npc/", "http://drugs.com/npc/", False),  # the scheme counts
    ("https://github.com", "https://github.com/", True),
    ("https://docs.python.org/3/", "https://docs.python.org/3", False),
    ("https://www.linkedin.com/home/", "https://linkedin.com/home/?trk=x", False),
    ("https://a.b.github.io/x", "https://b.github.io/x", False),
    ("file:///home/user/Desktop/a.html", "file:///home/user/Desktop/a.html", True),
    ("chrome://settings/", "chrome://settings", True),
    ("http://127.0.0.1:8000/page", "http://127.0.0.1:8000/page", True),
    (".amazon.com", "amazon.com", True),
]


@pytest.mark.parametrize(("a", "b", "same"), URL_PAIRS)
def test_same_url_is_osworlds_compare_urls(a: str, b: str, same: bool) -> None:
    assert same_url(a, b) == REF_UTILS.compare_urls(a, b) == same


def _at(omnibox: str | None, app: str = "Google Chrome") -> str:
    entry = "" if omnibox is None else f'<entry name="Address and search bar">{escape(omnibox)}</entry>'
    return (
        '<desktop-frame xmlns:st="uri:deskat:state.at-spi.gnome.org">'
        f'<application name="gnome-shell"/><application name="{app}"><frame>{entry}</frame></application>'
        "</desktop-frame>"
    )


class _AtEnv:
    """OSWorld's getter asks `env.controller.get_accessibility_tree()`; nothing else is used."""

    def __init__(self, tree: str) -> None:
        self.controller = self
        self.tree = tree

    def get_accessibility_tree(self) -> str:
        return self.tree


@pytest.mark.parametrize(
    ("tree", "prefix", "url"),
    [
        (_at("drugs.com/npc/"), "https://www.", "https://www.drugs.com/npc/"),
        (_at("chrome://password-manager/passwords"), "", "chrome://password-manager/passwords"),
        (
            _at("scholar.google.com/citations?user=x&hl=en"),
            None,
            "https://scholar.google.com/citations?user=x&hl=en",
        ),
        (_at(None), "https://", None),  # no address bar
        (_at(""), "https://", None),  # an empty one
        (_at("drugs.com", app="Firefox"), "https://", None),
    ],
)
def test_active_url_from_the_accessibility_tree(tree: str, prefix: str | None, url: str | None) -> None:
    config = {"type": "active_url_from_accessTree"} | ({} if prefix is None else {"goto_prefix": prefix})
    assert REF_GET.get_active_url_from_accessTree(_AtEnv(tree), config) == url
    text = address_bar_text(tree)
    assert (None if text is None else (config.get("goto_prefix", "https://") + text)) == url

    # and through the VM's route, as OSWorld's VM server answers it: {"AT": tree}
    async def main(tmp: Any) -> Any:
        app = web.Application()

        async def accessibility(_request: web.Request) -> web.Response:
            return web.json_response({"AT": tree})

        app.router.add_get("/accessibility", accessibility)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            async with VMClient(f"http://127.0.0.1:{runner.addresses[0][1]}") as client:
                ctx = TaskContext(task_id="t", cache_dir=tmp, download_cache=tmp)
                return await GETTERS["active_url_from_accessTree"](config, client, ctx)
        finally:
            await runner.cleanup()

    assert run(main(None)) == url


MACYS = "https://www.macys.com/shop/mens-clothing/mens-shirts/Men_regular_size_t,Price_discount_range,Sleeve_length/L,50_PERCENT_%20off%20%26%20more,Short%20Sleeve?id=20626"
MACYS_PARSE = {
    "parse_keys": ["mens_clothing", "shirts", "Men_regular_size_t", "Price_discount_range", "short_sleeve"]
}
URL_CASES = [
    (
        "get_active_tab_url_parse",
        url_query_fields,
        "https://www.cars.com/shopping/results/?list_price_max=50000&maximum_distance=50&zip=10001&fuel_slugs[]=electric",
        {"parse_keys": ["list_price_max", "maximum_distance", "zip", "fuel_slugs[]"]},
    ),
    (
        "get_active_tab_url_parse",
        url_query_fields,
        "https://www.budget.com/?locationName=BOS&filterCriteria_sortBy=SEATS",
        {"parse_keys": ["locationName", "dropLocationName", "filterCriteria_sortBy"]},
    ),
    (
        "get_active_tab_url_parse",
        url_query_fields,
        "https://www.ryanair.com/?fromStation=LHR&toStation=DUB&departing=2024-05-06",
        {"parse_keys": ["fromStation", "toStation", "departing"], "replace": {"departing": "time"}},
    ),
    (
        "get_active_tab_url_parse",
        url_query_fields,
        "https://www.google.com/search?tbm=shop&q=jeans,black",
        {"parse_keys": ["q"], "split_list": True},
    ),
    (
        "get_url_dashPart",
        url_dash_part,
        "https://www.accuweather.com/en/gb/manchester/m15-6/december-weather/329260?year=2023",
        {"partIndex": -2, "needDeleteId": False, "returnType": "json", "key": "time"},
    ),
    (
        "get_url_dashPart",
        url_dash_part,
        "https://www.example.com/a/part?id=3",
        {"partIndex": 4, "needDeleteId": True, "returnType": "string"},
    ),
    (
        "get_url_dashPart",
        url_dash_part,
        "https://www.example.com/a",
        {"partIndex": 9, "returnType": "string"},
    ),
    (
        "get_url_dashPart",
        url_dash_part,
        "https://www.example.com/a",
        {"partIndex": "x", "returnType": "string"},
    ),
    ("get_url_path_parse", macys_path_fields, MACYS, MACYS_PARSE),
    (
        "get_url_path_parse",
        macys_path_fields,
        MACYS.replace(
            "50_PERCENT_%20off%20%26%20more", "50_PERCENT_%20off%20%26%20more|30_PERCENT_%20off%20%26%20more"
        ),
        MACYS_PARSE,
    ),
    (
        "get_url_path_parse",
        macys_path_fields,
        "https://www.macys.com/shop/womens-clothing/dresses?id=1",
        MACYS_PARSE,
    ),
]


@pytest.mark.parametrize(("ref_fn", "ours", "url", "config"), URL_CASES)
def test_url_getters_parse_as_osworld(
    monkeypatch: pytest.MonkeyPatch, ref_fn: str, ours: Any, url: str, config: dict
) -> None:
    monkeypatch.setattr(REF_GET, "get_active_url_from_accessTree", lambda env, cfg: url)
    assert ours(url, copy.deepcopy(config)) == getattr(REF_GET, ref_fn)(None, copy.deepcopy(config))


RELATIVE_RULES = [
    {
        "relativeTime": {"from": "next Monday split", "to": "next Friday split"},
        "timezone": "Europe/Zurich",
        "expected": {
            "puDay": "{DayD}",
            "puMonth": "{MonthD}",
            "puYear": "{Year}",
            "doDay": "{DayD}",
            "doMonth": "{MonthD}",
            "doYear": "{Year}",
        },
    },
    {"relativeTime": {"from": "this month"}, "expected": {"time": "{month}-weather"}},
    {
        "relativeTime": {"from": "10th next month", "to": "11th next month"},
        "expected": {
            "start_location": "BOS",
            "from": "{DoW}, {Month} {Day0D}, 12:00 PM",
            "to": "{DoW}, {Month} {Day0D}, 12:00 PM",
        },
    },
    {
        "relativeTime": {"from": "5th next month"},
        "expected": {"start": "SEA", "time": "{DoW}, {Month} {Day0D}, {Year}", "category": "Miles"},
    },
    {"relativeTime": {"from": "next Monday"}, "expected": {"time": "{Year}-{Month0D}-{Day0D}"}},
    {
        "relativeTime": {"from": "next week Saturday", "to": "next week Sunday"},
        "timezone": "America/New_York",
        "expected": {"from": "{DoW}, {Month} {Day0D}", "to": "{DoW}, {Month} {Day0D}"},
    },
    {
        "relativeTime": {"from": "next week Friday", "to": "next week Sunday"},
        "timezone": "America/New_York",
        "expected": {"from": "Check In{DoW}, {Month} {Day0D}", "to": "Check Out{DoW}, {Month} {Day0D}"},
    },
    {
        "relativeTime": {"from": "first monday eight months later"},
        "expected": {"time": "{MonthFull} {Day0D}, 10:15 AM"},
    },
    {"relativeTime": {"from": "10th next month"}, "expected": {"time": "{Year}-{Month0D}-{DayD}"}},
    {"relativeTime": {"from": "tomorrow"}, "expected": {"time": "{DoW}, {Month} {Day0D}, {Year}"}},
    {
        "relativeTime": {"from": "next Friday", "to": "next Sunday"},
        "expected": {"from": "{DoW} {DayD}", "to": "{DoW} {DayD}"},
    },
    {
        "relativeTime": {"from": "this Saturday", "to": "this Sunday"},
        "expected": {"from": "{DoW} {DayD}", "to": "{DoW} {DayD}"},
    },
]
# a week of days (every weekday), a year's end and a month's end; noon, so no timezone moves the date
TODAYS = [dt.date(2025, 6, d) for d in range(2, 9)] + [dt.date(2025, 12, 31), dt.date(2026, 1, 31)]


@pytest.mark.parametrize("today", TODAYS, ids=str)
def test_relative_time_rules_as_osworld(monkeypatch: pytest.MonkeyPatch, today: dt.date) -> None:
    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return tz.localize(dt.datetime(today.year, today.month, today.day, 12))

    monkeypatch.setattr(REF_MISC, "datetime", Frozen)
    monkeypatch.setattr(REF_MISC, "get_timezone_from_ip", lambda: "UTC")  # OSWorld asks ipapi.co
    for rules in RELATIVE_RULES:
        theirs = REF_MISC.get_rule_relativeTime(None, {"rules": copy.deepcopy(rules)})
        assert relative_time_rules(rules, today) == theirs, rules["relativeTime"]


def test_relative_time_getter_leaves_the_task_alone() -> None:
    rules = copy.deepcopy(RELATIVE_RULES[4])
    config = {"type": "rule_relativeTime", "rules": rules}
    got = run(GETTERS["rule_relativeTime"](config, None, None))  # type: ignore[arg-type]
    assert rules == RELATIVE_RULES[4] and got["expected"]["time"] != rules["expected"]["time"]
    assert dt.date.fromisoformat(got["expected"]["time"]).weekday() == 0  # a Monday


def test_deliberate_differences() -> None:
    """What OSWorld does, and what guirl does instead, one line each."""
    # a page dict whose url is None: OSWorld's re.search(None) raises; guirl scores 0
    with pytest.raises(TypeError):
        REF.is_expected_url_pattern_match({"url": None}, {"expected": ["x"]})
    assert METRICS["is_expected_url_pattern_match"]({"url": None}, {"expected": ["x"]}) == 0.0
    # a bare URL for is_expected_search_query: OSWorld indexes it as a dict and raises; guirl scores 0
    with pytest.raises(TypeError):
        REF.is_expected_search_query("https://www.google.com/search?q=a", {"expect": {"pattern": "q=a"}})
    assert (
        METRICS["is_expected_search_query"](
            "https://www.google.com/search?q=a", {"expect": {"pattern": "q=a"}}
        )
        == 0.0
    )
    # no Cookies / History database (None): OSWorld iterates None and raises; guirl scores 0 (spoiled)
    for name, rule in (
        ("is_cookie_deleted", {"type": "domains", "domains": [".amazon.com"]}),
        ("check_history_deleted", {"type": "keywords", "keywords": ["youtube"]}),
        ("check_enabled_experiments", {"type": "names", "names": []}),
        ("check_font_size", {"type": "value", "value": 16}),
        ("is_added_to_steam_cart", {"items": ["x"]}),
    ):
        with pytest.raises(TypeError):
            getattr(REF, name)(None, rule)
        assert METRICS[name](None, rule) == 0.0, name
    # a rule type neither implements: OSWorld raises TypeError; guirl raises UnsupportedMetric (cannot score)
    for name, result, rule in (
        ("is_expected_bookmarks", MARKS, {"type": "other_bookmarks"}),
        ("is_shortcut_on_desktop", {}, {"type": "url", "url": "x"}),
        ("is_cookie_deleted", [], {"type": "names"}),
        ("check_history_deleted", [], {"type": "urls"}),
        ("check_font_size", {"default_font_size": 1}, {"type": "min"}),
    ):
        with pytest.raises(TypeError):
            getattr(REF, name)(result, rule)
        with pytest.raises(UnsupportedMetric):
            METRICS[name](result, rule)
    # url_dashPart with a negative index past the start: OSWorld raises IndexError; guirl answers None
    with pytest.raises(IndexError):
        url_dash_part_ref("https://a/b", -9)
    assert url_dash_part("https://a/b", {"partIndex": -9, "returnType": "string"}) is None
    # "first monday eight months later" in April: OSWorld asks for month 0 and raises; guirl says December
    rules = RELATIVE_RULES[7]
    assert relative_time_rules(rules, dt.date(2025, 4, 10))["expected"]["time"] == "December 01, 10:15 AM"


def url_dash_part_ref(url: str, index: int) -> Any:
    original = REF_GET.get_active_url_from_accessTree
    REF_GET.get_active_url_from_accessTree = lambda env, cfg: url
    try:
        return REF_GET.get_url_dashPart(None, {"partIndex": index, "returnType": "string"})
    finally:
        REF_GET.get_active_url_from_accessTree = original
