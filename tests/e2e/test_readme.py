"""The README's commands as a new user runs them: the cheap ones of its install, CPU and real-model
sections (checks, dry runs, listings), as written, from a fresh shell in another directory, with `guirl`
on the PATH as the install section puts it there. Placeholders get fake values (`…`) or the test's own
(`/path/to/`); a model named by its Hugging Face id is a tiny checkpoint in a cache the test lays out, as
`hf download` would."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.helpers import osworld_dir

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("## Install", "## Try it on a CPU", "## Evaluate a real model")
CHEAP = ("--dry-run", "--version", "--help", "config show", "tasks check", "guirl runs")


def _blocks(section: str) -> list[list[str]]:
    """The lines of each ```bash block of a README section."""
    text = (ROOT / "README.md").read_text()
    start = text.index(section + "\n")
    end = text.find("\n## ", start + len(section))
    body = text[start : end if end >= 0 else None]
    return [block.splitlines() for block in re.findall(r"```bash\n(.*?)```", body, flags=re.S)]


def _hub_cache(home: Path, repo_id: str) -> None:
    from guirl.model.tiny import write_tiny_checkpoint

    repo = home / "hub" / f"models--{repo_id.replace('/', '--')}"
    write_tiny_checkpoint(repo / "snapshots" / ("0" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)


def test_the_readmes_cheap_commands_run_as_written_from_elsewhere(tmp_path: Path) -> None:
    elsewhere, home = tmp_path / "elsewhere", tmp_path / "home"
    elsewhere.mkdir()
    home.mkdir()
    hf_home = tmp_path / "hf"
    env = {
        "PATH": f"{ROOT / '.venv' / 'bin'}:/usr/bin:/bin",  # what the install section's `export PATH` gives
        "HOME": str(home),
        "HF_HOME": str(hf_home),
        "LANG": "C.UTF-8",
    }
    osworld = osworld_dir()
    if osworld is not None:
        env["OSWORLD_TASKS"] = str(osworld)
    ran, skipped = [], []
    for section in SECTIONS:
        for block in _blocks(section):
            # placeholders: `…` gets a fake value; a `/path/to/` the test gives itself (OSWORLD_TASKS)
            exports = [
                line.split("#")[0].replace("…", "test-value")
                for line in block
                if line.startswith("export ") and "/path/to/" not in line
            ]
            for line in block:
                command = line.split("  #")[0].strip()
                if not any(word in command for word in CHEAP) or command.startswith(("make", "export")):
                    continue
                if "…" in command or "runs/" in command or ("$OSWORLD_TASKS" in line and osworld is None):
                    skipped.append(command)
                    continue
                for repo_id in set(re.findall(r"Qwen/[\w.-]+", command + " ".join(exports))):
                    if not (hf_home / "hub" / f"models--{repo_id.replace('/', '--')}").exists():
                        _hub_cache(hf_home, repo_id)
                exports = [e for e in exports if "PATH=" not in e]
                script = "\n".join([*exports, command])
                out = subprocess.run(
                    ["bash", "-c", script],
                    cwd=elsewhere,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=180,
                )
                assert out.returncode == 0, f"{command}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
                ran.append(command)
    assert len(ran) >= 4, (ran, skipped)  # the test checks commands, it does not skip them all
    assert any("--ckpt Qwen/" in c and "--dry-run" in c for c in ran), (
        ran
    )  # a model by its id, from the cache
    assert osworld is None or any("osworld_qwen3vl_4b_eval --dry-run" in c for c in ran), ran
    print("\n".join(["ran:", *ran, "skipped:", *skipped]))
    assert sorted(p.name for p in elsewhere.iterdir()) == []  # checks and dry runs leave nothing behind
