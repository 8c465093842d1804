"""Parity of guirl's settings metrics (VS Code, Thunderbird, VLC) with OSWorld's (desktop-env 1.0.2
`metrics/vscode.py`, `thunderbird.py`, `vlc.py`), and this family's getters (vlc_config,
vlc_playing_info, default_video_player, vscode_config, vm_window_size, accessibility_tree) run on a
real local desktop (guirl's VM: Xvfb, icewm, guirl's VM server; the accessibility tree through AT-SPI).

Inputs are the applications' own formats: VS Code's settings.json and keybindings.json, Thunderbird's
prefs.js, msgFilterRules.dat and mbox folders, VLC 3.0.24's vlcrc (its lines as `vlc --reset-config`
writes them) and the status.xml of VLC's HTTP interface (captured from VLC 3.0.24 playing a file), PDFs
written by LibreOffice. Each case states the score both implementations must give; where guirl differs
on purpose, a separate test says what the reference does and what guirl does instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from guirl.vmpool.client import VMClient
from guirl.vmpool.local import LocalProvider
from guirl.vmpool.tasks.getters import apps_vlc_vscode, get
from guirl.vmpool.tasks.metrics import METRICS, settings
from guirl.vmpool.tasks.setup import TaskContext
from tests.osworld_reference import both, reference, write

VSCODE = reference("metrics.vscode")
THUNDERBIRD = reference("metrics.thunderbird")
VLC = reference("metrics.vlc", absent=["acoustid"])  # imported by its audio comparison only
GENERAL = reference("metrics.general")


# -- VS Code -------------------------------------------------------------------------------------------


def _settings_json(tmp_path: Path, settings: dict[str, Any], name: str = "settings.json") -> str:
    return write(tmp_path / name, json.dumps(settings, indent=4))  # VS Code writes 4-space JSON


def test_check_json_settings(tmp_path: Path) -> None:
    f = "check_json_settings"
    wrap = {"editor.wordWrapColumn": 50, "workbench.colorTheme": "Default Dark Modern"}
    both(f, VSCODE, 1.0, _settings_json(tmp_path, wrap), {"expected": {"editor.wordWrapColumn": 50}})
    both(f, VSCODE, 0.0, _settings_json(tmp_path, wrap), {"expected": {"editor.wordWrapColumn": 60}})
    autosave = {"files.autoSave": "afterDelay", "files.autoSaveDelay": 500}
    rules = {"expected": {"files.autoSave": "afterDelay", "files.autoSaveDelay": 500}}
    both(f, VSCODE, 1.0, _settings_json(tmp_path, autosave), rules)
    both(f, VSCODE, 0.0, _settings_json(tmp_path, {"files.autoSave": "afterDelay"}), rules)  # key missing
    nested = {"files.exclude": {"**/__pycache__": True}}
    both(f, VSCODE, 1.0, _settings_json(tmp_path, nested), {"expected": nested})
    both(f, VSCODE, 0.0, _settings_json(tmp_path, {"files.exclude": {"**/.git": True}}), {"expected": nested})
    both(
        f,
        VSCODE,
        1.0,
        _settings_json(tmp_path, {"debug.focusEditorOnBreak": False}),
        {"expected": {"debug.focusEditorOnBreak": False}},
    )
    workspace = {"folders": [{"path": "project"}, {"path": "data1"}, {"path": "data2"}], "settings": {}}
    path = _settings_json(tmp_path, workspace, "project.code-workspace")
    both(f, VSCODE, 1.0, path, {"expected": {"folders": workspace["folders"]}})
    both(f, VSCODE, 0.0, path, {"expected": {"folders": workspace["folders"][:2]}})
    # spoiled: JSONC comments (unparsable as JSON), no file fetched, a path that is not there
    commented = write(tmp_path / "c.json", '{\n    // wrap\n    "editor.wordWrapColumn": 50\n}\n')
    both(f, VSCODE, 0.0, commented, {"expected": {"editor.wordWrapColumn": 50}})
    both(f, VSCODE, 0.0, None, {"expected": {"editor.wordWrapColumn": 50}})
    both(f, VSCODE, 0.0, str(tmp_path / "absent.json"), {"expected": {"editor.wordWrapColumn": 50}})


_KEYBINDINGS_HEADER = "// Place your key bindings in this file to override the defaults\n"


def test_check_json_keybindings(tmp_path: Path) -> None:
    f = "check_json_keybindings"
    focus = {"key": "ctrl+j", "command": "workbench.action.focusActiveEditorGroup", "when": "terminalFocus"}
    find = {"key": "ctrl+f", "command": "-list.find", "when": "listFocus && listSupportsFind"}
    with_header = write(tmp_path / "k1.json", _KEYBINDINGS_HEADER + json.dumps([focus, find], indent=4))
    both(f, VSCODE, 1.0, with_header, {"expected": focus})
    both(f, VSCODE, 1.0, with_header, {"expected": find})
    plain = write(tmp_path / "k2.json", json.dumps([find], indent=4))
    both(f, VSCODE, 1.0, plain, {"expected": find})
    both(f, VSCODE, 0.0, plain, {"expected": focus})
    both(f, VSCODE, 0.0, plain, {"expected": dict(find, when="listFocus")})  # the `when` differs
    both(f, VSCODE, 0.0, write(tmp_path / "k3.json", json.dumps(find)), {"expected": find})  # no list
    both(f, VSCODE, 0.0, write(tmp_path / "k4.json", _KEYBINDINGS_HEADER), {"expected": find})
    both(f, VSCODE, 0.0, None, {"expected": find})


def test_compare_config(tmp_path: Path) -> None:
    f = "compare_config"
    theme = '{"workbench.colorTheme": "Visual Studio Dark"}\n'
    both(f, VSCODE, 1.0, write(tmp_path / "s.json", theme), {"expected": theme})
    both(f, VSCODE, 0.0, write(tmp_path / "s2.json", theme.strip()), {"expected": theme})
    both(f, VSCODE, 1.0, write(tmp_path / "OpenProject.txt", "project"), {"expected": "project"})
    both(f, VSCODE, 0.0, write(tmp_path / "OpenProject2.txt", "data1"), {"expected": "project"})
    both(f, VSCODE, 0.0, None, {"expected": "project"})


def test_is_extension_installed() -> None:
    f = "is_extension_installed"
    both(f, VSCODE, 1.0, "ms-python.python\n", {"type": "contain", "expected": "ms-python.python"})
    both(f, VSCODE, 0.0, "", {"type": "contain", "expected": "ms-python.python"})
    both(f, VSCODE, 1.0, "test.py\n", {"type": "contain", "expected": "test.py"})
    both(f, VSCODE, 0.0, "mattn.lisp\n", {"type": "not_contain", "expected": "mattn.lisp"})
    both(f, VSCODE, 1.0, "", {"type": "not_contain", "expected": "mattn.lisp"})
    # a task type neither knows: both raise
    with pytest.raises(NotImplementedError):
        VSCODE.is_extension_installed("x", {"type": "equal", "expected": "x"})
    with pytest.raises(ValueError):
        METRICS[f]("x", {"type": "equal", "expected": "x"})


def test_compare_result_files(tmp_path: Path) -> None:
    f = "compare_result_files"
    gold = write(tmp_path / "gold.txt", "42\n")
    both(f, VSCODE, 1.0, write(tmp_path / "r1.txt", "42"), gold)
    both(f, VSCODE, 1.0, write(tmp_path / "r2.txt", "The answer is 42."), gold)  # gold's text inside
    both(f, VSCODE, 1.0, write(tmp_path / "r3.txt", "41.99999"), gold)  # within 1e-4
    both(f, VSCODE, 0.0, write(tmp_path / "r4.txt", "41.9"), gold)
    both(f, VSCODE, 0.0, write(tmp_path / "r5.txt", "forty-two"), gold)
    text_gold = write(tmp_path / "gold2.txt", "Paris\n")
    both(f, VSCODE, 1.0, write(tmp_path / "r6.txt", "  Paris  "), text_gold)
    both(f, VSCODE, 0.0, write(tmp_path / "r7.txt", "paris"), text_gold)
    both(f, VSCODE, 0.0, None, gold)


@pytest.fixture(scope="module")
def pdfs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """PDFs written by LibreOffice: `a` and `a_again` from the same text (bytes differ), `b` from another."""
    src = tmp_path_factory.mktemp("pdf-src")
    texts = {
        "a": "Recruitment and retention of health professionals across Europe.\n" * 8,
        "b": "A wholly different report on the weather in spring and autumn.\n" * 8,
    }
    for name, text in texts.items():
        (src / f"{name}.txt").write_text(text)
    (src / "a_again.txt").write_text(texts["a"])
    out = tmp_path_factory.mktemp("pdf-out")
    subprocess.run(
        [
            "soffice",
            "--headless",
            "--convert-to",
            "pdf",
            "--outdir",
            str(out),
            *sorted(map(str, src.glob("*.txt"))),
        ],
        check=True,
        capture_output=True,
        timeout=120,
        env=dict(os.environ, HOME=str(out)),  # its own profile: other soffice runs may be going on
    )
    return {p.stem: p.read_bytes() for p in out.glob("*.pdf")}


def _zip(path: Path, members: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return str(path)


def test_compare_zip_files(tmp_path: Path, pdfs: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the reference writes temp.pdf into the working directory
    f = "compare_zip_files"
    assert pdfs["a"] != pdfs["a_again"]
    gold = _zip(tmp_path / "gold.zip", {"report.pdf": pdfs["a"], "notes/readme.txt": b"hello\n"})
    both(
        f,
        VSCODE,
        1.0,
        _zip(tmp_path / "same.zip", {"report.pdf": pdfs["a"], "notes/readme.txt": b"hello\n"}),
        gold,
    )
    # the same text, re-exported: the PDF's bytes differ, its text does not
    both(
        f,
        VSCODE,
        1.0,
        _zip(tmp_path / "again.zip", {"notes/readme.txt": b"hello\n", "report.pdf": pdfs["a_again"]}),
        gold,
    )
    both(
        f,
        VSCODE,
        0.0,
        _zip(tmp_path / "other.zip", {"report.pdf": pdfs["b"], "notes/readme.txt": b"hello\n"}),
        gold,
    )
    both(
        f,
        VSCODE,
        0.0,
        _zip(tmp_path / "txt.zip", {"report.pdf": pdfs["a"], "notes/readme.txt": b"hello!\n"}),
        gold,
    )
    both(f, VSCODE, 0.0, _zip(tmp_path / "names.zip", {"report.pdf": pdfs["a"]}), gold)
    both(f, VSCODE, 0.0, None, gold)


def _suite(tmp_path: Path, body: str, **modules: str) -> str:
    for name, source in modules.items():
        write(tmp_path / f"{name}.py", source)
    return write(tmp_path / "test_suite.py", body)


@pytest.mark.parametrize(
    ("body", "want"),
    [
        ("from snake import Snake\ndef test():\n    return Snake().length == 3\n", 1.0),
        ("from snake import Snake\ndef test():\n    return Snake().length == 4\n", 0.0),
        ("def test():\n    return 0.5\n", 0.5),
        ("def test():\n    return 7\n", 1.0),
        ("def test():\n    return -2\n", 0.0),
        ("def test():\n    return 'some text'\n", 1.0),
        ("def test():\n    return []\n", 0.0),
        ("def test():\n    raise AssertionError('the snake did not grow')\n", 0.0),
        ("def check():\n    return True\n", 0.0),  # no function named `test`
        ("test = True\n", 0.0),  # not callable
        ("def test(:\n", 0.0),  # a syntax error
        ("import no_such_module\ndef test():\n    return True\n", 0.0),
        ("import os\ndef test():\n    return open('settings.py').read().startswith('WIDTH')\n", 1.0),  # cwd
    ],
)
def test_check_python_file_by_test_suite(tmp_path: Path, body: str, want: float) -> None:
    snake = "class Snake:\n    def __init__(self):\n        self.length = 3\n"
    suite = _suite(tmp_path, body, snake=snake, settings="WIDTH = 600\n")
    files = [str(tmp_path / "snake.py"), str(tmp_path / "settings.py")]
    cwd = os.getcwd()
    try:
        both("check_python_file_by_test_suite", VSCODE, want, files, suite)
    finally:
        sys.modules.pop("snake", None)  # the reference imports the agent's modules into this process
    assert os.getcwd() == cwd


def test_check_python_file_by_test_suite_options(tmp_path: Path) -> None:
    f = "check_python_file_by_test_suite"
    suite = _suite(tmp_path, "def test():\n    return False\ndef test_game():\n    return True\n")
    both(f, VSCODE, 1.0, [], suite, test_function_name="test_game")
    both(f, VSCODE, 0.0, [], suite)
    both(f, VSCODE, 0.0, [], None)
    both(f, VSCODE, 0.0, [], str(tmp_path / "absent.py"))
    both(f, VSCODE, 0.0, [], str(tmp_path))  # a directory


# -- Thunderbird -------------------------------------------------------------------------------------

_PREFS_HEADER = """// Mozilla User Preferences

