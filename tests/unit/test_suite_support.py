"""Checking a suite before a run: tasks guirl cannot set up or score, or that need a setting the run does
not provide, are refused by name (or, when asked, skipped and listed) before any VM starts."""

from __future__ import annotations

import pytest

from guirl.vmpool.tasks.check import available_settings
from guirl.vmpool.tasks.suite import SkippedTask, SuiteError, SuiteTask, check_supported

PLAIN = {
    "id": "plain",
    "instruction": "x",
    "config": [{"type": "execute", "parameters": {"command": "true"}}],
    "evaluator": {
        "func": "exact_match",
        "result": {"type": "rule", "rules": 1},
        "expected": {"type": "rule"},
    },
}
CHROME = {
    **PLAIN,
    "id": "tabs",
    "config": [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://example.org"]}}],
}
DRIVE = {
    **PLAIN,
    "id": "drive",
    "config": [
        {"type": "googledrive", "parameters": {"settings_file": "x", "operation": ["delete"], "args": [{}]}}
    ],
}
A11Y = {
    **PLAIN,
    "id": "a11y",
    "evaluator": {
        "func": "check_accessibility_tree",
        "result": {"type": "accessibility_tree"},
        "options": {},
    },
}
UNKNOWN = {**PLAIN, "id": "unknown", "evaluator": {"func": "no_such_metric", "result": {"type": "rule"}}}


def _tasks(*raw: dict) -> list[SuiteTask]:
    return [SuiteTask(t["id"], "d", t) for t in raw]


def test_an_unsupported_task_is_refused_by_name_or_skipped_when_asked() -> None:
    tasks = _tasks(PLAIN, UNKNOWN)
    with pytest.raises(
        SuiteError, match=r"1 of 2 tasks need .*\n  d/unknown: metric:no_such_metric\n.*--skip"
    ):
        check_supported(tasks, skip_unsupported=False)
    runnable, skipped = check_supported(tasks, skip_unsupported=True)
    assert [t.task_id for t in runnable] == ["plain"]
    assert skipped == [SkippedTask("unknown", "d", ["metric:no_such_metric"])]
    with pytest.raises(SuiteError, match="none of its 1 tasks is supported"):
        check_supported(_tasks(UNKNOWN), skip_unsupported=True)


def test_tasks_needing_a_setting_the_run_lacks_name_the_setting() -> None:
    tasks = _tasks(PLAIN, CHROME, DRIVE)
    none = available_settings(devtools=False, drive=False, account=False)
    runnable, skipped = check_supported(tasks, skip_unsupported=True, available=none)
    assert [t.task_id for t in runnable] == ["plain"]
    reasons = {s.task_id: s.missing for s in skipped}
    assert reasons["tabs"] == [
        "setup:chrome_open_tabs (needs env.chromium_port: the port of Chrome's DevTools on the VM (0 turns "
        "them off))"
    ]
    assert reasons["drive"] == ["setup:googledrive (needs env.google_drive_settings: PyDrive's settings.yml)"]
    # local desktops: no network (a page from the internet, Google Drive), an accessibility tree only with
    # Debian's AT-SPI packages
    local = available_settings(devtools=True, drive=True, account=True, atspi=False, local=True)
    _, skipped = check_supported(_tasks(PLAIN, A11Y, CHROME, DRIVE), skip_unsupported=True, available=local)
    assert {s.task_id: s.missing for s in skipped} == {
        "a11y": [
            "getter:accessibility_tree (needs the desktop's accessibility tree (AT-SPI): on a local desktop, "
            "Debian's dbus-daemon, dbus-bin, at-spi2-core, python3-pyatspi)"
        ],
        "tabs": [
            "network (needs the VM's network (the task's browser or commands fetch from the internet): local "
            "desktops have none)"
        ],
        "drive": [
            "setup:googledrive (needs the VM's network (the task's browser or commands fetch from the "
            "internet): local desktops have none)"
        ],
    }
    with_tree = available_settings(devtools=True, drive=True, account=True, atspi=True, local=True)
    runnable, _ = check_supported(_tasks(PLAIN, A11Y, CHROME), skip_unsupported=True, available=with_tree)
    assert [t.task_id for t in runnable] == ["plain", "a11y"]
    every = available_settings(devtools=True, drive=True, account=True)
    runnable, skipped = check_supported(tasks, skip_unsupported=False, available=every)
    assert len(runnable) == 3 and skipped == []
    # not checked at all (`guirl tasks check`: what guirl implements, whatever a run provides)
    assert len(check_supported(tasks, skip_unsupported=False)[0]) == 3
