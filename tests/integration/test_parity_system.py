"""Parity of guirl's desktop and general checks with OSWorld's (desktop-env 1.0.2 `metrics/general.py`,
`basic_os.py`).

Inputs are the real formats: JSON and YAML files, Thunderbird's account CSV and its gloda SQLite database
(the tables the task's query reads), .docx files written by python-docx, OSWorld's accessibility-tree XML
(its namespaces and attribute layout), `timedatectl status` and `gsettings get` output, and the VM's
directory listings. Each case states the score both implementations must give; where guirl differs on
purpose, a separate test says what the reference does and what guirl does instead.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docx
import pytest
import yaml

from guirl.vmpool.tasks.metrics import METRICS
from tests.osworld_reference import both, reference, write

GENERAL = reference("metrics.general")
BASIC_OS = reference("metrics.basic_os")


# -- files ---------------------------------------------------------------------------------------------

_ACCOUNTS = """url,user,password
imap://outlook.office365.com,anonym-x2024@outlook.com,password
smtp://smtp.office365.com,anonym-x2024@outlook.com,password
"""


def test_check_csv(tmp_path: Path) -> None:
    f = "check_csv"
    both_accounts = {
        "expect": [
            {
                "url": "imap://outlook.office365.com",
                "user": "anonym-x2024@outlook.com",
                "password": "password",
            },
            {"url": "smtp://smtp.office365.com", "user": "anonym-x2024@outlook.com", "password": "password"},
        ]
    }
    removed = {"unexpect": [{"url": "imap://outlook.office365.com", "user": "anonym-x2024@outlook.com"}]}
    full = write(tmp_path / "a.csv", _ACCOUNTS)
    smtp_only = write(tmp_path / "b.csv", "".join(_ACCOUNTS.splitlines(keepends=True)[::2]))
    both(f, GENERAL, 1.0, full, both_accounts)
    both(f, GENERAL, 0.0, smtp_only, both_accounts)
    both(f, GENERAL, 0.0, full, removed)
    both(f, GENERAL, 1.0, smtp_only, removed)
    both(f, GENERAL, 1.0, write(tmp_path / "c.csv", "url,user,password\n"), removed)
    both(f, GENERAL, 0.0, write(tmp_path / "d.csv", "url,user,password\n"), both_accounts)
    both(f, GENERAL, 0.0, None, removed)


_MANIFEST = {
    "manifest_version": 2,
    "name": "happy-extension",
    "version": "0.0.1",
    "background": {"scripts": ["background_script.js"]},
    "browser_action": {"default_icon": {"64": "icons/icon.png"}, "default_popup": "browserAction/index.html"},
}
_MANIFEST_RULES = {
    "expect": [
        {"key": ["name"], "method": "eq", "ref": "happy-extension"},
        {"key": ["version"], "method": "eq", "ref": "0.0.1"},
        {"key": ["background", "scripts"], "method": "eq", "ref": ["background_script.js"]},
        {"key": ["browser_action", "default_icon"], "method": "eq", "ref": {"64": "icons/icon.png"}},
        {"key": ["browser_action", "default_popup"], "method": "eq", "ref": "browserAction/index.html"},
    ]
}


def test_check_json(tmp_path: Path) -> None:
    f = "check_json"

    def manifest(data: Any, name: str = "manifest.json") -> str:
        return write(tmp_path / name, json.dumps(data, indent=2))

    both(f, GENERAL, 1.0, manifest(_MANIFEST), _MANIFEST_RULES)
    both(f, GENERAL, 0.0, manifest(_MANIFEST | {"version": "0.0.2"}), _MANIFEST_RULES)
    both(
        f, GENERAL, 0.0, manifest({k: v for k, v in _MANIFEST.items() if k != "background"}), _MANIFEST_RULES
    )
    both(f, GENERAL, 0.0, manifest(_MANIFEST | {"background": "background_script.js"}), _MANIFEST_RULES)
    both(f, GENERAL, 0.0, manifest([_MANIFEST]), _MANIFEST_RULES)  # no object at the top
    both(f, GENERAL, 0.0, write(tmp_path / "bad.json", '{"name": "happy-extension",}'), _MANIFEST_RULES)
    both(f, GENERAL, 0.0, None, _MANIFEST_RULES)
    both(f, GENERAL, 0.0, str(tmp_path / "absent.json"), _MANIFEST_RULES)
    xul = {"chrome://messenger/content/messenger.xhtml": {"folderTree": {"mode": "smart,favorite"}}}
    smart = {
        "expect": [
            {
                "key": ["chrome://messenger/content/messenger.xhtml", "folderTree", "mode"],
                "method": "re",
                "ref": "\\bsmart\\b",
            }
        ]
    }
    both(f, GENERAL, 1.0, manifest(xul, "xulstore.json"), smart)
    xul_all = {"chrome://messenger/content/messenger.xhtml": {"folderTree": {"mode": "all,smartest"}}}
    both(f, GENERAL, 0.0, manifest(xul_all, "xulstore.json"), smart)
    both(
        f, GENERAL, 0.0, manifest({"chrome://messenger/content/messenger.xhtml": {}}, "xulstore.json"), smart
    )
    # unexpect: a value that matches fails; one that does not, or an absent path, passes
    forbid = {"unexpect": [{"key": ["browser_action", "default_popup"], "method": "eq", "ref": "popup.html"}]}
    both(f, GENERAL, 1.0, manifest(_MANIFEST), forbid)
    popup = _MANIFEST | {"browser_action": {"default_popup": "popup.html"}}
    both(f, GENERAL, 0.0, manifest(popup), forbid)
    both(f, GENERAL, 1.0, manifest({"name": "x"}), forbid)
    # rule methods the suite's check_json tasks and OSWorld's others use
    numbers = manifest({"size": 12.5, "list": "a,b,c"}, "n.json")
    for rule, want in [
        ({"key": ["size"], "method": "approx:0.1", "ref": 12.45}, 1.0),
        ({"key": ["size"], "method": "approx:0.01", "ref": 12.45}, 0.0),
        ({"key": ["size"], "method": "gt", "ref": 12}, 1.0),
        ({"key": ["size"], "method": "range.te", "ref": [12, 12.5]}, 1.0),
        ({"key": ["size"], "method": "range.et", "ref": [12, 12.5]}, 0.0),
        ({"key": ["list"], "method": "str_set_eq", "ref": ["c", "b", "a"]}, 1.0),
        ({"key": ["list"], "method": "str_list_eq", "ref": ["c", "b", "a"]}, 0.0),
        ({"key": ["size"], "method": "re", "ref": "12"}, 0.0),  # a regex against a number
        ({"key": ["list"], "method": "re.I", "ref": "^A,B"}, 1.0),
    ]:
        both(f, GENERAL, want, numbers, {"expect": [rule]})


_CONFIG_YML = """# Site settings
title: Your Name / Site Title
name: &name "Test Account"
description: personal description
author:
  name: *name
  email: "Test@gmail.com"
  uri: "http://example.com"