// DO NOT EDIT THIS FILE.
//
// If you make changes to this file while the application is running,
// the changes will be overwritten when the application exits.
//
// To change a preference value, you can either:
// - modify it via the UI (e.g. via about:config in the browser); or
// - set it within a user.js file in your profile.

"""


def _prefs(tmp_path: Path, prefs: dict[str, Any], name: str = "prefs.js") -> str:
    lines = [
        f"user_pref({json.dumps(k)}, {json.dumps(v, ensure_ascii=False)});" for k, v in sorted(prefs.items())
    ]
    return write(tmp_path / name, _PREFS_HEADER + "\n".join(lines) + "\n")


_BASE_PREFS = {
    "app.donation.eoy.version.viewed": 6,
    "mail.account.account1.server": "server1",
    "mail.identity.id1.fullName": "Anonym",
    "mail.server.server1.hostname": "outlook.office365.com",
}


def test_check_thunderbird_prefs(tmp_path: Path) -> None:
    f = "check_thunderbird_prefs"
    filters = {
        "expect": {
            "mail.server.default.applyIncomingFilters": {"method": "eq", "ref": True},
            "mail.imap.use_status_for_biff": {"method": "eq", "ref": False},
        },
        "unexpect": {"mail.server.default.autosync_offline_stores": {"method": "eq", "ref": False}},
    }
    on = {"mail.server.default.applyIncomingFilters": True, "mail.imap.use_status_for_biff": False}
    both(f, THUNDERBIRD, 1.0, _prefs(tmp_path, _BASE_PREFS | on), filters)
    offline_off = on | {"mail.server.default.autosync_offline_stores": False}
    both(f, THUNDERBIRD, 0.0, _prefs(tmp_path, _BASE_PREFS | offline_off), filters)
    offline_on = on | {"mail.server.default.autosync_offline_stores": True}
    both(f, THUNDERBIRD, 1.0, _prefs(tmp_path, _BASE_PREFS | offline_on), filters)
    both(
        f, THUNDERBIRD, 0.0, _prefs(tmp_path, _BASE_PREFS | {"mail.imap.use_status_for_biff": False}), filters
    )
    theme = {"expect": {"extensions.activeThemeID": {"method": "re", "ref": "dark"}}}
    both(
        f,
        THUNDERBIRD,
        1.0,
        _prefs(tmp_path, _BASE_PREFS | {"extensions.activeThemeID": "thunderbird-compact-dark@mozilla.org"}),
        theme,
    )
    both(
        f,
        THUNDERBIRD,
        0.0,
        _prefs(tmp_path, _BASE_PREFS | {"extensions.activeThemeID": "default-theme@mozilla.org"}),
        theme,
    )
    both(f, THUNDERBIRD, 0.0, _prefs(tmp_path, _BASE_PREFS), theme)  # a default: not in prefs.js
    signature = {"expect": {"mail.identity.id1.htmlSigText": {"method": "re.S", "ref": "Anonym\\nXYZ Lab"}}}
    both(
        f,
        THUNDERBIRD,
        1.0,
        _prefs(tmp_path, _BASE_PREFS | {"mail.identity.id1.htmlSigText": "Anonym\nXYZ Lab"}),
        signature,
    )
    both(
        f,
        THUNDERBIRD,
        0.0,
        _prefs(tmp_path, _BASE_PREFS | {"mail.identity.id1.htmlSigText": "Anonym XYZ Lab"}),
        signature,
    )
    both(
        f,
        THUNDERBIRD,
        1.0,
        _prefs(tmp_path, _BASE_PREFS | {"mail.identity.id1.htmlSigText": 'Anonym\nXYZ Lab "Ü"'}),
        signature,
    )
    quote = {"expect": {"mail.identity.id1.auto_quote": {"method": "eq", "ref": False}}}
    both(f, THUNDERBIRD, 1.0, _prefs(tmp_path, _BASE_PREFS | {"mail.identity.id1.auto_quote": False}), quote)
    both(f, THUNDERBIRD, 0.0, _prefs(tmp_path, _BASE_PREFS | {"mail.identity.id1.auto_quote": True}), quote)
    both(f, THUNDERBIRD, 0.0, None, quote)


_FILTER_HEADER = 'version="9"\nlogging="no"\n'


def _filter(name: str, actions: list[tuple[str, str | None]], condition: str, enabled: str = "yes") -> str:
    lines = [f'name="{name}"', f'enabled="{enabled}"', 'type="17"']
    for action, value in actions:
        lines.append(f'action="{action}"')
        if value is not None:
            lines.append(f'actionValue="{value}"')
    lines.append(f'condition="{condition}"')
    return "\n".join(lines) + "\n"


_PROMOTIONS = {
    "expect": [
        {
            "enabled": "yes",
            "action": "Move to folder",
            "actionValue": "mailbox://nobody@Local%20Folders/Promotions",
            "condition": ["AND (subject,contains,discount)"],
        }
    ]
}
_FORWARD = {
    "expect": [
        {"enabled": "yes", "action": "Forward", "actionValue": "anonym-x2024@gmail.com", "condition": ["ALL"]}
    ]
}
_MOVE = ("Move to folder", "mailbox://nobody@Local%20Folders/Promotions")


def test_check_thunderbird_filter(tmp_path: Path) -> None:
    f = "check_thunderbird_filter"

    def rules_file(*filters: str) -> str:
        return write(tmp_path / "msgFilterRules.dat", _FILTER_HEADER + "".join(filters))

    promo = _filter("discount", [_MOVE], "AND (subject,contains,discount)")
    both(f, THUNDERBIRD, 1.0, rules_file(promo), _PROMOTIONS)
    both(f, THUNDERBIRD, 1.0, rules_file(_filter("other", [("Mark read", None)], "ALL"), promo), _PROMOTIONS)
    both(
        f,
        THUNDERBIRD,
        0.0,
        rules_file(_filter("discount", [_MOVE], "AND (subject,contains,discount)", "no")),
        _PROMOTIONS,
    )
    both(
        f,
        THUNDERBIRD,
        0.0,
        rules_file(_filter("discount", [_MOVE], "AND (body,contains,discount)")),
        _PROMOTIONS,
    )
    both(
        f,
        THUNDERBIRD,
        0.0,
        rules_file(_filter("discount", [_MOVE], "AND (subject,contains,discount) AND (from,contains,shop)")),
        _PROMOTIONS,
    )
    both(
        f,
        THUNDERBIRD,
        0.0,
        rules_file(
            _filter(
                "discount",
                [("Move to folder", "mailbox://nobody@Local%20Folders/Trash")],
                "AND (subject,contains,discount)",
            )
        ),
        _PROMOTIONS,
    )
    both(f, THUNDERBIRD, 0.0, rules_file(), _PROMOTIONS)
    forward = _filter("fwd", [("Forward", "anonym-x2024@gmail.com")], "ALL")
    both(f, THUNDERBIRD, 1.0, rules_file(forward), _FORWARD)
    both(f, THUNDERBIRD, 0.0, rules_file(_filter("fwd", [("Forward", "someone@gmail.com")], "ALL")), _FORWARD)
    quoted = _filter("q", [("Delete", None)], 'OR (from,contains,\\"Shop, Inc\\") OR (subject,is,sale)')
    rules = {"expect": [{"condition": ['OR (from,contains,"Shop, Inc")', "OR (subject,is,sale)"]}]}
    both(f, THUNDERBIRD, 1.0, rules_file(quoted), rules)
    unexpect = {"unexpect": [{"action": "Delete"}]}
    both(f, THUNDERBIRD, 0.0, rules_file(quoted), unexpect)
    both(f, THUNDERBIRD, 1.0, rules_file(promo), unexpect)
    both(f, THUNDERBIRD, 0.0, None, _PROMOTIONS)


def _message(subject: str, status: str = "0001", stored: str = "Mon Jan 15 09:30:00 2024") -> str:
    return (
        f"From - {stored}\n"
        f"X-Mozilla-Status: {status}\n"
        "X-Mozilla-Status2: 00000000\n"
        "X-Mozilla-Keys:                                                                                 \n"
        "Date: Fri, 12 Jan 2024 08:00:00 +0000\n"
        "From: billing@example.com\n"
        "To: anonym-x2024@outlook.com\n"
        f"Subject: {subject}\n"
        "MIME-Version: 1.0\n"
        "Content-Type: text/plain; charset=UTF-8\n"
        "\n"
        f"Your bill: {subject}.\n"
        "\n"
    )


def test_check_thunderbird_folder(tmp_path: Path) -> None:
    f = "check_thunderbird_folder"
    opts = {"remove_deleted": True, "remove_duplicate": True}
    gold = write(tmp_path / "Bills_gold", _message("March") + _message("April"))
    both(f, THUNDERBIRD, 1.0, write(tmp_path / "Bills", _message("March") + _message("April")), gold, **opts)
    both(f, THUNDERBIRD, 1.0, write(tmp_path / "Bills2", _message("April") + _message("March")), gold)
    # moved here today: the From line carries the time it was stored
    moved = _message("March", stored="Tue Dec  1 18:00:00 2026") + _message("April")
    both(f, THUNDERBIRD, 1.0, write(tmp_path / "Bills3", moved), gold, **opts)
    empty_gold = write(tmp_path / "empty_gold", "")
    both(f, THUNDERBIRD, 1.0, write(tmp_path / "empty", ""), empty_gold, **opts)
    both(f, THUNDERBIRD, 0.0, write(tmp_path / "not_empty", _message("March")), empty_gold, **opts)
    both(f, THUNDERBIRD, 0.0, write(tmp_path / "empty2", ""), gold, **opts)
    both(f, THUNDERBIRD, 0.0, None, gold, **opts)
    seen_gold = write(tmp_path / "have_seen_gold", _message("January"))
    seen = write(tmp_path / "have_seen", _message("January", stored="Tue Dec  1 18:00:00 2026"))
    bills = write(
        tmp_path / "Bills4", _message("January", status="0009") + _message("March") + _message("April")
    )
    both(f, THUNDERBIRD, 1.0, [seen, bills], [seen_gold, gold], **opts)
    both(f, THUNDERBIRD, 0.0, [None, bills], [seen_gold, gold], **opts)


# -- VLC ---------------------------------------------------------------------------------------------

# vlcrc's header and the lines of the options these metrics read, as VLC 3.0.24 writes them: an option
# at its default commented out with its default value, a set one without the "#".
_VLCRC = """\ufeff###
###  vlc 3.0.24
###

