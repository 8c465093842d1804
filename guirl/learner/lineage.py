"""The learner's lineage: which weights a sample may have been played by and still be trained.

A learner that restarts goes back to its latest checkpoint (or, with none, to the starting weights) and
makes new versions from there: the versions the previous learner published after that checkpoint died
with it, and the new learner will publish other weights under the same numbers. So a version number names
weights only together with its epoch: how many times the learner has (re)started in this run. Epoch `e`
began from version `forks[e]` (epoch 0 from the run's starting version: 0, or the checkpoint a resumed run
began from).

Weights `(e, v)` are the current learner's own, or an ancestor of them, exactly when every epoch after `e`
began from `v` or later: then no restart cut `v` off. Version 0 or below (the starting weights, which an
engine started from a checkpoint serves as -1) belongs to every epoch. A sample played by other weights
has importance ratios against a policy the learner never had: it is never trained.
"""

from __future__ import annotations

import json
from pathlib import Path

from guirl.fileio import write_json_atomic

LINEAGE_FILE = "lineage.json"


class Lineage:
    """`forks[e]`: the version epoch `e` began from; the last one is the running learner's."""

    def __init__(self, forks: list[int]) -> None:
        if not forks or any(not isinstance(f, int) or isinstance(f, bool) or f < 0 for f in forks):
            raise ValueError(f"a lineage is a non-empty list of versions >= 0, got {forks!r}")
        self.forks = list(forks)

    @property
    def epoch(self) -> int:
        return len(self.forks) - 1

    def holds(self, epoch: int, version: int, current: int) -> bool:
        """Whether weights `(epoch, version)` are the learner's at `current` or an ancestor of them."""
        if version > current:
            return False  # from the future: nothing this learner has made
        if version <= 0:
            return True  # the starting weights
        if not 0 <= epoch <= self.epoch:
            return False
        return all(version <= fork for fork in self.forks[epoch + 1 :])

    @classmethod
    def load(cls, run_dir: str | Path) -> Lineage | None:
        """The lineage recorded in `run_dir` (None when the run has none yet); ValueError when damaged."""
        path = Path(run_dir) / LINEAGE_FILE
        if not path.is_file():
            return None
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: unreadable: {exc}") from exc
        forks = doc.get("forks") if isinstance(doc, dict) else None
        if not isinstance(forks, list) or not forks:
            raise ValueError(f"{path}: no list of forks")
        return cls(forks)

    @classmethod
    def begin(cls, run_dir: str | Path, version: int) -> Lineage:
        """The lineage of a learner starting at `version` in `run_dir`: a new epoch after the ones the run
        has had (recorded in `lineage.json`, written before anything of the new epoch is published)."""
        path = Path(run_dir) / LINEAGE_FILE
        before = cls.load(run_dir)
        lineage = cls([*(before.forks if before else []), max(0, int(version))])
        write_json_atomic(path, {"forks": lineage.forks}, indent=None)
        return lineage
