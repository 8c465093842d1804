"""Grounding metrics of a GUI-R1-mode evaluation, from its episode folders.

Each scored episode's `result.json` holds the rule reward's components (`reward_parts`): `format` (the
answer has GUI-R1's shape), `type` (the right action type), `point` (for point actions: the click lands on
the target), `text` (for text actions: the text matches), `accuracy` (all that apply). Reported, overall and
per domain: step success (accuracy), type accuracy, grounding accuracy (point, over the rows that need a
point), text accuracy (over the rows that need text) and format rate.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Collection
from pathlib import Path
from typing import Any

_METRICS = (  # name in the report, reward part
    ("step_success", "accuracy"),
    ("type_accuracy", "type"),
    ("grounding_accuracy", "point"),
    ("text_accuracy", "text"),
    ("format_rate", "format"),
)


def grounding_metrics(
    run_dir: str | Path, episodes: Collection[str] | None = None
) -> dict[str, dict[str, Any]]:
    """`{domain: {rows, step_success, type_accuracy, grounding_accuracy, ...}}` plus `all`; a metric is None
    where no row of the domain needs it. Episodes that were not scored (environment errors) are left out,
    and with `episodes` (the summary's: a resumed eval's suite, each row's final episode) all others."""
    parts: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    rows: dict[str, int] = defaultdict(int)
    for path in sorted(Path(run_dir, "episodes").glob("*/*/result.json")):
        if episodes is not None and path.parent.name not in episodes:
            continue
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if result.get("status") != "completed" or not isinstance(result.get("reward_parts"), dict):
            continue
        for domain in (result.get("domain") or "", "all"):
            rows[domain] += 1
            for key, value in result["reward_parts"].items():
                if isinstance(value, int | float):
                    parts[domain][key].append(float(value))
    out: dict[str, dict[str, Any]] = {}
    for domain in sorted(rows, key=lambda d: (d == "all", d)):
        entry: dict[str, Any] = {"rows": rows[domain]}
        for name, key in _METRICS:
            values = parts[domain].get(key) or []
            entry[name] = round(sum(values) / len(values), 4) if values else None
            if key in ("point", "text"):
                entry[f"{name}_rows"] = len(values)
        out[domain] = entry
    return out


def grounding_table(metrics: dict[str, dict[str, Any]]) -> str:
    """The metrics as a text table, one row per domain, `all` last."""

    def pct(v: Any) -> str:
        return f"{100 * v:.1f}%" if isinstance(v, int | float) else "-"

    head = (
        f"{'domain':<20} {'rows':>5} {'step success':>12} {'type':>7} {'grounding':>9} {'text':>7} "
        f"{'format':>7}"
    )
    lines = [head]
    for domain, m in metrics.items():
        if domain == "all":
            lines.append("-" * len(head))
        lines.append(
            f"{domain or '-':<20} {m['rows']:>5} {pct(m['step_success']):>12} {pct(m['type_accuracy']):>7} "
            f"{pct(m['grounding_accuracy']):>9} {pct(m['text_accuracy']):>7} {pct(m['format_rate']):>7}"
        )
    return "\n".join(lines)