###
### lines beginning with a '#' character are comments
###

[qt] # Qt interface

# Start in minimal view (without menus) (boolean)
#qt-minimal-view=0

# Define the colors of the volume slider (string)
#qt-slider-colours=153;210;153;20;210;20;255;199;15;245;39;29

# Display background cone or art (boolean)
#qt-bgcone=1

# Expanding background cone or art (boolean)
#qt-bgcone-expands=0

# Maximum Volume displayed (integer)
#qt-max-volume=125

[core] # core program

# Record directory (string)
#input-record-path=

# Allow only one running instance (boolean)
#one-instance=0

# Use only one instance when started from file manager (boolean)
#one-instance-when-started-from-file=1

# Play/Pause (string)
#global-key-play-pause=

# Play/Pause (string)
#key-play-pause=Space	Media Play Pause
"""


def vlcrc(tmp_path: Path, **options: str) -> str:
    """A vlcrc with `options` (underscores for dashes) set, as VLC saves a changed preference."""
    text = _VLCRC
    for key, value in options.items():
        name = key.replace("_", "-")
        start = text.index(f"\n#{name}=") + 1
        end = text.index("\n", start)
        text = text[:start] + f"{name}={value}" + text[end:]
    path = tmp_path / f"vlcrc-{len(list(tmp_path.iterdir()))}"
    return write(path, text)


def test_vlc_options(tmp_path: Path) -> None:
    default = vlcrc(tmp_path)
    cases: list[tuple[str, str, Any, dict[str, str]]] = [
        ("check_qt_bgcone", "expected_qt_bgcone", 0, {"qt_bgcone": "0"}),
        ("check_qt_max_volume", "expected_qt_max_volume", 200, {"qt_max_volume": "200"}),
        ("check_qt_minimal_view", "expected_qt_minimal_view", 1, {"qt_minimal_view": "1"}),
        (
            "check_one_instance_when_started_from_file",
            "expected_one_instance_when_started_from_file",
            0,
            {"one_instance_when_started_from_file": "0"},
        ),
        (
            "check_global_key_play_pause",
            "expected_global_key_play_pause",
            1,
            {"global_key_play_pause": "Ctrl+Space"},
        ),
    ]
    for name, key, want, setting in cases:
        both(name, VLC, 0.0, default, {key: want})  # the task's value is never VLC's default
        both(name, VLC, 1.0, vlcrc(tmp_path, **setting), {key: want})
        both(name, VLC, 1.0, vlcrc(tmp_path, **setting), {key: str(want)})
    both(
        "check_qt_max_volume", VLC, 0.0, vlcrc(tmp_path, qt_max_volume="150"), {"expected_qt_max_volume": 200}
    )
    both("check_qt_bgcone", VLC, 1.0, vlcrc(tmp_path, qt_bgcone_expands="1"), {"expected_qt_bgcone": 1})
    both("check_global_key_play_pause", VLC, 1.0, default, {"expected_global_key_play_pause": 0})
    both(
        "check_global_key_play_pause",
        VLC,
        0.0,
        vlcrc(tmp_path, global_key_play_pause="Space"),
        {"expected_global_key_play_pause": 0},
    )


def test_vlc_defaults(tmp_path: Path) -> None:
    """A vlcrc without the options' lines (VLC without its Qt plugin writes no [qt] section): defaults."""
    bare = write(tmp_path / "vlcrc", _VLCRC[: _VLCRC.index("[qt]")])
    both("check_qt_bgcone", VLC, 1.0, bare, {"expected_qt_bgcone": 1})
    both("check_qt_max_volume", VLC, 1.0, bare, {"expected_qt_max_volume": 125})
    both("check_qt_minimal_view", VLC, 1.0, bare, {"expected_qt_minimal_view": 0})
    rule = {"expected_one_instance_when_started_from_file": 1}
    both("check_one_instance_when_started_from_file", VLC, 1.0, bare, rule)
    both("check_global_key_play_pause", VLC, 1.0, bare, {"expected_global_key_play_pause": 0})
    default_colours = "153;210;153;20;210;20;255;199;15;245;39;29"
    rule = {"type": "match", "expected_qt_slider_colours": default_colours}
    both("check_qt_slider_colours", VLC, 1.0, bare, rule)
    both("is_vlc_recordings_folder", VLC, 0.0, bare, {"recording_file_path": ""})


