"""OSWorld's reference evaluators (desktop-env, pinned) loaded for parity tests, without the wheel's heavy
package inits.

`reference("metrics.gimp")` returns desktop-env's `desktop_env/evaluators/metrics/gimp.py` as a module,
imported under its real name behind stub packages (so its `from .utils import ...` and
`from desktop_env.evaluators.metrics.utils import ...` resolve) but without running
`desktop_env/__init__` or `evaluators/metrics/__init__`, which import every metric's dependencies
(easyocr and torch, playwright, librosa, ...). A module the reference imports at the top but the
function under test never uses can be named in `absent`: it becomes a placeholder whose every attribute
raises when used, so a test that does reach it fails loudly instead of scoring with a fake; a module that
is installed is imported for real instead.

Tests never take expected values from guirl's code: each case states the score both implementations must
give, or, for a deliberate difference, what the reference does and what guirl does instead.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

REFERENCE_VERSION = "1.0.2"
"""The desktop-env release parity is checked against (installed by `make setup-test`, without its deps)."""

_PACKAGES = ("", "evaluators", "evaluators/metrics", "evaluators/getters")


def reference_root() -> Path:
    """The installed `desktop_env` directory, found without importing the package."""
    try:
        version = importlib.metadata.version("desktop-env")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(
            f"OSWorld's reference evaluators are not installed: `make setup-test` installs "
            f"desktop-env=={REFERENCE_VERSION} (--no-deps) and the libraries its evaluators import",
            pytrace=False,
        )
    if version != REFERENCE_VERSION:
        pytest.fail(f"parity is pinned to desktop-env=={REFERENCE_VERSION}, found {version}", pytrace=False)
    for f in importlib.metadata.files("desktop-env") or []:
        path = str(f).replace("\\", "/")
        if path.endswith("desktop_env/__init__.py"):
            return Path(f.locate()).parent
    pytest.fail("desktop-env is installed without its package files", pytrace=False)


class _Absent(types.ModuleType):
    """A module the reference imports but the tested function must not use."""

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)

        def used(*_a: object, **_k: object) -> None:
            raise AssertionError(f"the reference used {self.__name__}.{name}, stubbed as absent in this test")

        return used


def reference(module: str, absent: Iterable[str] = ()) -> types.ModuleType:
    """desktop-env's `evaluators/<module>.py` (e.g. "metrics.vlc", "getters.chrome"), imported alone."""
    root = reference_root()
    for sub in _PACKAGES:
        name = "desktop_env" + ("." + sub.replace("/", ".") if sub else "")
        existing = sys.modules.get(name)
        if existing is None or getattr(existing, "__file__", None) is not None:
            package = types.ModuleType(name)
            package.__path__ = [str(root / sub)]
            sys.modules[name] = package
    for name in absent:
        # only what is not installed: a placeholder for an installed module would outlive this test and
        # break another family's (the stubs stay in sys.modules for the session)
        try:
            installed = importlib.util.find_spec(name.split(".")[0]) is not None
        except ValueError:
            installed = False
        if installed:
            continue
        if name not in sys.modules or isinstance(sys.modules[name], _Absent):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                sys.modules.setdefault(".".join(parts[:i]), _Absent(".".join(parts[:i])))
    full = f"desktop_env.evaluators.{module}"
    loaded = sys.modules.get(full)
    if loaded is not None and getattr(loaded, "__file__", None):
        return loaded
    path = root / "evaluators" / (module.replace(".", "/") + ".py")
    spec = importlib.util.spec_from_file_location(full, path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    sys.modules[full] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[full]
        raise
    return mod


def both(name: str, module: types.ModuleType, want: float, *args: Any, **kwargs: Any) -> None:
    """guirl's metric `name` and the reference module's give `want` for the same arguments."""
    from guirl.vmpool.tasks.metrics import METRICS

    ours = METRICS[name](*args, **kwargs)
    theirs = getattr(module, name)(*args, **kwargs)
    assert ours == pytest.approx(want), f"guirl {name}{args!r} = {ours}"
    assert theirs == pytest.approx(want), f"reference {name}{args!r} = {theirs}"


def write(path: Path, text: str) -> str:
    """Write a UTF-8 text file; its path as a string (what getters hand metrics)."""
    path.write_text(text, encoding="utf-8")
    return str(path)
