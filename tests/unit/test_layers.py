"""guirl's architecture, read from its imports: no cycle between packages, nothing against the layer order
(`guirl.devtools.layers`, explained in `docs/architecture.md`), and no exception list."""

import subprocess
import sys
from pathlib import Path

from guirl.devtools import layers

ROOT = Path(__file__).resolve().parents[2]


def test_guirl_keeps_its_layers_and_has_no_import_cycle():
    found = layers.imports()
    assert len(found) > 500  # the walk saw the package, not an empty tree
    assert layers.violations(found) == []


def test_every_layer_names_packages_that_exist():
    existing = {layers.package_of(layers.module_name(p)) for p in layers.ROOT.rglob("*.py")}
    listed = {p for _, members in layers.LAYERS for p in members}
    assert listed - existing == set(), "a stale entry in LAYERS"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "guirl"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_an_import_upwards_is_named_with_its_line(tmp_path):
    root = _tree(
        tmp_path,
        {
            "runtime/__init__.py": "",
            "runtime/base.py": "import os\n\n\ndef f():\n    from guirl.actors.broker import Broker\n",
            "actors/__init__.py": "",
            "actors/broker.py": "from guirl.runtime.base import f\n\nclass Broker: ...\n",
        },
    )
    problems = layers.violations(layers.imports(root))
    assert any(
        p.startswith("guirl.runtime.base (line 5, runtime) imports guirl.actors.broker (roles)")
        for p in problems
    ), problems
    assert "import cycle between packages: guirl.actors <-> guirl.runtime" in problems


def test_a_cycle_inside_one_layer_is_found_through_relative_and_from_imports(tmp_path):
    root = _tree(
        tmp_path,
        {
            "inference/__init__.py": "",
            "inference/hf.py": "from ..learner import weights\n",
            "learner/__init__.py": "",
            "learner/weights.py": "",
            "learner/step.py": "from guirl.inference import hf\n",
        },
    )
    found = layers.imports(root)
    assert {(i.module, i.target) for i in found} >= {
        ("guirl.inference.hf", "guirl.learner.weights"),
        ("guirl.learner.step", "guirl.inference.hf"),
    }
    assert layers.violations(found) == ["import cycle between packages: guirl.inference <-> guirl.learner"]


def test_a_package_in_no_layer_is_reported(tmp_path):
    root = _tree(tmp_path, {"newthing/__init__.py": "from guirl import errors\n", "errors.py": ""})
    assert layers.violations(layers.imports(root)) == [
        "guirl.newthing: in no layer of guirl.devtools.layers.LAYERS (add it where it belongs)"
    ]


def test_the_command_prints_the_graph_it_checks():
    done = subprocess.run(
        [sys.executable, "-m", "guirl.devtools.layers"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 runtime" in done.stdout and "guirl.actors         -> " in done.stdout
    assert done.stdout.rstrip().endswith("0 violation(s)")