def test_check_qt_slider_colours(tmp_path: Path) -> None:
    f = "check_qt_slider_colours"
    both(f, VLC, 0.0, vlcrc(tmp_path), {"type": "blackish"})
    black = "0;0;0;10;10;10;20;20;20;5;5;5"
    both(f, VLC, 1.0, vlcrc(tmp_path, qt_slider_colours=black), {"type": "blackish"})
    both(
        f,
        VLC,
        0.0,
        vlcrc(tmp_path, qt_slider_colours="0;0;0;10;10;10;20;20;20;5;5;120"),
        {"type": "blackish"},
    )
    both(f, VLC, 0.0, vlcrc(tmp_path, qt_slider_colours="black"), {"type": "blackish"})
    both(
        f,
        VLC,
        1.0,
        vlcrc(tmp_path, qt_slider_colours=black),
        {"type": "match", "expected_qt_slider_colours": black},
    )
    both(f, VLC, 0.0, vlcrc(tmp_path), {"type": "match", "expected_qt_slider_colours": black})


def test_is_vlc_recordings_folder(tmp_path: Path) -> None:
    f = "is_vlc_recordings_folder"
    rule = {"recording_file_path": "/home/user/Desktop"}
    both(f, VLC, 1.0, vlcrc(tmp_path, input_record_path="/home/user/Desktop"), rule)
    both(f, VLC, 0.0, vlcrc(tmp_path, input_record_path="/home/user/Videos"), rule)
    both(f, VLC, 0.0, vlcrc(tmp_path, input_record_path="/home/user/Desktop/"), rule)
    both(f, VLC, 0.0, vlcrc(tmp_path), rule)


