"""`python -m guirl.devtools.config_reference`: write `docs/configuration-reference.md`, every setting of
the config tree with its type, default, environment variable and documentation, from the schema itself
(`guirl.config.describe`), so the page cannot drift from the code (`tests/unit/test_docs.py` checks it is
current)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration-reference.md"


def render() -> str:
    from guirl.config import describe

    lines = [
        "# Configuration reference",
        "",
        "Every setting, section by section: its type, default, the environment variable that sets it",
        "(OpenClaw-RL's GUI-RL's names, and W&B's), and what it does. Generated from",
        "`guirl/config/schema.py` by `python -m guirl.devtools.config_reference`; `guirl config show",
        "--describe` prints the same. How values are resolved is in `configuration.md`.",
    ]
    section = None
    for f in describe():
        top = f.path.split(".")[0]
        if top != section:
            section = top
            lines += [
                "",
                f"## [{top}]",
                "",
                "| setting | type | default | env | what it does |",
                "| --- | --- | --- | --- | --- |",
            ]
        default = "*(secret)*" if f.secret and f.default else json.dumps(f.default)
        doc = " ".join(f.doc.split()).replace("|", "\\|")
        kind = f.type.replace("|", "\\|")
        env = f"`{f.env}`" if f.env else ""
        lines.append(f"| `{f.path}` | {kind} | `{default}` | {env} | {doc} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    PAGE.write_text(render())
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