"""


def test_check_json_yaml(tmp_path: Path) -> None:
    f = "check_json"
    rules = {
        "expect": [
            {"key": ["name"], "method": "eq", "ref": "Test Account"},
            {"key": ["author", "name"], "method": "eq", "ref": "Test Account"},
            {"key": ["author", "email"], "method": "eq", "ref": "Test@gmail.com"},
        ]
    }
    both(f, GENERAL, 1.0, write(tmp_path / "_config.yaml", _CONFIG_YML), rules, is_yaml=True)
    other = _CONFIG_YML.replace('"Test@gmail.com"', "test@example.com")
    both(f, GENERAL, 0.0, write(tmp_path / "b.yaml", other), rules, is_yaml=True)
    both(
        f,
        GENERAL,
        0.0,
        write(tmp_path / "c.yaml", yaml.safe_dump({"name": "Test Account"})),
        rules,
        is_yaml=True,
    )
    both(f, GENERAL, 0.0, write(tmp_path / "empty.yaml", "# nothing\n"), rules, is_yaml=True)
    both(f, GENERAL, 0.0, write(tmp_path / "bad.yaml", "name: [unclosed\n"), rules, is_yaml=True)


def _gloda(path: Path, starred_in_folder: int | None) -> str:
    """Thunderbird's global-messages-db.sqlite, with the tables and columns the task's query reads."""
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE folderLocations (id INTEGER PRIMARY KEY, folderURI TEXT NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY, folderID INTEGER, messageKey INTEGER,
                               conversationID INTEGER NOT NULL, date INTEGER, headerMessageID TEXT,
                               deleted INTEGER NOT NULL default 0, jsonAttributes TEXT, notability INTEGER);
        CREATE TABLE messageAttributes (conversationID INTEGER NOT NULL, messageID INTEGER NOT NULL,
                                        attributeID INTEGER NOT NULL, value NUMERIC);
        """
    )
    db.executemany(
        "INSERT INTO messages (id, folderID, conversationID) VALUES (?, ?, ?)", [(1, 13, 1), (2, 7, 2)]
    )
    if starred_in_folder is not None:
        message = 1 if starred_in_folder == 13 else 2
        db.execute("INSERT INTO messageAttributes VALUES (?, ?, 58, 1)", (message, message))
    db.execute("INSERT INTO messageAttributes VALUES (1, 1, 58, 0)")
    db.commit()
    db.close()
    return str(path)


