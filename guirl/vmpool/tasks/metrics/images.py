"""Images and GIMP: similarity, brightness/contrast/saturation, sizes, GIMP's settings (OSWorld's
metrics/gimp.py).
"""

from __future__ import annotations

from collections.abc import Callable

METRICS: dict[str, Callable[..., float]] = {}
"""This family's metrics, by OSWorld's names."""
