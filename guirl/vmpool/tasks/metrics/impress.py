"""LibreOffice Impress decks beyond compare_pptx_files (OSWorld's metrics/slides.py)."""

from __future__ import annotations

from collections.abc import Callable

METRICS: dict[str, Callable[..., float]] = {}
"""This family's metrics, by OSWorld's names."""
