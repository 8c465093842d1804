"""A non-editable install outside the checkout: the wheel built from the checkout holds every file of the
`guirl` package, and from a fresh virtual environment holding only that wheel `guirl eval` (scripted backend,
the shipped local suite, real local desktops) and the SGLang stand-in's launcher run.

The fresh environment finds guirl's dependencies in the project's environment through one `.pth` line naming
that environment's site-packages. A plain path line: Python does not process the `.pth` files of a directory
added that way, so the editable install's finder (which maps `guirl` to the checkout) stays out, while torch,
pyzmq and the rest are importable without downloading anything. Everything runs with its working directory
outside the checkout and without PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from guirl.config.schema import ENV_VARS

ROOT = Path(__file__).resolve().parents[2]
BUILD_INPUTS = ("pyproject.toml", "setup.cfg", "setup.py", "MANIFEST.in", "README.md")
"""What setuptools reads besides the package itself (those that exist are copied)."""
# fast heartbeats, but 5 s of silence before a peer is declared dead: none of these runs is about liveness,
# and a loaded machine (the other test worker's chaos run) can starve a process of CPU for a second
FAST = [
    *("--set", "runtime.heartbeat_interval_s=0.25", "--set", "runtime.heartbeat_liveness=20"),
    *("--set", "logging.level=WARNING"),
]

PROBE = r"""
import importlib.metadata as md, json, os, sys
from packaging.requirements import Requirement
import guirl.runtime.supervisor, guirl.cli, guirl.inference.scripted, guirl.testing.fakes
import guirl.vmpool.session

dist = md.distribution("guirl")
unmet = []
for line in dist.requires or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # an extra's requirement
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        unmet.append(f"{line} (not installed)")
        continue
    if not req.specifier.contains(version, prereleases=True):
        unmet.append(f"{line} (installed: {version})")
mods = {n: m for n, m in sys.modules.items() if n == "guirl" or n.startswith("guirl.")}
print(json.dumps({
    "dist_root": os.path.realpath(dist.locate_file("")),
    "files": sorted(os.path.realpath(m.__file__) for m in mods.values() if getattr(m, "__file__", None)),
    "namespace_packages": sorted(n for n, m in mods.items() if getattr(m, "__file__", None) is None),
    "sys_path": [os.path.realpath(p or ".") for p in sys.path],
    "unmet": unmet,
}))
"""


def _env() -> dict[str, str]:
    """This environment without anything that points Python at the checkout (PYTHONPATH, an active venv)
    or configures guirl (OpenClaw-RL's GUI-RL variables)."""
    drop = {*ENV_VARS, "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PYTHONUSERBASE"}
    return {k: v for k, v in os.environ.items() if k not in drop} | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _run(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=cwd)


def _ok(out: subprocess.CompletedProcess, what: str) -> None:
    tail = f"{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    assert out.returncode == 0, f"{what} failed (exit status {out.returncode}):\n{tail}"


@pytest.fixture(scope="module")
def install(tmp_path_factory) -> dict[str, Path]:
    """The wheel built from the checkout, installed (alone, no dependencies) in a fresh venv outside it."""
    base = tmp_path_factory.mktemp("wheel")
    assert not base.resolve().is_relative_to(ROOT), "the test's directories must lie outside the checkout"
    # built from a copy: setuptools writes build/ and *.egg-info into the tree it builds, and a stale
    # build/lib in the checkout would put modules deleted since into the wheel
    src = base / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "guirl", src / "guirl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = base / "dist"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    _ok(_run([*build, "-w", str(dist), "."], cwd=src), "building the wheel")
    (wheel,) = dist.glob("guirl-*.whl")

    venv = base / "fresh"
    _ok(_run([sys.executable, "-m", "venv", str(venv)], cwd=base), "creating the venv")
    python = venv / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=base)
    _ok(site, "asking the venv for its site-packages")
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    Path(site.stdout.strip(), "guirl-test-dependencies.pth").write_text("".join(f"{p}\n" for p in ours))
    pip = [str(python), "-m", "pip", "install", "--no-deps", "--no-index"]
    _ok(_run([*pip, str(wheel)], cwd=base), "installing the wheel")
    work = base / "work"
    work.mkdir()
    return {"wheel": wheel, "venv": venv, "python": python, "work": work}


