"""`guirl tasks check PATH...`: validate task files and say, per domain, how many guirl fully supports.

A PATH is a task file, a directory of them (searched recursively), or an OSWorld meta list
(`{"domain": [task ids]}`, with the tasks in `examples/<domain>/<id>.json` beside it).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import shutil
import sys
import types
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guirl.vmpool.tasks.model import Task, TaskError, getters_of, load_task


@dataclass
class DomainReport:
    total: int = 0
    supported: int = 0
    missing: Counter = field(default_factory=Counter)
    local: int = 0
    """Tasks a local desktop here can run (supported, and nothing missing on the desktop)."""
    local_missing: Counter = field(default_factory=Counter)
    """What the others need that a local desktop here lacks (apps, the network, GNOME)."""


@dataclass
class CheckReport:
    domains: dict[str, DomainReport] = field(default_factory=lambda: defaultdict(DomainReport))
    errors: list[str] = field(default_factory=list)


def _meta_list(path: Path) -> dict[str, list] | None:
    """The `{domain: [ids]}` of a meta list file, or None if `path` is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        return data
    return None


def _task_files(path: Path) -> list[tuple[str, Path]]:
    """(domain, file) pairs named by `path`."""
    if path.is_dir():
        return [(p.parent.name, p) for p in sorted(path.rglob("*.json")) if _meta_list(p) is None]
    meta = _meta_list(path)
    if meta is not None:
        base = path.parent / "examples"
        return [(d, base / d / f"{i}.json") for d, ids in meta.items() for i in ids]
    return [(path.parent.name, path)]


EXTRA = "pip install 'guirl[osworld]'"
"""How to get the libraries OSWorld's metrics and getters need beyond guirl's own dependencies."""


def _module_needs(name: str) -> set[str]:
    module = sys.modules.get(name)
    needs = set(getattr(module, "REQUIRES", ()))
    return needs | {f"program:{p}" for p in getattr(module, "REQUIRES_PROGRAMS", {})}


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:  # nested functions, comprehensions, lambdas
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


@functools.cache
def required_modules(fn: Callable[..., Any]) -> frozenset[str]:
    """What `fn` needs beyond guirl's dependencies: what its module declares it imports (`REQUIRES`) and
    runs (`REQUIRES_PROGRAMS`, as "program:NAME"), and the same for the functions and modules of guirl's
    tasks package that `fn` (and they, in turn) refer to. Per function: a module that merely imports
    another family's module does not inherit its needs."""
    needs: set[str] = set()
    seen: set[int] = set()
    todo = [fn]
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        needs |= _module_needs(getattr(f, "__module__", ""))
        code, scope = getattr(f, "__code__", None), getattr(f, "__globals__", {})
        if code is None:
            continue
        for name in _code_names(code):
            value = scope.get(name)
            if isinstance(value, types.ModuleType):
                if value.__name__.startswith("guirl.vmpool.tasks.") and not hasattr(value, "__path__"):
                    needs |= _module_needs(value.__name__)
            elif isinstance(value, types.FunctionType) and value.__module__.startswith("guirl.vmpool.tasks."):
                todo.append(value)
    return frozenset(needs)


def lacking_modules(fn: Callable[..., Any]) -> list[str]:
    """What `fn` needs (`required_modules` of its module) that is not installed here."""
    out = []
    for need in sorted(required_modules(fn)):
        if need.startswith("program:"):
            if shutil.which(need.removeprefix("program:")) is None:
                out.append(need)
        elif importlib.util.find_spec(need) is None:
            out.append(need)
    return out


def _install_hint(lacking: list[str]) -> str:
    modules = [m for m in lacking if not m.startswith("program:")]
    programs = [m.removeprefix("program:") for m in lacking if m.startswith("program:")]
    hints = [f"{', '.join(modules)}: {EXTRA}"] if modules else []
    hints += [f"the program {p} (Debian: {PROGRAMS.get(p, p)})" for p in programs]
    return "; ".join(hints)


PROGRAMS = {"tesseract": "apt-get install tesseract-ocr", "bwrap": "apt-get install bubblewrap"}
"""How to install the programs evaluators run on the evaluating host."""


def missing_parts(task: Task) -> list[str]:
    """Names of the setup types, getters and metrics of `task` that guirl lacks, or that need a library
    that is not installed here (`metric:NAME (needs MODULE: pip install ...)`)."""
    from guirl.vmpool.tasks.getters import GETTERS
    from guirl.vmpool.tasks.metrics import METRICS
    from guirl.vmpool.tasks.setup import _HANDLERS

    out: list[str] = []

    def need(kind: str, name: str, table: dict[str, Any]) -> None:
        fn = table.get(name)
        if fn is None:
            out.append(f"{kind}:{name}")
        elif lacking := lacking_modules(fn):
            out.append(f"{kind}:{name} (needs {_install_hint(lacking)})")

    for step in [*task.config, *task.evaluator.postconfig]:
        need("setup", step.type, _HANDLERS)
    for getter in getters_of(task):
        need("getter", getter, GETTERS)
    if not task.infeasible:
        for metric in task.funcs:
            need("metric", metric, METRICS)
    return sorted(set(out))


