"""guirl's package graph and the layer order it must keep (`docs/architecture.md` explains each layer).

`python -m guirl.devtools.layers` prints every package with the packages it imports and its layer, then
any violation: an import cycle between packages, or an import from a lower layer to a higher one. Every
import counts, at any depth in a module (a function-level import is still a dependency) and under
`TYPE_CHECKING`. `tests/unit/test_layers.py` runs the same check; exit status 1 when it fails.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("guirl", "guirl.errors", "guirl.log", "guirl.fileio", "guirl.net", "guirl.proc")),
    ("wire and config", ("guirl.messages", "guirl.config", "guirl.msglog")),
    ("runtime", ("guirl.runtime",)),
    (
        "libraries",
        (
            "guirl.agent",
            "guirl.model",
            "guirl.weights",
            "guirl.inference",
            "guirl.learner",
            "guirl.prm",
            "guirl.data",
            "guirl.vmpool",
            "guirl.placement",
            "guirl.cluster",
            "guirl.tracking",
            "guirl.testing",
        ),
    ),
    ("roles", ("guirl.actors",)),
    (
        "assembly",
        (
            "guirl.roles",
            "guirl.report",
            "guirl.chaos",
            "guirl.status",
            "guirl.runs",
            "guirl.plot",
            "guirl.view",
        ),
    ),
    ("drivers", ("guirl.eval", "guirl.train", "guirl.sft", "guirl.demo", "guirl.prm_offline", "guirl.learn")),
    ("command lines", ("guirl.cli", "guirl.__main__", "guirl.devtools")),
)
"""Bottom to top: a package may import its own layer's packages (without a cycle) and any layer below."""


@dataclass(frozen=True)
class Import:
    module: str
    """The importing module (`guirl.actors.broker`)."""
    target: str
    """The guirl module it imports (`guirl.runtime.base`)."""
    line: int


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str) -> str:
    """The unit the layers speak of: `guirl.X` for anything under `guirl/X` (`guirl` alone for the root)."""
    return ".".join(module.split(".")[:2])


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(root: Path = ROOT) -> list[Import]:
    """Every import of a guirl module by a guirl module (resolved to the longest existing module name)."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    found: list[Import] = []
    for module, path in sorted(files.items()):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, path.name == "__init__.py", node)
                names = [f"{base}.{a.name}" for a in node.names] or [base]
            else:
                continue
            for name in names:
                if name != "guirl" and not name.startswith("guirl."):
                    continue
                while name not in files and "." in name:  # `from pkg import function` names the module
                    name = name.rsplit(".", 1)[0]
                if name in files and name != module:
                    found.append(Import(module, name, node.lineno))
    return found


def package_graph(found: list[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in found:
        src, dst = package_of(imp.module), package_of(imp.target)
        graph[src]
        if src != dst:
            graph[src].add(dst)
    return graph


def layer_of(package: str) -> int | None:
    for i, (_, members) in enumerate(LAYERS):
        if package in members:
            return i
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one package (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def violations(found: list[Import]) -> list[str]:
    """What breaks the architecture: a package in no layer, an import upwards, a cycle between packages."""
    graph = package_graph(found)
    problems = [
        f"{p}: in no layer of guirl.devtools.layers.LAYERS (add it where it belongs)"
        for p in sorted(graph)
        if layer_of(p) is None
    ]
    for imp in found:
        src, dst = layer_of(package_of(imp.module)), layer_of(package_of(imp.target))
        if src is not None and dst is not None and dst > src:
            problems.append(
                f"{imp.module} (line {imp.line}, {LAYERS[src][0]}) imports {imp.target} ({LAYERS[dst][0]}): "
                "an import against the layer order"
            )
    problems += [f"import cycle between packages: {' <-> '.join(c)}" for c in cycles(graph)]
    return problems


def render(found: list[Import]) -> str:
    graph = package_graph(found)
    lines = []
    for i, (name, members) in enumerate(LAYERS):
        lines.append(f"{i} {name}")
        for p in members:
            deps = sorted(graph.get(p, ()), key=lambda d: (layer_of(d) or 0, d))
            lines.append(f"    {p:<20} -> {', '.join(deps) if deps else '(nothing in guirl)'}")
    return "\n".join(lines)


def main() -> int:
    found = imports()
    print(render(found))
    problems = violations(found)
    for p in problems:
        print(f"VIOLATION {p}")
    print(f"{len(found)} imports between guirl's modules; {len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