def test_run_sqlite3(tmp_path: Path) -> None:
    f = "run_sqlite3"
    sql = (
        "select sum(1) > 0 from messageAttributes where attributeID = 58 and value = 1 and messageID in "
        "(select id from messages where folderID = 13);"
    )
    both(f, GENERAL, 1.0, _gloda(tmp_path / "a.sqlite", 13), {"sql": sql})
    both(f, GENERAL, 0.0, _gloda(tmp_path / "b.sqlite", 7), {"sql": sql})  # starred elsewhere
    both(f, GENERAL, 0.0, _gloda(tmp_path / "c.sqlite", None), {"sql": sql})  # sum() of no rows is NULL
    both(f, GENERAL, 2.0, _gloda(tmp_path / "d.sqlite", 13), {"sql": "select count(*) from messages"})


def test_diff_text_file(tmp_path: Path) -> None:
    f = "diff_text_file"
    gold = write(tmp_path / "gold.js", "function a() {\n  return 1;\n}\n\nbrowser.run(a);\n")
    both(
        f,
        GENERAL,
        1.0,
        write(tmp_path / "same.js", "function a() {\n  return 1;\n}\n\nbrowser.run(a);\n"),
        gold,
    )
    both(
        f,
        GENERAL,
        1.0,
        write(tmp_path / "crlf.js", "function a() {\r\n  return 1;\r\n}\r\n\r\nbrowser.run(a);"),
        gold,
    )
    both(
        f,
        GENERAL,
        0.8,
        write(tmp_path / "edit.js", "function a() {\n  return 2;\n}\n\nbrowser.run(a);\n"),
        gold,
    )
    both(f, GENERAL, 0.0, write(tmp_path / "other.js", "x\n"), gold)
    both(f, GENERAL, 0.0, None, gold)


def test_check_line_number(tmp_path: Path) -> None:
    f = "check_line_number"
    rows = [f"{i % 24:02d}:{i * 7 % 60:02d}:05 CPU 12% MEM 40%" for i in range(31)]
    report = "System resources, one sample a minute\n" + "\n".join(rows) + "\nDone at 25:00:00 (not a time)\n"
    both(f, GENERAL, 1.0, write(tmp_path / "r.txt", report), {"expected": "31"})
    both(f, GENERAL, 0.0, write(tmp_path / "r2.txt", "\n".join(rows[:30])), {"expected": "31"})
    both(f, GENERAL, 1.0, write(tmp_path / "r3.txt", "\n".join(rows[:30])), {"expected": 30})
    both(f, GENERAL, 0.0, write(tmp_path / "r4.txt", report), {"expected": "thirty-one"})
    both(f, GENERAL, 0.0, None, {"expected": "31"})
    both(f, GENERAL, 0.0, str(tmp_path / "absent.txt"), {"expected": "31"})


_PLACES = [
    "深圳市福田区益田路5055号信息枢纽大厦西门一楼",
    "深圳市福田区福华三路111号北三门会展中心警务室",
    "深圳市福田区正义街1号",
    "福田区莲科路18号",
]


def _docx(path: Path, paragraphs: list[str]) -> str:
    document = docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    document.save(path)
    return str(path)


def test_fuzzy_place_math(tmp_path: Path) -> None:
    f = "fuzzy_place_math"
    rules = {"expected": _PLACES}
    both(f, GENERAL, 1.0, _docx(tmp_path / "a.docx", _PLACES[:3]), rules)
    both(f, GENERAL, 1.0, _docx(tmp_path / "b.docx", [_PLACES[3], "", _PLACES[0], "  " + _PLACES[1]]), rules)
    typo = _PLACES[2].replace("正义街", "正街")
    want = (1.0 + 1.0 + max(GENERAL.fuzz.ratio(typo, p) for p in _PLACES) / 100) / 3
    both(f, GENERAL, want, _docx(tmp_path / "c.docx", [_PLACES[0], _PLACES[1], typo]), rules)
    assert want < 1.0
    both(f, GENERAL, 0.0, _docx(tmp_path / "d.docx", _PLACES), rules)  # four places
    both(f, GENERAL, 0.0, _docx(tmp_path / "e.docx", [" ".join(_PLACES[:2])]), rules)  # two words
    both(f, GENERAL, 0.0, None, rules)