def test_is_vlc_fullscreen() -> None:
    f = "is_vlc_fullscreen"
    screen = {"width": 1920, "height": 1080}
    both(f, VLC, 1.0, screen, {"width": 1920, "height": 1080})
    both(f, VLC, 0.0, screen, {"width": 1280, "height": 720})
    both(f, VLC, 0.0, screen, {"width": 1920, "height": 1053})  # maximised, not fullscreen
    both(f, VLC, 0.0, screen, None)  # no VLC window


def status_xml(tmp_path: Path, state: str = "playing", meta: str = "", stream: str = "") -> str:
    """VLC 3.0.24's /requests/status.xml (captured playing a file), with the given state and infos."""
    meta = (
        meta
        or "<info name='filename'>Rick Astley - Never Gonna Give You Up (Official Music Video).mp4</info>"
    )
    stream = stream or (
        "<info name='Type'>Video</info><info name='Codec'>H264 - MPEG-4 AVC (part 10) (avc1)</info>"
        "<info name='Video resolution'>1280x720</info>"
    )
    text = f"""<?xml version="1.0" encoding="utf-8" standalone="yes" ?>

<root>

<equalizer></equalizer>
<subtitledelay>0</subtitledelay>
<length>212</length>
<random>false</random>
<repeat>false</repeat>
<volume>256</volume>
<currentplid>3</currentplid>
<version>3.0.24 Vetinari</version>
<audiodelay>0</audiodelay>
<position>0.012500530481339</position>
<time>3</time>
<loop>false</loop>
<state>{state}</state>
<seek_sec>10</seek_sec>
<apiversion>3</apiversion>
<fullscreen>0</fullscreen>
<rate>1</rate><information>
    <category name="meta">
    {meta}    </category>
  <category name='Stream 0'>{stream}</category>  </information>
  <stats>
  <demuxreadpackets>0</demuxreadpackets>
<readbytes>104448</readbytes>
  </stats>
</root>
"""
    path = tmp_path / f"status-{len(list(tmp_path.iterdir()))}.xml"
    return write(path, text)


