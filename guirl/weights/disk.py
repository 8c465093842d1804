"""Weights to disk: the learner writes each version as safetensors; the engines load the files."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from guirl.fileio import write_dir_atomic
from guirl.messages.weights import WeightsFromDisk


class DiskPublisher:
    """`root/v<version>/model.safetensors`, written whole then renamed into place; older versions are
    removed (the engines have moved on). `epoch` (the learner's lineage) is written beside the weights:
    a version published again in the same epoch is the same weights, and is not written again (a broker
    may be loading it right now); one of another epoch is replaced."""

    def __init__(self, root: str | Path, *, epoch: int = 0) -> None:
        self.root = Path(root)
        self.epoch = epoch

    def prepare(self, version: int, state: dict[str, Any]) -> WeightsFromDisk:
        from safetensors.torch import save_file

        final = self.root / f"v{version:06d}"
        epoch = str(self.epoch)
        with contextlib.suppress(OSError):
            if (final / "epoch").read_text() == epoch:
                return WeightsFromDisk(path=str(final))

        def fill(tmp: Path) -> None:
            (tmp / "epoch").write_text(epoch)
            save_file(state, str(tmp / "model.safetensors"))

        write_dir_atomic(final, fill, keep=1)
        return WeightsFromDisk(path=str(final))

    def send(self) -> int:
        return 0  # written by `prepare`: the engines load it when the broker tells them

    def close(self) -> None:
        pass