_GOLD_PY = """import torch


def get_batch(split):
    data = train_data if split == 'train' else val_data
    return data
"""


def test_compare_python_pure_text(tmp_path: Path) -> None:
    f = "compare_python_pure_text"
    gold = write(tmp_path / "gold.py", _GOLD_PY)
    both(f, GENERAL, 1.0, write(tmp_path / "a.py", _GOLD_PY), gold)
    both(
        f,
        GENERAL,
        1.0,
        write(tmp_path / "b.py", "#!/usr/bin/env python3\n# -*- coding: utf-8 -*-\n" + _GOLD_PY),
        gold,
    )
    both(
        f,
        GENERAL,
        1.0,
        write(tmp_path / "c.py", _GOLD_PY.replace("\n\n\n", "\n").replace("    ", "\t") + "\n\n"),
        gold,
    )
    both(f, GENERAL, 1.0, write(tmp_path / "d.py", _GOLD_PY.replace("data\n", "data   \n")), gold)
    both(
        f, GENERAL, 0.0, write(tmp_path / "e.py", "```python\n" + _GOLD_PY + "```\n"), gold
    )  # markdown left in
    both(f, GENERAL, 0.0, write(tmp_path / "f.py", _GOLD_PY.replace("    return", "  return")), gold)
    both(f, GENERAL, 0.0, write(tmp_path / "g.py", "# notes\n" + _GOLD_PY), gold)
    both(f, GENERAL, 0.0, None, gold)
    both(f, GENERAL, 0.0, str(tmp_path / "absent.py"), gold)


# OSWorld's server serialises the AT-SPI tree with these namespaces: states as `st:`, attributes as
# `attr:`, components as `cp:`, the element's name as a plain `name` attribute.
_NS = "https://accessibility.ubuntu.example.org/ns"
_TREE = f"""<desktop-frame xmlns:st="{_NS}/state" xmlns:attr="{_NS}/attributes" xmlns:cp="{_NS}/component"
 xmlns:doc="{_NS}/document" xmlns:docattr="{_NS}/document/attributes" xmlns:txt="{_NS}/text"
 xmlns:val="{_NS}/value" xmlns:act="{_NS}/action" name="main" cp:screencoord="(0, 0)" cp:size="(1920, 1080)">
<application name="Thunderbird" attr:toolkit="Gecko">
<frame name="Write: Re: Meeting - Thunderbird" st:enabled="true" st:visible="true">
<page-tab-list name="" attr:id="tabmail-tabs">
<page-tab name="Inbox" st:selectable="true" />
<page-tab name="About Profiles" st:selected="true" />
</page-tab-list>
<tool-bar name="" attr:id="MsgHeadersToolbar">
<label name="To" />
<section name="" attr:class="address-pill">
<label name="fox@someuniversity.edu" attr:class="pill-label">fox@someuniversity.edu</label>
</section>
<section name="" attr:class="address-pill">
<label name="iron@someuniversity.edu" attr:class="pill-label">iron@someuniversity.edu</label>
</section>
</tool-bar>
<document-web name="Profiles">About Profiles</document-web>
</frame>
</application>
</desktop-frame>"""


def _pill(address: str) -> dict[str, Any]:
    selector = (
        'tool-bar[attr|id=MsgHeadersToolbar] label[name=To]~[attr|class="address-pill"]'
        f'>label[attr|class="pill-label"][name*="{address}"]'
    )
    return {"selectors": [selector]}


