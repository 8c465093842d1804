"""Loading OSWorld task files: all of OSWorld's parse; a bad file gets an error naming the file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guirl.vmpool.tasks.model import TaskError, load_task, parse_task, substitute
from tests.helpers import osworld_dir

OSWORLD_DIR = osworld_dir()
OSWORLD = (OSWORLD_DIR or Path("../shared/osworld")) / "examples"

GOOD = {
    "id": "t1",
    "instruction": "do it",
    "config": [{"type": "execute", "parameters": {"command": ["echo", "{SCREEN_WIDTH_HALF}"]}}],
    "evaluator": {
        "func": "exact_match",
        "result": {"type": "rule", "rules": 1},
        "expected": {"type": "rule"},
    },
}


def test_every_osworld_task_file_loads():
    files = sorted(OSWORLD.glob("*/*.json"))
    assert len(files) >= 369, f"expected OSWorld's task files under {OSWORLD}"
    for f in files:
        load_task(f)


def test_guirl_supports_every_task_of_osworlds_linux_suite():
    """`guirl tasks check` on OSWorld's meta lists: every setup type, getter and metric of all 369 tasks
    (and so of the 222 of test_nochrome.json) is implemented, with what it imports installed here."""
    from guirl.vmpool.tasks.check import check

    assert OSWORLD_DIR is not None, "OSWorld's files are not beside this checkout (set GUIRL_OSWORLD_DIR)"
    for meta, total in (("test_all.json", 369), ("test_nochrome.json", 222)):
        report = check([OSWORLD_DIR / meta])
        assert report.errors == []
        missing = {d: dict(r.missing) for d, r in report.domains.items() if r.missing}
        assert missing == {}
        assert sum(r.total for r in report.domains.values()) == total
        assert sum(r.supported for r in report.domains.values()) == total
    # on a local desktop (this machine has every application of guirl's list): all but the tasks that
    # need the internet in the VM, VS Code, GNOME Files or GNOME's wallpaper setting
    report = check([OSWORLD_DIR / "test_all.json"])
    local = {d: r.local for d, r in report.domains.items()}
    assert local["libreoffice_calc"] == 47 and local["gimp"] == 26 and local["vs_code"] == 0
    assert sum(local.values()) == 268, local
    reasons = {k for r in report.domains.values() for k in r.local_missing}
    assert reasons == {"network", "app:vs_code", "app:files", "GNOME wallpaper"}


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda t: t.pop("instruction"), "instruction"),
        (lambda t: t["config"][0].pop("type"), "config[0]"),
        (lambda t: t["config"].__setitem__(0, {"type": 5}), "config[0].type"),
        (lambda t: t["evaluator"].__setitem__("conj", "xor"), "evaluator.conj"),
        (lambda t: t["config"][0]["parameters"].__setitem__("command", ["echo", "{NO_SUCH}"]), "{NO_SUCH}"),
        (lambda t: t["config"][0]["parameters"].__setitem__("command", []), "config[0].parameters.command"),
        (lambda t: t["evaluator"].__setitem__("func", ["a", "b"]), "evaluator.result"),
        (lambda t: t["evaluator"].pop("result"), "evaluator.result"),
    ],
)
def test_bad_task_files_name_the_file_and_the_field(tmp_path, mutate, field):
    task = json.loads(json.dumps(GOOD))
    mutate(task)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(task))
    with pytest.raises(TaskError) as err:
        load_task(path)
    assert str(path) in str(err.value) and field in str(err.value)


def test_not_json_and_missing_file(tmp_path):
    with pytest.raises(TaskError, match="not valid JSON"):
        parse_task(b"{nope", "x.json")
    with pytest.raises(TaskError, match="cannot read"):
        load_task(tmp_path / "missing.json")


def test_placeholders_are_substituted_in_osworld_order():
    got = substitute(
        ["{SCREEN_WIDTH_HALF}x{SCREEN_HEIGHT}", "{CLIENT_PASSWORD}"], password="pw", width=1920, height=1080
    )
    assert got == ["960x1080", "pw"]
    assert substitute("sudo -S {CLIENT_PASSWORD}", password="p", width=1, height=1) == "sudo -S p"


@pytest.mark.parametrize(
    "dest", ["/etc/passwd", "../../outside.txt", "a/../../b", "~/x", "", 3, ["ok.txt", "/abs"]]
)
def test_a_getters_dest_outside_the_tasks_cache_is_refused(dest):
    """Getters write `dest` under the task's cache directory; a task file cannot make them write elsewhere."""
    task = {
        "id": "t",
        "instruction": "x",
        "config": [],
        "evaluator": {"func": "exact_match", "result": {"type": "vm_file", "path": "/x", "dest": dest}},
    }
    with pytest.raises(TaskError, match=r"evaluator\.result\.dest .* must be a relative file name"):
        parse_task(json.dumps(task))
    task["evaluator"]["result"]["dest"] = "sub/ok.txt"
    assert parse_task(json.dumps(task)).id == "t"