def test_is_vlc_playing(tmp_path: Path) -> None:
    f = "is_vlc_playing"
    name = "Rick Astley - Never Gonna Give You Up (Official Music Video).mp4"
    by_name = {"type": "file_name", "file_name": name}
    both(f, VLC, 1.0, status_xml(tmp_path), by_name)
    both(f, VLC, 0.0, status_xml(tmp_path, state="paused"), by_name)
    both(f, VLC, 0.0, status_xml(tmp_path, state="stopped"), by_name)
    both(f, VLC, 0.0, status_xml(tmp_path, meta="<info name='filename'>other.mp4</info>"), by_name)
    both(
        f,
        VLC,
        1.0,
        status_xml(tmp_path, meta=f"<info name='title'>/home/user/Desktop/{name}</info>"),
        by_name,
    )
    both(f, VLC, 0.0, status_xml(tmp_path, meta="<info name='artist'>Rick Astley</info>"), by_name)
    url = (
        "https://devstreaming-cdn.apple.com/videos/streaming/examples/img_bipbop_adv_example_fmp4/master.m3u8"
    )
    by_url = {"type": "url", "url": url}
    both(f, VLC, 1.0, status_xml(tmp_path, meta="<info name='filename'>master.m3u8</info>"), by_url)  # HLS
    both(f, VLC, 1.0, status_xml(tmp_path, meta=f"<info name='url'>{url}</info>"), by_url)
    other = "https://devstreaming-cdn.apple.com/videos/streaming/examples/other/master.m3u8?x=1"
    both(f, VLC, 0.0, status_xml(tmp_path, meta=f"<info name='url'>{other}</info>"), by_url)
    both(f, VLC, 0.0, status_xml(tmp_path, meta="<info name='filename'>prog_index.m3u8</info>"), by_url)
    both(f, VLC, 0.0, status_xml(tmp_path, state="paused", meta=f"<info name='url'>{url}</info>"), by_url)
    # no meta: VLC shows the stream's codec, which never names the URL
    both(f, VLC, 0.0, status_xml(tmp_path, meta="<info name='artist'>x</info>"), by_url)


# -- deliberate differences --------------------------------------------------------------------------


