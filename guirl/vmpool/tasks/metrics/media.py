"""PDFs, archives, audio, video, e-books, CSV and HTML files (OSWorld's metrics/pdf.py, others.py, vlc.py's
media comparisons, chrome.py's file comparisons).
"""

from __future__ import annotations

from collections.abc import Callable

METRICS: dict[str, Callable[..., float]] = {}
"""This family's metrics, by OSWorld's names."""
