"""Named counters every actor keeps and reports in `StatsReply` (drops are always counted by reason)."""

from __future__ import annotations

from collections import Counter


class Counters(Counter):
    """`counters["dropped.decode"] += 1` etc.; `snapshot()` gives a plain dict for a StatsReply."""

    def snapshot(self) -> dict[str, int]:
        return {k: int(v) for k, v in sorted(self.items())}

    def dropped(self) -> int:
        """All messages dropped, whatever the reason."""
        return sum(v for k, v in self.items() if k.startswith("dropped."))