DEVTOOLS = "env.chromium_port: the port of Chrome's DevTools on the VM (0 turns them off)"
DRIVE = "env.google_drive_settings: PyDrive's settings.yml"
ACCOUNT = "env.google_account: the Google account's JSON file"
ATSPI = "the desktop's accessibility tree (AT-SPI): on a local desktop, Debian's {packages}"
WALLPAPER = "GNOME's wallpaper setting, which OSWorld's image has and guirl's local desktops (IceWM) do not"
NETWORK = (
    "the VM's network (the task's browser or commands fetch from the internet): local desktops have none"
)
NEEDS_SETTINGS: dict[str, tuple[str, ...]] = {
    "getter:accessibility_tree": (ATSPI,),
    "getter:vm_terminal_output": (ATSPI,),
    "getter:vm_wallpaper": (WALLPAPER,),
    "setup:chrome_open_tabs": (DEVTOOLS,),
    "setup:chrome_close_tabs": (DEVTOOLS,),
    "setup:login": (DEVTOOLS, ACCOUNT, NETWORK),
    "setup:googledrive": (DRIVE, NETWORK),
    "getter:googledrive_file": (DRIVE, NETWORK),
    # the page getters open the page in the VM's Chrome; the active tab's URL is read from the VM's
    # accessibility tree where it has one, else from DevTools
    **{
        f"getter:{name}": (DEVTOOLS,)
        for name in (
            "open_tabs_info",
            "active_tab_info",
            "active_tab_html_parse",
            "active_url_from_accessTree",
            "active_tab_url_parse",
            "url_dashPart",
            "url_path_parse",
        )
    },
    **{
        f"getter:{name}": (DEVTOOLS, NETWORK)
        for name in (
            "page_info",
            "pdf_from_url",
            "info_from_website",
            "gotoRecreationPage_and_get_html_content",
        )
    },
}
"""What a setup step or getter needs besides code: what only the user's settings or the VM can provide."""

_NETWORK_COMMANDS = (
    "pip install",
    "pip3 install",
    "wget ",
    "curl ",
    "apt ",
    "apt-get ",
    "git clone",
    "snap ",
)


