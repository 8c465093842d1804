"""A background sampler for the benches that read /proc while a run goes on: a thread that calls `sample`
every `period_s` from `with` to the end of the block."""

from __future__ import annotations

import threading
from typing import Any


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
