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
            packages, check = line.split()
            listed |= {(package, check) for package in packages.split("|")}
    for app in APPS:
        if not app.why_not:
            assert (app.package, app.check) in listed, app
    assert len({a.name for a in APPS}) == len(APPS)


def test_tasks_check_says_which_tasks_a_local_desktop_runs_and_why_not_the_others(tmp_path) -> None:
    from guirl.vmpool.tasks.check import check, render

    def write(domain: str, task_id: str, config: list[dict]) -> None:
        task = {"id": task_id, "instruction": "i", "config": config, "evaluator": {"func": "infeasible"}}
        (tmp_path / domain).mkdir(exist_ok=True)
        (tmp_path / domain / f"{task_id}.json").write_text(json.dumps(task))

    write("code", "edit", [_run(["code", "/home/user/x"])])
    write("code", "shell", [_run("echo hi")])
    web = {"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://example.org"]}}
    write("web", "page", [_run(["google-chrome", "--remote-debugging-port=1337"]), web])
    local = {"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["file:///home/user/a.html"]}}
    write("web", "file", [_run(["google-chrome", "--remote-debugging-port=1337"]), local])
    report = check([tmp_path])
    assert (report.domains["code"].local, report.domains["web"].local) == (1, 1)
    assert dict(report.domains["code"].local_missing) == {"app:vs_code": 1}
    assert dict(report.domains["web"].local_missing) == {"network": 1}
    text = render(report)
    assert "local" in text.splitlines()[0]
    assert "app:vs_code: Visual Studio Code is not packaged by Debian" in text
    assert "network: the VM's network" in text
