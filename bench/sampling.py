"""A background sampler for the benches that read /proc while a run goes on: a thread that calls `sample`
every `period_s` from `with` to the end of the block."""

from __future__ import annotations

import os
import threading
from typing import Any, NamedTuple


class Proc(NamedTuple):
    """One process as /proc/PID/stat says."""

    ppid: int
    ticks: int
    """CPU ticks it used itself, user + system (not its children's: they count as themselves while they live;
    a reaped child's would count twice)."""
    rss_pages: int
    name: str


def proc_table() -> dict[int, Proc]:
    """Every process on the machine now (those gone while it is read left out)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                head, _, tail = f.read().rpartition(")")
        except OSError:  # gone meanwhile
            continue
        fields = tail.split()
        # after the name: state(0) ppid(1) ... utime(11) stime(12) ... rss(21)
        ticks = int(fields[11]) + int(fields[12])
        table[int(entry)] = Proc(int(fields[1]), ticks, int(fields[21]), head.partition("(")[2])
    return table


class Sampler:
    """Calls `self.sample()` at once and then every `period_s`, in a daemon thread, while in its `with`."""

    period_s = 0.5

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"{type(self).__name__}", daemon=True)

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.period_s):
                return

    def sample(self) -> None:
        raise NotImplementedError