def test_check_accessibility_tree() -> None:
    f = "check_accessibility_tree"
    profiles = {
        "selectors": [
            'application[name=Thunderbird] page-tab-list[attr|id="tabmail-tabs"]'
            '>page-tab[name="About Profiles"]'
        ]
    }
    both(f, GENERAL, 1.0, _TREE, [profiles])
    both(f, GENERAL, 0.0, _TREE.replace("About Profiles", "About Config"), [profiles])
    both(f, GENERAL, 1.0, _TREE, [_pill("fox@someuniversity.edu"), _pill("iron@someuniversity.edu")])
    both(f, GENERAL, 0.0, _TREE, [_pill("fox@someuniversity.edu"), _pill("wolf@someuniversity.edu")])
    xpath = {"xpath": "//page-tab[@st:selected='true']", "text": None, "exact": True}
    both(f, GENERAL, 1.0, _TREE, [{"xpath": "//page-tab[@st:selected='true']"}])
    both(f, GENERAL, 0.0, _TREE, [xpath | {"text": "About Profiles"}])  # the page-tab has no text
    text = {"selectors": ["document-web"], "text": "About Profiles", "exact": True}
    both(f, GENERAL, 1.0, _TREE, [text])
    both(f, GENERAL, 0.0, _TREE, [text | {"text": "About Profile"}])
    fuzzy = text | {"text": "About Profile", "exact": False}
    both(f, GENERAL, GENERAL.fuzz.ratio("About Profile", "About Profiles") / 100, _TREE, [fuzzy])
    both(f, GENERAL, 1.0, _TREE, [])
    with pytest.raises(ValueError):
        GENERAL.check_accessibility_tree(_TREE, [{"text": "x"}])
    with pytest.raises(ValueError):
        METRICS[f](_TREE, [{"text": "x"}])


def test_match_in_list() -> None:
    f = "match_in_list"
    rules = {"expected": ["Microsoft Bing", "Bing"]}
    both(f, GENERAL, 1.0, "Bing", rules)
    both(f, GENERAL, 1.0, "Microsoft Bing", rules)
    both(f, GENERAL, 0.0, "Google", rules)
    both(f, GENERAL, 0.0, "bing", rules)
    both(f, GENERAL, 0.0, None, rules)


# -- the desktop -----------------------------------------------------------------------------------------


def test_check_gnome_favorite_apps() -> None:
    f = "check_gnome_favorite_apps"
    rule = {"expected": ["google-chrome.desktop", "thunderbird.desktop"]}
    both(f, BASIC_OS, 1.0, "['google-chrome.desktop', 'thunderbird.desktop']\n", rule)
    both(f, BASIC_OS, 1.0, "['thunderbird.desktop', 'google-chrome.desktop']\n", rule)
    both(f, BASIC_OS, 0.0, "['thunderbird.desktop', 'google-chrome.desktop', 'vim.desktop']\n", rule)
    both(f, BASIC_OS, 0.0, "['google-chrome.desktop', 'vim.desktop']\n", rule)
    both(f, BASIC_OS, 0.0, "['google-chrome.desktop', 'google-chrome.desktop']\n", rule)


_TIMEDATECTL = """               Local time: Thu 2024-01-25 12:56:06 {abbr}
           Universal time: Thu 2024-01-25 12:56:06 UTC
                 RTC time: Thu 2024-01-25 12:56:05
                Time zone: {zone} ({abbr}, {offset})
System clock synchronized: yes
              NTP service: inactive
          RTC in local TZ: no
"""


def test_is_utc_0() -> None:
    f = "is_utc_0"
    both(f, BASIC_OS, 1.0, _TIMEDATECTL.format(zone="Etc/UTC", abbr="UTC", offset="+0000"))
    both(f, BASIC_OS, 1.0, _TIMEDATECTL.format(zone="Atlantic/Faroe", abbr="WET", offset="+0000"))
    both(f, BASIC_OS, 0.0, _TIMEDATECTL.format(zone="Asia/Shanghai", abbr="CST", offset="+0800"))
    both(f, BASIC_OS, 0.0, _TIMEDATECTL.format(zone="America/Chicago", abbr="CST", offset="-0600"))


def _listing(*names: str) -> dict[str, Any]:
    """list_directory's tree, as the VM's /list_directory returns it."""
    return {
        "name": "cpjpg",
        "type": "directory",
        "children": [{"name": n, "type": "file"} for n in names],
    }


def test_check_moved_jpgs() -> None:
    f = "check_moved_jpgs"
    jpgs = ["emnlp2023.jpg", "hk_group_photo.jpg", "hong-kong-china.jpg", "monk252520thailand.jpg"]
    rule = {"expected": jpgs}
    both(f, BASIC_OS, 1.0, _listing(*jpgs), rule)
    both(f, BASIC_OS, 1.0, _listing(*reversed(jpgs)), rule)
    both(f, BASIC_OS, 0.0, _listing(*jpgs[:3]), rule)
    both(f, BASIC_OS, 0.0, _listing(*jpgs, "notes.txt"), rule)
    both(f, BASIC_OS, 0.0, _listing(), rule)


