"""guirl's X11 window-dump reader (`writer_ocr.read_xwd`) on dumps laid out by hand from the XWD format
(X11's XWDFile.h): the pixel layouts `xwd` writes on little- and big-endian servers, and ones it rejects."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from guirl.vmpool.tasks.metrics.writer_ocr import read_xwd

# Two rows of two pixels: red, green / blue, (10, 20, 30)
PIXELS = [[(255, 0, 0), (0, 255, 0)], [(0, 0, 255), (10, 20, 30)]]
MASKS = (0xFF0000, 0x00FF00, 0x0000FF)


def _dump(
    path: Path,
    *,
    bits_per_pixel: int,
    lsb_first: bool,
    ncolors: int = 0,
    pad_to: int = 4,
    pixmap_format: int = 2,
    visual_class: int = 4,
) -> Path:
    """An XWD v7 file: 25 big-endian CARD32 header fields, the window name, `ncolors` XWDColor entries,
    then rows padded to `pad_to` bytes."""
    step = bits_per_pixel // 8
    width, height = 2, 2
    bytes_per_line = -(-(width * step) // pad_to) * pad_to
    name = b"dump\x00"
    header_size = 100 + len(name)
    fields = [
        header_size, 7, pixmap_format, 24, width, height, 0, 0 if lsb_first else 1, 32, 0 if lsb_first else 1,
        32, bits_per_pixel, bytes_per_line, visual_class, *MASKS, 8, 256, ncolors, width, height, 0, 0, 0,
    ]  # fmt: skip
    body = bytearray()
    for row in PIXELS:
        line = bytearray()
        for r, g, b in row:
            value = ((r << 16) | (g << 8) | b) & ((1 << bits_per_pixel) - 1)
            line += value.to_bytes(step, "little" if lsb_first else "big")
        body += line + bytes(bytes_per_line - len(line))
    colormap = b"".join(struct.pack(">IHHHBB", i, i, i, i, 7, 0) for i in range(ncolors))
    path.write_bytes(struct.pack(">25I", *fields) + name + colormap + bytes(body))
    return path


@pytest.mark.parametrize(
    ("bits_per_pixel", "lsb_first", "ncolors"),
    [
        (32, True, 256),  # `xwd -root` on a little-endian 24-bit-depth server: colormap, then BGRX pixels
        (32, False, 0),
        (24, True, 0),
        (24, False, 16),
    ],
)
def test_read_xwd_true_colour(tmp_path: Path, bits_per_pixel: int, lsb_first: bool, ncolors: int):
    path = _dump(tmp_path / "ls.png", bits_per_pixel=bits_per_pixel, lsb_first=lsb_first, ncolors=ncolors)
    image = read_xwd(str(path))
    assert image is not None and image.mode == "RGB" and image.size == (2, 2)
    assert np.asarray(image).tolist() == [[list(p) for p in row] for row in PIXELS]


@pytest.mark.parametrize(
    "change",
    [
        {"bits_per_pixel": 16},  # only 24- and 32-bit pixels are read
        {"pixmap_format": 1},  # XYPixmap, not ZPixmap
    ],
)
def test_read_xwd_rejects_other_layouts(tmp_path: Path, change: dict[str, int]):
    kwargs = {"bits_per_pixel": 32, "lsb_first": True, **change}
    assert read_xwd(str(_dump(tmp_path / "x.xwd", **kwargs))) is None


def test_read_xwd_rejects_truncated_and_foreign_files(tmp_path: Path):
    path = _dump(tmp_path / "x.xwd", bits_per_pixel=32, lsb_first=True)
    path.write_bytes(path.read_bytes()[:-4])
    assert read_xwd(str(path)) is None
    (tmp_path / "y.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(120))
    assert read_xwd(str(tmp_path / "y.png")) is None
