"""The front door stays short and its pages stay true: the README's length, every page it names exists and
says first what it is for, and the configuration reference is the schema's."""

import re
from pathlib import Path

from guirl.devtools.config_reference import PAGE, render

ROOT = Path(__file__).resolve().parents[2]


def test_the_configuration_reference_is_current() -> None:
    assert PAGE.read_text() == render(), "run: python -m guirl.devtools.config_reference"


def test_the_readme_is_short_and_every_page_it_names_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    named = set(re.findall(r"`(docs/[\w./-]+\.md)`", readme))
    assert len(named) >= 10 and all((ROOT / page).is_file() for page in named), named
    assert "the seed" not in readme.lower()


def test_every_page_says_what_it_is_for() -> None:
    for page in sorted((ROOT / "docs").glob("*.md")):
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# ") and lines[1] == "" and lines[2].strip(), page.name
