"""Chrome's state: tabs, URLs, pages, bookmarks, history, settings, extensions (OSWorld's
metrics/chrome.py).
"""

from __future__ import annotations

from collections.abc import Callable

METRICS: dict[str, Callable[..., float]] = {}
"""This family's metrics, by OSWorld's names."""