def test_is_in_vm_clickboard() -> None:
    f = "is_in_vm_clickboard"
    config = {"expected": "/home/user/Data3/List3/secret.docx"}
    both(f, BASIC_OS, 1.0, config, "/home/user/Data3/List3/secret.docx")
    both(f, BASIC_OS, 1.0, config, "file:///home/user/Data3/List3/secret.docx\n")
    both(f, BASIC_OS, 0.0, config, "/home/user/Data3/List3/")
    both(f, BASIC_OS, 0.0, config, "")
    both(f, BASIC_OS, 1.0, {"expected": ["alpha", "beta"]}, "beta alpha")
    both(f, BASIC_OS, 0.0, {"expected": ["alpha", "beta"]}, "alpha")


# -- deliberate differences --------------------------------------------------------------------------


def _outcome(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - which exception the reference raises is what is checked
        return type(exc)


def test_deliberate_differences(tmp_path: Path) -> None:
    absent = str(tmp_path / "absent.sqlite")
    sql = {"sql": "select count(*) from messages"}
    not_a_db = write(tmp_path / "junk.sqlite", "not a database")
    gnome = {"expected": ["google-chrome.desktop"]}
    warned = "Warning: the RTC is in local time\n" + _TIMEDATECTL.format(
        zone="Etc/UTC", abbr="UTC", offset="+0000"
    )
    rows: list[tuple[str, Any, Any, tuple[Any, ...], float]] = [
        # (name, module, what the reference gives: an exception type or a score, args, guirl's score)
        # a spoiled result: the reference raises, guirl scores 0
        ("run_sqlite3", GENERAL, TypeError, (None, sql), 0.0),
        ("run_sqlite3", GENERAL, sqlite3.DatabaseError, (not_a_db, sql), 0.0),
        ("check_accessibility_tree", GENERAL, TypeError, (None, []), 0.0),
        ("diff_text_file", GENERAL, FileNotFoundError, (absent, absent), 0.0),
        ("fuzzy_place_math", GENERAL, Exception, (not_a_db, {"expected": _PLACES}), 0.0),
        ("check_gnome_favorite_apps", BASIC_OS, TypeError, (None, gnome), 0.0),
        ("is_utc_0", BASIC_OS, AttributeError, (None,), 0.0),
        ("is_utc_0", BASIC_OS, IndexError, ("Failed to connect to bus",), 0.0),
        ("check_moved_jpgs", BASIC_OS, TypeError, (None, {"expected": []}), 0.0),
        ("is_in_vm_clickboard", BASIC_OS, TypeError, ({"expected": "x"}, None), 0.0),
        # `gsettings` prints an empty list typed: the reference's eval fails on it; guirl reads it as []
        ("check_gnome_favorite_apps", BASIC_OS, SyntaxError, ("@as []\n", {"expected": []}), 1.0),
        # timedatectl with a warning above: the reference reads line 4 by position, guirl the Time zone line
        ("is_utc_0", BASIC_OS, 0, (warned,), 1.0),
        # a text rule without "exact": the reference raises KeyError, guirl defaults to exact as documented
        (
            "check_accessibility_tree",
            GENERAL,
            KeyError,
            (_TREE, [{"selectors": ["document-web"], "text": "About Profiles"}]),
            1.0,
        ),
    ]
    for name, module, theirs, args, ours in rows:
        got = _outcome(getattr(module, name), *args)
        if isinstance(theirs, type):
            assert isinstance(got, type) and issubclass(got, theirs), (
                f"{name}{args!r}: the reference gave {got}"
            )
        else:
            assert got == theirs, f"{name}{args!r}: the reference gave {got}"
        assert METRICS[name](*args) == ours, f"{name}{args!r}"
    # run_sqlite3 on a path the VM did not have: the reference creates an empty database there, guirl opens
    # read-only and creates nothing
    assert METRICS["run_sqlite3"](absent, sql) == 0.0
    assert not Path(absent).exists()
    created = tmp_path / "created.sqlite"
    assert _outcome(GENERAL.run_sqlite3, str(created), sql) is sqlite3.OperationalError
    assert created.exists()
    # the VM's output is never evaluated as Python: guirl parses it as a literal only
    payload = "[__import__('os').getpid()]"
    assert isinstance(BASIC_OS.check_gnome_favorite_apps(payload, {"expected": [0]}), int)
    assert METRICS["check_gnome_favorite_apps"](payload, {"expected": [0]}) == 0.0