def test_the_wheel_holds_every_file_of_the_package(install):
    in_checkout = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "guirl").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    with zipfile.ZipFile(install["wheel"]) as whl:
        in_wheel = {n for n in whl.namelist() if n.startswith("guirl/")}
    missing = sorted(in_checkout - in_wheel)
    no_init = sorted(
        d.relative_to(ROOT).as_posix()
        for d in (ROOT / "guirl").rglob("*")
        if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")) and not (d / "__init__.py").exists()
    )
    assert not missing, (
        f"the wheel lacks {len(missing)} file(s) of the package, so a non-editable install cannot run them: "
        f"{missing[:20]}; package directories without __init__.py (left out by `packages = find:`): "
        f"{no_init}; a data file needs package_data in setup.cfg"
    )


def test_the_installed_wheel_is_what_runs(install):
    out = _run([str(install["python"]), "-c", PROBE], cwd=install["work"])
    _ok(out, "importing guirl from the installed wheel")
    probe = json.loads(out.stdout.splitlines()[-1])
    venv = str(install["venv"].resolve())
    assert probe["dist_root"].startswith(venv + os.sep), probe["dist_root"]
    assert probe["files"] and all(f.startswith(venv + os.sep) for f in probe["files"]), [
        f for f in probe["files"] if not f.startswith(venv + os.sep)
    ]
    assert probe["namespace_packages"] == [], "packages without __init__.py (a wheel leaves them out)"
    assert str(ROOT) not in probe["sys_path"], f"the checkout is on the venv's sys.path: {probe['sys_path']}"
    with_guirl = [p for p in probe["sys_path"] if Path(p, "guirl").is_dir()]
    assert with_guirl == [probe["dist_root"]], f"more than the wheel's guirl on sys.path: {with_guirl}"
    assert probe["unmet"] == [], f"the wheel's requirements are not met here: {probe['unmet']}"


def test_guirl_eval_runs_the_shipped_suite_from_the_wheel(install):
    # the shipped config and suite, copied: the run reads nothing of the checkout but its venv's packages
    work = install["work"] / "eval"
    (work / "configs").mkdir(parents=True)  # the config's paths are its own directory's: ../tasks/local
    shutil.copy2(ROOT / "configs" / "local_eval.toml", work / "configs" / "local_eval.toml")
    shutil.copytree(ROOT / "tasks" / "local", work / "tasks" / "local")
    meta = json.loads((work / "tasks" / "local" / "test.json").read_text())
    basic = ("terminal", "text_editor", "spreadsheet")  # the light applications: this is about the install
    n_tasks = sum(len(meta[d]) for d in basic)
    guirl = str(install["venv"] / "bin" / "guirl")
    config = ["--config", "configs/local_eval.toml"]
    cmd = [guirl, "eval", *config, "--backend", "scripted", "--max-steps", "15", *FAST]
    cmd += [arg for d in basic for arg in ("--domain", d)]
    out = _run([*cmd, "--set", "run.root_dir=runs"], cwd=work, timeout=400)
    _ok(out, "guirl eval from the installed wheel")
    (found,) = (work / "runs").glob("*/summary.json")
    summary = json.loads(found.read_text())
    assert summary["tasks"] == n_tasks and summary["episodes"] == n_tasks, summary
    assert summary["aborted"] == 0 and summary["env_errors"] == 0 and summary["accuracy"] == 1.0, summary
    assert f"[eval] {n_tasks}/{n_tasks} tasks" in out.stdout


def test_the_sglang_stand_in_launches_from_the_wheel(install):
    out = _run([str(install["python"]), "-m", "guirl.testing.fakes", "sglang", "--help"], cwd=install["work"])
    _ok(out, "python -m guirl.testing.fakes sglang --help")
    assert out.stdout.startswith("usage:") and "--model-path" in out.stdout
