"""Applications' settings: VS Code, Thunderbird, VLC (OSWorld's metrics/vscode.py, thunderbird.py, vlc.py).

This module holds VS Code's metrics (and the files a VS Code task produces: a zip, a result file, a test
suite); Thunderbird's are in settings_thunderbird.py and VLC's in settings_vlc.py, merged into `METRICS`
here. Scores match desktop-env 1.0.2's on every input tests/integration/test_parity_settings.py feeds
both; where the reference crashes on a spoiled result (a missing or unparsable file) guirl scores 0.0.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

from guirl.vmpool.tasks.metrics import settings_thunderbird, settings_vlc

REQUIRES = ("pypdf", "pygame")
REQUIRES_PROGRAMS = {"bwrap": "bubblewrap"}
"""Programs run on the evaluating host (the test-suite metric's sandbox), and their Debian packages."""
"""Modules beyond guirl's own dependencies that this module's functions import (the `osworld` extra)."""

TEST_SUITE_TIMEOUT_S = 120.0
"""How long `check_python_file_by_test_suite` lets a task's test suite run before scoring it 0."""


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _load_json(path: str, skip_first_line: bool = False) -> Any:
    text = _read_text(path)
    if text is None:
        return None
    if skip_first_line:
        text = text.partition("\n")[2]
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def check_json_keybindings(result: str | None, expected: Mapping[str, Any], **options: Any) -> float:
    """1.0 when VS Code's keybindings.json (a JSON list, maybe after one comment line) holds the expected
    binding (`expected["expected"]`, a `{key, command, when}` dict) as one of its entries."""
    if not result:
        return 0.0
    # VS Code writes a `// Place your key bindings in this file ...` line above the list; like the
    # reference, try the file as it is, then without its first line.
    for skip in (False, True):
        data = _load_json(result, skip_first_line=skip)
        if type(data) is list:
            return float(expected["expected"] in data)
    return 0.0


def check_json_settings(result: str | None, expected: Mapping[str, Any], **options: Any) -> float:
    """1.0 when the JSON settings file has every key of `expected["expected"]` with an equal value."""
    if not result:
        return 0.0
    data = _load_json(result)
    if not isinstance(data, dict):  # unparsable (the reference scores 0) or no object (it may raise)
        return 0.0
    return float(all(key in data and data[key] == value for key, value in expected["expected"].items()))


def compare_config(result: str | None, rules: Mapping[str, Any], **options: Any) -> float:
    """1.0 when the file's whole text equals `rules["expected"]`."""
    if not result:
        return 0.0
    text = _read_text(result)
    return float(text is not None and text == rules["expected"])


def is_extension_installed(result: str | None, rules: Mapping[str, Any], **options: Any) -> float:
    """Whether a command's output (e.g. `code --list-extensions | grep X`) contains `rules["expected"]`
    (`type: contain`) or does not (`type: not_contain`)."""
    kind = rules["type"]
    if kind not in ("contain", "not_contain"):
        raise ValueError(f"is_extension_installed: unknown type {kind!r} (expected contain/not_contain)")
    if not isinstance(result, str):  # the command did not run (the reference raises)
        return 0.0
    return float((rules["expected"] in result) == (kind == "contain"))


def compare_result_files(result: str | None, expected: str | None) -> float:
    """1.0 when the result file's text equals the gold file's (both stripped); when the gold is a number,
    also when the result contains the gold's text or is a number within 1e-4 of it."""
    if not result or not expected:
        return 0.0
    got, want = _read_text(result), _read_text(expected)
    if got is None or want is None:
        return 0.0
    got, want = got.strip(), want.strip()
    try:
        gold = float(want)
        if want in got:  # "The answer is 42" passes for 42
            return 1.0
        return float(abs(float(got) - gold) < 1e-4)
    except ValueError:
        return float(got == want)


def _pdf_text(data: bytes) -> str:
    from pypdf import PdfReader  # the `osworld` extra

    return "".join(page.extract_text() for page in PdfReader(io.BytesIO(data)).pages)


def compare_zip_files(result: str | None, expected: str, **options: Any) -> float:
    """1.0 when both archives hold the same member names and each member is byte-identical, except PDFs,
    whose extracted texts need a similarity ratio of at least 0.95."""
    if not result:
        return 0.0
    from pypdf.errors import PyPdfError  # the `osworld` extra

    try:
        with zipfile.ZipFile(result) as got, zipfile.ZipFile(expected) as want:
            names = set(got.namelist())
            if names != set(want.namelist()):
                return 0.0
            for name in names:
                a, b = got.read(name), want.read(name)
                if name.lower().endswith(".pdf"):
                    if SequenceMatcher(None, _pdf_text(a), _pdf_text(b)).ratio() < 0.95:
                        return 0.0
                elif a != b:
                    return 0.0
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError, PyPdfError):
        return 0.0  # a missing, corrupt or encrypted archive, or a corrupt PDF in it; the reference raises
    return 1.0


