"""LibreOffice Writer documents beyond compare_docx_files (OSWorld's metrics/docs.py)."""

from __future__ import annotations

from collections.abc import Callable

METRICS: dict[str, Callable[..., float]] = {}
"""This family's metrics, by OSWorld's names."""