def _raises(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> type[BaseException] | None:
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - which exception the reference raises is what is checked
        return type(exc)
    return None


def test_deliberate_differences(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absent = str(tmp_path / "absent")
    bad_zip = write(tmp_path / "bad.zip", "not a zip")
    gold_zip = _zip(tmp_path / "gold.zip", {"a.txt": b"a"})
    prefs = _prefs(tmp_path, {"extensions.activeThemeID": "dark", "mail.identity.id1.auto_quote": False})
    regex_on_bool = {"expect": {"mail.identity.id1.auto_quote": {"method": "re", "ref": "false"}}}
    multi_action = _FILTER_HEADER + _filter(
        "discount", [_MOVE, ("Mark read", None)], "AND (subject,contains,discount)"
    )
    gold_mail = write(tmp_path / "gold_mail", _message("March") + _message("April"))
    one_mail = write(tmp_path / "one_mail", _message("March"))
    rows: list[tuple[str, Callable[[], Any], Any, float]] = [
        # (what, the reference's call, what the reference does: an exception type or a score, guirl's score)
        # a spoiled result: the reference raises, guirl scores 0
        (
            "compare_config: missing file",
            lambda: ("compare_config", absent, {"expected": "x"}),
            FileNotFoundError,
            0.0,
        ),
        (
            "is_extension_installed: command failed",
            lambda: ("is_extension_installed", None, {"type": "contain", "expected": "x"}),
            TypeError,
            0.0,
        ),
        (
            "compare_result_files: missing file",
            lambda: ("compare_result_files", absent, gold_zip),
            FileNotFoundError,
            0.0,
        ),
        (
            "compare_zip_files: not a zip",
            lambda: ("compare_zip_files", bad_zip, gold_zip),
            zipfile.BadZipFile,
            0.0,
        ),
        (
            "check_thunderbird_prefs: missing file",
            lambda: ("check_thunderbird_prefs", absent, regex_on_bool),
            FileNotFoundError,
            0.0,
        ),
        # a regex rule against a boolean pref: the reference raises, guirl counts it as no match
        (
            "check_thunderbird_prefs: re on a bool",
            lambda: ("check_thunderbird_prefs", prefs, regex_on_bool),
            TypeError,
            0.0,
        ),
        (
            "check_thunderbird_filter: missing file",
            lambda: ("check_thunderbird_filter", absent, _PROMOTIONS),
            FileNotFoundError,
            0.0,
        ),
        # a filter with two actions: the reference keeps only the last one, guirl matches either
        (
            "check_thunderbird_filter: 2 actions",
            lambda: ("check_thunderbird_filter", write(tmp_path / "m.dat", multi_action), _PROMOTIONS),
            0.0,
            1.0,
        ),
        # the reference splits on "FROM - " and keeps only empty pieces: it compares emptiness alone
        (
            "check_thunderbird_folder: a message missing",
            lambda: ("check_thunderbird_folder", one_mail, gold_mail),
            1.0,
            0.0,
        ),
        (
            "check_thunderbird_folder: another message",
            lambda: ("check_thunderbird_folder", write(tmp_path / "m2", _message("May")), one_mail),
            1.0,
            0.0,
        ),
        (
            "check_thunderbird_folder: missing file",
            lambda: ("check_thunderbird_folder", absent, gold_mail),
            FileNotFoundError,
            0.0,
        ),
        (
            "check_qt_bgcone: no vlcrc",
            lambda: ("check_qt_bgcone", None, {"expected_qt_bgcone": 0}),
            TypeError,
            0.0,
        ),
        (
            "check_qt_max_volume: missing vlcrc",
            lambda: ("check_qt_max_volume", absent, {"expected_qt_max_volume": 200}),
            FileNotFoundError,
            0.0,
        ),
        (
            "is_vlc_recordings_folder: no vlcrc",
            lambda: ("is_vlc_recordings_folder", None, {"recording_file_path": "/"}),
            TypeError,
            0.0,
        ),
        (
            "is_vlc_playing: VLC did not answer",
            lambda: ("is_vlc_playing", None, {"type": "file_name", "file_name": "a"}),
            TypeError,
            0.0,
        ),
        (
            "is_vlc_playing: not XML",
            lambda: (
                "is_vlc_playing",
                write(tmp_path / "s.xml", "Unauthorized"),
                {"type": "file_name", "file_name": "a"},
            ),
            Exception,
            0.0,
        ),
    ]
    modules = {name: m for m in (VSCODE, THUNDERBIRD, VLC) for name in dir(m)}
    for what, call, theirs, ours in rows:
        name, *args = call()
        got = _raises(getattr(modules[name], name), *args)
        if isinstance(theirs, float):
            assert getattr(modules[name], name)(*args) == theirs, what
        else:
            assert got is not None and issubclass(got, theirs), f"{what}: the reference gave {got}"
        assert METRICS[name](*args) == ours, what
    # an unknown slider rule type: the reference returns None (no score); guirl raises (a malformed task)
    assert VLC.check_qt_slider_colours(vlcrc(tmp_path), {"type": "whiteish"}) is None
    with pytest.raises(ValueError):
        METRICS["check_qt_slider_colours"](vlcrc(tmp_path), {"type": "whiteish"})


def test_test_suite_runs_outside_guirl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference imports the task's test suite (and the agent's code it imports) into its own process;
    guirl runs it in a separate interpreter inside a sandbox with a timeout: it cannot see the host's files
    or reach its network, and a suite that hangs scores 0 instead of hanging the evaluator."""
    here = _suite(tmp_path, f"import os\ndef test():\n    return os.getpid() == {os.getpid()}\n")
    assert VSCODE.check_python_file_by_test_suite([], here) == 1.0
    assert METRICS["check_python_file_by_test_suite"]([], here) == 0.0
    secret = tmp_path / "host-secret.txt"
    secret.write_text("secret")
    peek = tmp_path / "peek"
    peek.mkdir()
    reads = _suite(peek, f"def test():\n    return open({str(secret)!r}).read() == 'secret'\n")
    assert VSCODE.check_python_file_by_test_suite([], reads) == 1.0
    assert METRICS["check_python_file_by_test_suite"]([], reads) == 0.0
    # the agent's code shares the sandbox: a pipe or a link where the score goes neither hangs nor feeds
    # the evaluator, it scores 0
    for trap in ("os.mkfifo(out)", "os.symlink('/dev/zero', out)"):
        rigged = tmp_path / f"rigged{len(trap)}"
        rigged.mkdir()
        body = f"import os, sys\ndef test():\n    out = sys.argv[3]\n    {trap}\n    os._exit(0)\n"
        assert METRICS["check_python_file_by_test_suite"]([], _suite(rigged, body)) == 0.0
    hang = tmp_path / "hang"
    hang.mkdir()
    monkeypatch.setattr(settings, "TEST_SUITE_TIMEOUT_S", 1.0)
    assert (
        METRICS["check_python_file_by_test_suite"](
            [], _suite(hang, "def test():\n    while True:\n        pass\n")
        )
        == 0.0
    )


# -- getters, on a real desktop (guirl's local VM: Xvfb, icewm, guirl's VM server) ---------------------

# VLC's HTTP interface as the getter meets it: `/requests/status.xml` behind basic auth with an empty user
# name. VLC itself need not be installed here; this serves a status.xml VLC 3.0.24 wrote, on the VM's own
# loopback (its network namespace is private, so VLC's fixed port is free there).
_FAKE_VLC_HTTP = r"""
import base64, http.server, sys
body = open(sys.argv[1], "rb").read()
auth = "Basic " + base64.b64encode(b":" + sys.argv[2].encode()).decode()
class Interface(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/requests/status.xml" or self.headers.get("Authorization") != auth:
            self.send_response(401 if self.path == "/requests/status.xml" else 404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/xml")
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[3])), Interface).serve_forever()
"""


@dataclass
class Desktop:
    """A local VM and a way to run getters on it from synchronous tests."""

    loop: asyncio.AbstractEventLoop
    client: VMClient
    ctx: TaskContext
    home: Path

    def get(self, config: dict[str, Any]) -> Any:
        return self.loop.run_until_complete(get(config, self.client, self.ctx))

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def until(self, config: dict[str, Any], timeout_s: float = 15.0) -> Any:
        """The getter's first non-None answer (a process started in the VM is getting ready)."""
        deadline = time.monotonic() + timeout_s
        while (value := self.get(config)) is None and time.monotonic() < deadline:
            pass
        return value


