"""The desktop and general checks: GNOME settings, time zones, files moved, clipboard, JSON/CSV/SQLite/text
checks (OSWorld's metrics/basic_os.py, general.py).
"""

from __future__ import annotations

from collections.abc import Callable

METRICS: dict[str, Callable[..., float]] = {}
"""This family's metrics, by OSWorld's names."""
