"""The applications a local desktop offers: one declared list.

A local desktop runs the host's own programs (its sandbox binds the host's /usr), so an application is on
it when its Debian package is installed here; `scripts/system-packages.txt` installs every one of `APPS`
(a unit test holds the two lists together). `needed_apps(task)` reads which applications a task runs, from
the commands of its setup steps and the files it opens, so `guirl tasks check` can say which tasks a
local desktop can run, and why not the others.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from guirl.vmpool.server.atspi import ATSPI_PARTS
from guirl.vmpool.tasks.model import Task

DESKTOP_PATH = "/usr/local/bin:/usr/bin:/bin"
"""Where a local desktop finds programs (besides guirl's own Python)."""


@dataclass(frozen=True)
class App:
    name: str
    """The name tasks and reports use (OSWorld's domain where there is one)."""
    package: str
    """The Debian package that provides it ("" when Debian has none)."""
    check: str
    """A command on the PATH once it is installed."""
    commands: tuple[str, ...]
    """The programs OSWorld's tasks start it by."""
    extensions: tuple[str, ...] = ()
    """The files an `open` step opens with it."""
    why_not: str = ""
    """For an application a local desktop never offers: why."""

    def installed(self) -> bool:
        """On the desktop's PATH (the sandbox binds /usr only: not /snap, /opt or the user's own bins); a
        `py:MODULE` check: importable by guirl's own Python, which local desktops run."""
        if self.why_not:
            return False
        if self.check.startswith("py:"):
            return importlib.util.find_spec(self.check[3:]) is not None
        return shutil.which(self.check, path=DESKTOP_PATH) is not None


APPS: tuple[App, ...] = (
    App("terminal", "xterm", "xterm", ("xterm",)),
    App("gnome_terminal", "gnome-terminal", "gnome-terminal", ("gnome-terminal",)),
    App("text_editor", "mousepad", "mousepad", ("mousepad",), (".txt",)),
    App(
        "libreoffice_calc",
        "libreoffice-calc",
        "localc",
        ("localc", "scalc"),
        (".xlsx", ".xls", ".ods", ".csv"),
    ),
    App(
        "libreoffice_writer",
        "libreoffice-writer",
        "lowriter",
        ("lowriter", "swriter"),
        (".docx", ".doc", ".odt"),
    ),
    App(
        "libreoffice_impress",
        "libreoffice-impress",
        "loimpress",
        ("loimpress", "simpress"),
        (".pptx", ".odp"),
    ),
    App("gimp", "gimp", "gimp", ("gimp",), (".xcf",)),
    App("vlc", "vlc", "vlc", ("vlc", "cvlc"), (".mp4", ".mp3", ".wav", ".webm", ".mkv", ".ogg")),
    App("thunderbird", "thunderbird", "thunderbird", ("thunderbird",)),
    # OSWorld's tasks start `google-chrome`; a local desktop runs Debian's Chromium under that name, and
    # socat exposes its DevTools port the way OSWorld's tasks do
    App("chrome", "chromium", "chromium", ("google-chrome", "chromium", "chromium-browser")),
    App("socat", "socat", "socat", ("socat",)),
    # guirl's own targets app (`guirl tasks generate`), started as `python -m guirl.vmpool.targets`: Tk
    App("targets", "python3-tk", "py:_tkinter", ("guirl.vmpool.targets",)),
    App(
        "vs_code",
        "",
        "code",
        ("code",),
        why_not="Visual Studio Code is not packaged by Debian (install Microsoft's .deb to offer it)",
    ),
    App(
        "files",
        "",
        "nautilus",
        ("nautilus",),
        why_not="GNOME Files (nautilus) needs a GNOME session; local desktops run IceWM",
    ),
)
"""Every application of OSWorld's tasks a local desktop is checked for."""

LIBREOFFICE_FLAGS = {
    "--calc": "libreoffice_calc",
    "--writer": "libreoffice_writer",
    "--impress": "libreoffice_impress",
}
"""`libreoffice --calc` and its kin start one component."""

_BY_COMMAND = {c: app for app in APPS for c in app.commands}
_BY_EXTENSION = {e: app for app in APPS for e in app.extensions}
_BY_NAME = {app.name: app for app in APPS}


SHELLS = {"sh", "bash", "dash", "zsh"}
WRAPPERS = {"sudo", "nohup", "exec", "env", "setsid", "stdbuf"}
_SEPARATORS = {";", "&&", "||", "|", "&", "(", ")"}


def _programs(command: Any) -> list[list[str]]:
    """The simple commands a step's `command` runs, each as its words from the program on: a list is one
    (or, for `bash -c SCRIPT`, the script's); a string is a shell line (`a; b && c | d`). Leading variable
    assignments and wrappers (`VLC_VERBOSE=-1 vlc`, `nohup gimp`) are dropped."""
    if isinstance(command, list) and all(isinstance(c, str) for c in command) and command:
        if os.path.basename(command[0]) in SHELLS and "-c" in command[1:-1]:
            return _programs(command[command.index("-c") + 1])
        return [_strip(list(command))] if len(command) > 1 or " " not in command[0] else _programs(command[0])
    if not isinstance(command, str):
        return []
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote: the words as they stand
        tokens = command.split()
    out, current = [], []
    for token in [*tokens, ";"]:
        if token in _SEPARATORS:
            if current:
                out.append(_strip(current))
            current = []
        else:
            current.append(token)
    return [c for c in out if c]


def _strip(words: list[str]) -> list[str]:
    while words and (
        "=" in words[0] and not words[0].startswith("=") or os.path.basename(words[0]) in WRAPPERS
    ):
        words = words[1:]
    if words and os.path.basename(words[0]) in SHELLS and "-c" in words[1:-1]:
        inner = _programs(words[words.index("-c") + 1])
        return inner[0] if len(inner) == 1 else words
    return words


def _apps_of(words: list[str]) -> set[App]:
    if not words:
        return set()
    name = os.path.basename(words[0])
    if name.startswith("python") and "-m" in words[1:-1]:  # a module run by the desktop's Python
        name = words[words.index("-m") + 1]
    if name in _BY_COMMAND:
        return {_BY_COMMAND[name]}
    if name in ("libreoffice", "soffice"):
        rest = words[1:]
        parts = {LIBREOFFICE_FLAGS[w] for w in rest if w in LIBREOFFICE_FLAGS}
        parts |= {
            app.name
            for w in rest
            if (app := _BY_EXTENSION.get(PurePosixPath(w).suffix.lower()))
            and app.name.startswith("libreoffice_")
        }
        return {_BY_NAME[p] for p in parts} or {_BY_NAME["libreoffice_writer"]}
    return set()


def needed_apps(task: Task) -> set[App]:
    """The applications `task` starts: programs named in the commands of its setup steps (at any place of
    the command: `bash -c "vlc ..."`, `VLC_VERBOSE=-1 vlc`) and the files its `open` steps open."""
    found: set[App] = set()
    for step in [*task.config, *task.evaluator.postconfig]:
        params = step.parameters
        if step.type in ("launch", "execute", "command"):
            for words in _programs(params.get("command")):
                found |= _apps_of(words)
        elif step.type == "open":
            suffix = PurePosixPath(str(params.get("path", ""))).suffix.lower()
            if suffix in _BY_EXTENSION:
                found.add(_BY_EXTENSION[suffix])
    return found


def atspi_missing() -> list[str]:
    """The Debian packages a local desktop's accessibility tree lacks here (empty: it has one)."""
    return [
        pkg
        for what, pkg in ATSPI_PARTS
        if not (os.path.exists(what) if what.startswith("/") else shutil.which(what, path=DESKTOP_PATH))
    ]