@pytest.fixture(scope="module")
def desktop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Desktop]:
    loop = asyncio.new_event_loop()
    tmp = tmp_path_factory.mktemp("desktop")
    provider = LocalProvider(tmp / "vms", width=800, height=600)
    vm = loop.run_until_complete(provider.create("settings"))
    ctx = TaskContext(task_id="settings", cache_dir=tmp / "cache", download_cache=tmp / "downloads")
    ctx.cache_dir.mkdir()
    client = VMClient(provider.address(vm), timeout_s=30)
    try:
        yield Desktop(loop, client, ctx, provider.vms[vm].dir / "home")
    finally:
        loop.run_until_complete(client.close())
        loop.run_until_complete(provider.delete(vm))
        loop.close()


def test_vlc_config_getter(desktop: Desktop) -> None:
    config = desktop.home / ".config" / "vlc"
    (config / "vlcrc").unlink()  # the desktop's own (as OSWorld's image has it): here, VLC never saved one
    assert desktop.get({"type": "vlc_config", "dest": "vlcrc"}) is None
    saved = vlcrc(config, qt_max_volume="200")
    os.replace(saved, config / "vlcrc")
    path = desktop.get({"type": "vlc_config", "dest": "vlcrc"})
    assert Path(path).read_bytes() == (config / "vlcrc").read_bytes()
    both("check_qt_max_volume", VLC, 1.0, path, {"expected_qt_max_volume": 200})


def test_vlc_playing_info_getter(desktop: Desktop, tmp_path: Path) -> None:
    config = {"type": "vlc_playing_info", "dest": "status.xml"}
    assert desktop.get(config) is None  # VLC is not running
    status = Path(status_xml(tmp_path))
    (desktop.home / "status.xml").write_bytes(status.read_bytes())
    port = str(apps_vlc_vscode.VLC_HTTP_PORT)
    desktop.run(
        desktop.client.launch(["python", "-c", _FAKE_VLC_HTTP, "/home/user/status.xml", "password", port])
    )
    path = desktop.until(config)
    assert path is not None and Path(path).read_bytes() == status.read_bytes()
    name = "Rick Astley - Never Gonna Give You Up (Official Music Video).mp4"
    both("is_vlc_playing", VLC, 1.0, path, {"type": "file_name", "file_name": name})


def test_default_video_player_getter(desktop: Desktop) -> None:
    config = {"type": "default_video_player"}
    apps = desktop.home / ".local" / "share" / "applications"
    apps.mkdir(parents=True, exist_ok=True)
    # xdg-mime passes over a default whose program is not installed (VLC may not be here): both entries
    # run a program every system has
    for name in ("vlc", "totem"):
        (apps / f"{name}.desktop").write_text(
            f"[Desktop Entry]\nType=Application\nName={name}\nExec=/usr/bin/true %U\nMimeType=video/mp4;\n"
        )
    defaults = [f"video/{t}=vlc.desktop" for t in ("mp4", "webm", "x-matroska")] + ["video/ogg=totem.desktop"]
    (desktop.home / ".config").mkdir(exist_ok=True)
    (desktop.home / ".config" / "mimeapps.list").write_text(
        "[Default Applications]\n" + "\n".join(defaults) + "\n"
    )
    player = desktop.get(config)
    assert player == "vlc.desktop\n"  # as xdg-mime prints it
    assert METRICS["check_include_exclude"](player, {"include": ["vlc.desktop"]}) == 1.0


def test_vscode_config_getter(desktop: Desktop, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apps_vlc_vscode, "VSCODE_FILE_WAIT_S", 0.2)
    config = {
        "type": "vscode_config",
        "vscode_extension_command": "OpenProject",
        "path": "/home/user/OpenProject.txt",
        "dest": "OpenProject.txt",
    }
    assert desktop.get(config) is None  # the command wrote nothing (no VS Code here)
    (desktop.home / "OpenProject.txt").write_text("project")
    path = desktop.get(config)
    both("compare_config", VSCODE, 1.0, path, {"expected": "project"})


def test_window_size_and_accessibility_getters(desktop: Desktop) -> None:
    config = {"type": "vm_window_size", "app_class_name": "xmessage"}
    assert desktop.get(config) is None  # no such window
    screen = desktop.get({"type": "vm_screen_size"})
    both("is_vlc_fullscreen", VLC, 0.0, screen, None)
    desktop.run(desktop.client.launch(["xmessage", "-geometry", "300x200+10+10", "a window"]))
    window = desktop.until(config)
    assert window == {"width": 300, "height": 200}
    both("is_vlc_fullscreen", VLC, 0.0, screen, window)
    both("is_vlc_fullscreen", VLC, 1.0, screen, {"width": screen["width"], "height": screen["height"]})
    # the accessibility tree, read through AT-SPI with Mousepad open on a known file: its text area holds the
    # file's text and its menu bar a File menu; OSWorld's metric and guirl's read them alike
    (desktop.home / "notes.txt").write_text("remember the milk")
    desktop.run(desktop.client.launch(["mousepad", "/home/user/notes.txt"]))
    text_area = 'application[name="mousepad"] frame[name*="notes.txt"] text[st|editable="true"]'
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        tree = desktop.get({"type": "accessibility_tree"})
        if "remember the milk" in tree:
            break
    assert tree.startswith("<desktop-frame ")
    found = [{"selectors": [text_area], "text": "remember the milk", "exact": True}]
    both("check_accessibility_tree", GENERAL, 1.0, tree, found)
    menu = {"selectors": ['menu-bar > menu[name="File"][cp|screencoord]']}  # on screen: its place given
    both("check_accessibility_tree", GENERAL, 1.0, tree, [menu])
    absent = [{"selectors": [text_area], "text": "forget the milk", "exact": True}]
    both("check_accessibility_tree", GENERAL, 0.0, tree, absent)
    both("check_accessibility_tree", GENERAL, 0.0, tree, [{"selectors": ['application[name="gedit"]']}])