def _needs_network(task: Task) -> bool:
    """Whether the VM itself fetches from the internet: web pages its browser opens at set-up, or commands
    that download (`download` steps and cloud files are fetched by the host, and need no network in the
    VM)."""
    for step in [*task.config, *task.evaluator.postconfig]:
        p = step.parameters
        if step.type == "chrome_open_tabs":
            urls = p.get("urls_to_open") or []
            if any(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
                return True
        elif step.type in ("execute", "command", "launch"):
            cmd = p.get("command")
            text = " ".join(c for c in cmd if isinstance(c, str)) if isinstance(cmd, list) else str(cmd or "")
            if any(n in text for n in _NETWORK_COMMANDS):
                return True
    return False


LOCAL_APPS = "the applications of a local desktop here (guirl/vmpool/apps.py)"
"""In a run's settings: its VMs are local desktops, which run only the applications installed here."""
SHORT = {NETWORK: "network", WALLPAPER: "GNOME wallpaper", ATSPI: "AT-SPI", DEVTOOLS: "DevTools"}
"""The short names `local_missing` gives the needs of `NEEDS_SETTINGS` (explained by `local_legend`)."""


def needs_devtools(task: Task) -> bool:
    """Whether a step or getter of `task` drives the VM's Chrome over DevTools."""
    used = {f"setup:{s.type}" for s in [*task.config, *task.evaluator.postconfig]}
    used |= {f"getter:{g}" for g in getters_of(task)}
    return any(DEVTOOLS in NEEDS_SETTINGS.get(part, ()) for part in used)


def _lacks(task: Task, available: set[str]) -> list[tuple[set[str], str]]:
    """What `task` needs that `available` does not provide, each as (its short names, a message naming
    it): the settings of its steps and getters, the VM's network, and (with `LOCAL_APPS`) its
    applications."""
    used = {f"setup:{s.type}" for s in [*task.config, *task.evaluator.postconfig]}
    used |= {f"getter:{g}" for g in getters_of(task)}
    out = []
    for part in sorted(used):
        lacking = [need for need in NEEDS_SETTINGS.get(part, ()) if need not in available]
        if lacking:
            names = {SHORT.get(n, n) for n in lacking}
            out.append((names, f"{part} (needs {'; '.join(_said(n) for n in lacking)})"))
    if NETWORK not in available and _needs_network(task) and not any(NETWORK in m for _, m in out):
        out.append(({SHORT[NETWORK]}, f"network (needs {NETWORK})"))
    if LOCAL_APPS in available:
        from guirl.vmpool.apps import needed_apps

        for app in sorted(needed_apps(task), key=lambda a: a.name):
            if not app.installed():
                why = app.why_not or f"not installed here: apt-get install {app.package}"
                out.append(({f"app:{app.name}"}, f"app:{app.name} ({why})"))
    return out


def unavailable_parts(task: Task, available: set[str]) -> list[str]:
    """What `task` needs that the run does not provide (`available`: `NEEDS_SETTINGS`, the network, and on
    local desktops their applications), each naming what it lacks."""
    return [message for _, message in _lacks(task, available)]


def _said(need: str) -> str:
    if need == ATSPI:
        from guirl.vmpool.apps import ATSPI_PARTS

        return ATSPI.format(packages=", ".join(pkg for _, pkg in ATSPI_PARTS))
    return need


def available_settings(
    *,
    devtools: bool,
    drive: bool,
    account: bool,
    atspi: bool = True,
    local: bool = False,
) -> set[str]:
    """The `NEEDS_SETTINGS` a run's configuration provides. `local`: the VMs are local desktops (no
    network, no GNOME, the applications installed here; an accessibility tree where `atspi`)."""
    given = (
        (DEVTOOLS, devtools),
        (DRIVE, drive),
        (ACCOUNT, account),
        (ATSPI, atspi),
        # GNOME's settings and the internet come with OSWorld's desktop image, which every cloud VM boots
        (WALLPAPER, not local),
        (NETWORK, not local),
        (LOCAL_APPS, local),
    )
    return {need for need, ok in given if ok}


def local_settings() -> set[str]:
    """What a local desktop here provides, with the user's Google settings taken as given (they are the
    user's, not the desktop's)."""
    from guirl.vmpool.apps import atspi_missing

    return available_settings(devtools=True, drive=True, account=True, atspi=not atspi_missing(), local=True)


def local_missing(task: Task) -> list[str]:
    """What `task` needs that a local desktop here does not have, by short names (`app:vs_code`,
    `network`, `GNOME wallpaper`): its applications, the network, GNOME's settings, AT-SPI."""
    return sorted({name for names, _ in _lacks(task, local_settings()) for name in names})


def local_legend(names: set[str]) -> list[str]:
    """What each of `local_missing`'s names means, and how to get it where one can."""
    from guirl.vmpool.apps import APPS

    apps = {f"app:{a.name}": a for a in APPS}
    needs = {v: k for k, v in SHORT.items()}
    out = []
    for name in sorted(names):
        if name in apps:
            app = apps[name]
            out.append(f"{name}: {app.why_not or f'not installed here (apt-get install {app.package})'}")
        elif name in needs:
            out.append(f"{name}: {_said(needs[name])}")
    return out


def check(paths: list[Path]) -> CheckReport:
    report = CheckReport()
    for path in paths:
        if not path.exists():
            report.errors.append(f"{path}: no such file or directory")
            continue
        for domain, file in _task_files(path):
            try:
                task = load_task(file)
            except TaskError as exc:
                report.errors.append(str(exc))
                continue
            d = report.domains[domain]
            d.total += 1
            missing = missing_parts(task)
            d.supported += not missing
            d.missing.update(missing)
            lacking = local_missing(task)
            d.local += not missing and not lacking
            d.local_missing.update(lacking)
    return report


def _top(counter: Counter, n: int = 6) -> str:
    text = ", ".join(f"{k} ({v})" for k, v in counter.most_common(n))
    return text + (f", +{len(counter) - n} more" if len(counter) > n else "")


def render(report: CheckReport) -> str:
    """The table: per domain, its tasks, how many guirl supports (and what the others need), and how many
    a local desktop here can run; then, per domain, what a local desktop lacks for the others."""
    lines = [f"{'domain':<22} {'tasks':>6} {'supported':>10} {'local':>6}  missing (tasks)"]
    total = supported = local = 0
    for name in sorted(report.domains):
        d = report.domains[name]
        total, supported, local = total + d.total, supported + d.supported, local + d.local
        lines.append(f"{name:<22} {d.total:>6} {d.supported:>10} {d.local:>6}  {_top(d.missing)}")
    lines.append(f"{'all':<22} {total:>6} {supported:>10} {local:>6}")
    lacking = {n: d for n, d in sorted(report.domains.items()) if d.local_missing}
    if lacking:
        lines.append("")
        lines.append("what a local desktop here lacks for the others (tasks):")
        lines += [f"  {name:<20} {_top(d.local_missing, 6)}" for name, d in lacking.items()]
        lines += [
            f"  - {line}" for line in local_legend({k for d in lacking.values() for k in d.local_missing})
        ]
    lines += [f"error: {e}" for e in report.errors]
    return "\n".join(lines)
