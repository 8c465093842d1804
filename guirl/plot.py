"""Learning curves as pictures without a plotting library: a text plot for the terminal, a PNG through Pillow.

A curve is a list of (version, success) points; success is a fraction in [0, 1], None where an evaluation
scored nothing (left out of the line, listed as "n/a").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

Curve = Sequence[tuple[int, float | None]]

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


def text_plot(curves: Mapping[str, Curve], width: int = 40) -> str:
    """One block per curve: a row per evaluation, its success as a bar of up to `width` characters."""
    lines = []
    for name, curve in curves.items():
        lines.append(f"{name}: held-out success by policy version")
        for version, success in curve:
            if success is None:
                lines.append(f"  v{version:<4} {'':<{width}}    n/a")
            else:
                lines.append(f"  v{version:<4} {'#' * round(success * width):<{width}} {success:6.1%}")
    return "\n".join(lines)


def png_plot(curves: Mapping[str, Curve], path: str | Path, *, title: str = "", size=(720, 420)) -> Path:
    """The curves on one chart (x: policy version, y: success 0-100 %), written to `path` as a PNG."""
    from PIL import Image, ImageDraw

    w, h = size
    left, right, top, bottom = 60, 20, 40 if title else 20, 50
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    versions = [v for curve in curves.values() for v, _ in curve] or [0, 1]
    x0, x1 = min(versions), max(max(versions), min(versions) + 1)

    def at(version: float, success: float) -> tuple[float, float]:
        x = left + (version - x0) / (x1 - x0) * (w - left - right)
        return x, top + (1 - success) * (h - top - bottom)

    for pct in range(0, 101, 20):  # the grid and the y axis's labels
        _, y = at(x0, pct / 100)
        draw.line([(left, y), (w - right, y)], fill="#dddddd")
        draw.text((left - 40, y - 6), f"{pct:3d} %", fill="black")
    for version in sorted(set(versions)):
        x, _ = at(version, 0)
        draw.line([(x, h - bottom), (x, h - bottom + 4)], fill="black")
        draw.text((x - 8, h - bottom + 8), str(version), fill="black")
    draw.rectangle([left, top, w - right, h - bottom], outline="black")
    draw.text(((w - 90) / 2, h - 20), "policy version", fill="black")
    if title:
        draw.text((left, 12), title, fill="black")
    for i, (name, curve) in enumerate(curves.items()):
        colour = COLOURS[i % len(COLOURS)]
        points = [at(v, s) for v, s in curve if s is not None]
        if len(points) > 1:
            draw.line(points, fill=colour, width=3)
        for x, y in points:
            draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill=colour)
        draw.rectangle([w - right - 150, top + 10 + 18 * i, w - right - 138, top + 22 + 18 * i], fill=colour)
        draw.text((w - right - 132, top + 10 + 18 * i), name, fill="black")
    path = Path(path)
    img.save(path, format="PNG")
    return path
