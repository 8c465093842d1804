"""The declared applications of a local desktop: which a task needs (read from its setup commands and the
files it opens, whatever shape the command takes), and the Debian packages the project's set-up installs
for them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guirl.vmpool.apps import APPS, needed_apps
from guirl.vmpool.tasks.model import parse_task

ROOT = Path(__file__).resolve().parents[2]


def _needs(*steps: dict) -> set[str]:
    task = {"id": "t", "instruction": "i", "config": list(steps), "evaluator": {"func": "infeasible"}}
    return {a.name for a in needed_apps(parse_task(json.dumps(task), "t"))}


def _run(command) -> dict:
    return {"type": "launch", "parameters": {"command": command}}


@pytest.mark.parametrize(
    "command, apps",
    [
        (["google-chrome", "--remote-debugging-port=1337"], {"chrome"}),
        (["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"], {"socat"}),
        ("VLC_VERBOSE=-1 vlc --no-audio /home/user/a.mp4", {"vlc"}),
        (["/usr/bin/thunderbird"], {"thunderbird"}),
        (["bash", "-c", "cd /tmp && nohup gimp x.png & sleep 1"], {"gimp"}),
        ("libreoffice --calc /home/user/a.xlsx", {"libreoffice_calc"}),
        (["libreoffice", "--impress"], {"libreoffice_impress"}),
        (["soffice", "/home/user/report.docx"], {"libreoffice_writer"}),
        ("pkill chrome; google-chrome --remote-debugging-port=1337 | cat", {"chrome"}),
        (["code", "/home/user/project"], {"vs_code"}),
        # a program's name inside an argument is not the program run
        (["python", "-c", "code = 1; print('vlc gimp')"], set()),
        ("echo 'thunderbird' > /tmp/x", set()),
        # malformed commands: read as far as they go, never an exception
        ("vlc 'unbalanced", {"vlc"}),
        ([], set()),
        ("", set()),
        (["bash", "-c"], set()),
    ],
)
def test_the_applications_a_task_starts_are_read_from_its_commands(command, apps) -> None:
    assert _needs(_run(command)) == apps


def test_an_open_step_needs_the_application_of_its_file() -> None:
    assert _needs({"type": "open", "parameters": {"path": "/home/user/Deck.PPTX"}}) == {"libreoffice_impress"}
    assert _needs({"type": "open", "parameters": {"path": "/home/user/notes"}}) == set()


def test_every_offered_application_is_installed_by_the_projects_set_up() -> None:
    listed = set()
    for line in (ROOT / "scripts" / "system-packages.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            package, check = line.split()
            listed.add((package, check))
    for app in APPS:
        if not app.why_not:
            assert (app.package, app.check) in listed, app
    assert len({a.name for a in APPS}) == len(APPS)