# Runs in a fresh interpreter: loads the test suite from its directory (where the getters put the files it
# imports), calls its test function and writes the reference's score for its return value to argv[3].
_RUNNER = """
import importlib.util, json, os, sys

path, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
score = 0.0
try:
    os.chdir(os.path.dirname(path))
    sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location("osworld_test_suite", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    test = getattr(module, name, None)
    if callable(test):
        value = test()
        if isinstance(value, bool):
            score = float(value)
        elif isinstance(value, (int, float)):
            score = max(0.0, min(1.0, float(value)))
        else:
            score = float(bool(value))
except BaseException:
    score = 0.0
with open(out, "w") as f:
    json.dump(score, f)
"""


def check_python_file_by_test_suite(result: Any, test_file: str | None, **options: Any) -> float:
    """The score the task's test suite gives the files the agent wrote: its `test_function_name` (default
    `test`) is called with the suite's directory as working directory and on `sys.path`; True is 1.0, a
    number is clamped to [0, 1], anything else counts by truthiness; an error or a timeout is 0.0.

    The suite imports and runs code the agent wrote on the VM, so guirl never runs it in its own process,
    nor with the host's files or network: it runs in a fresh Python interpreter inside a bubblewrap sandbox
    (guirl's local-VM sandbox: read-only system and Python directories, a private home holding a copy of
    the suite's directory, no network, dying with guirl), with a timeout; only the score comes back. The
    agent's code and the suite share that interpreter, as in OSWorld, so the suite trusts what it imports.
    The suites of OSWorld's tasks import pygame: SDL is pointed at its dummy video and audio drivers.
    `result` (the fetched files) is unused, as in the reference: the getters put them next to the suite.
    """
    from guirl.vmpool.sandbox import HOME, SandboxError, bwrap_argv

    name = options.get("test_function_name", "test")
    if not test_file or not os.path.isfile(test_file):
        return 0.0
    path = os.path.realpath(test_file)
    with tempfile.TemporaryDirectory(prefix="guirl-test-suite-") as tmp:
        home = os.path.join(tmp, "home")
        shutil.copytree(os.path.dirname(path), home, symlinks=True)
        out = f"{HOME}/.guirl-score.json"
        argv = bwrap_argv(
            Path(tmp),
            [sys.executable, "-c", _RUNNER, f"{HOME}/{os.path.basename(path)}", str(name), out],
            env={"SDL_VIDEODRIVER": "dummy", "SDL_AUDIODRIVER": "dummy", "PYTHONDONTWRITEBYTECODE": "1"},
        )
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=TEST_SUITE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return 0.0
        score = _read_score(os.path.join(home, ".guirl-score.json"))
        if score is None and done.returncode != 0 and done.stderr.startswith(b"bwrap:"):
            # the sandbox itself could not start (no user namespaces here): the host's fault, not a score
            raise SandboxError(
                f"the test suite's sandbox did not start: {done.stderr[:300].decode(errors='replace')}"
            )
        return 0.0 if score is None else score


def _read_score(path: str) -> float | None:
    """The score the runner wrote, read as the untrusted file it is (the agent's code shares the sandbox):
    a regular file only, not followed through a link, not waited on as a pipe, at most 64 bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # killed before writing (os._exit, a crash), or not a plain file
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        score = float(json.loads(os.read(fd, 64)))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return min(1.0, max(0.0, score)) if math.isfinite(score) else None


METRICS: dict[str, Callable[..., float]] = {
    "check_json_keybindings": check_json_keybindings,
    "check_json_settings": check_json_settings,
    "compare_config": compare_config,
    "is_extension_installed": is_extension_installed,
    "compare_result_files": compare_result_files,
    "compare_zip_files": compare_zip_files,
    "check_python_file_by_test_suite": check_python_file_by_test_suite,
}
"""This family's metrics, by OSWorld's names."""
for _module in (settings_thunderbird, settings_vlc):
    _clash = METRICS.keys() & _module.METRICS.keys()
    assert not _clash, f"metrics defined twice: {sorted(_clash)}"
    METRICS.update(_module.METRICS)
