"""`compare_image_text`: is a text visible in an image (reference: `metrics/docs.py`, which OCRs with
easyocr). guirl OCRs with the Tesseract binary (Debian `tesseract-ocr`, English data included), which
runs offline and needs no torch or model download; easyocr and Tesseract do not read every image alike,
so this is a deliberate difference (tests/integration/test_parity_writer.py).

Registered through `writer.METRICS`.
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image, ImageOps, ImageStat, UnidentifiedImageError

from guirl.vmpool.tasks.metrics import UnsupportedMetric

REQUIRES_PROGRAMS = {"tesseract": "tesseract-ocr"}
"""Programs this module runs on the evaluating host, and their Debian packages."""

_XWD_HEADER = struct.Struct(">25I")  # XWDFileHeader: 25 big-endian CARD32 fields, then the window name
_XWD_COLOR_SIZE = 12  # one XWDColor colormap entry, which precedes the pixels
_ZPIXMAP = 2
_OCR_TIMEOUT_S = 120
_MIN_OCR_WIDTH = 1600  # screenshots narrower than this are upscaled: Tesseract wants ~30 px capitals


def _channel(values: np.ndarray, mask: int) -> np.ndarray:
    shift = (mask & -mask).bit_length() - 1
    top = mask >> shift
    return ((values >> shift) & top) * 255 // max(top, 1)


def read_xwd(path: str) -> Image.Image | None:
    """An X11 window dump (what `xwd` writes, whatever the file is named) as an RGB image; None for
    anything but a TrueColor ZPixmap of 24 or 32 bits per pixel."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < _XWD_HEADER.size:
        return None
    (header_size, version, pixmap_format, _depth, width, height, _xoffset, byte_order, _unit, _bit_order,
     _pad, bits_per_pixel, bytes_per_line, _visual, red_mask, green_mask, blue_mask, _bits_per_rgb,
     _entries, ncolors, *_window) = _XWD_HEADER.unpack_from(data)  # fmt: skip
    if version != 7 or pixmap_format != _ZPIXMAP or bits_per_pixel not in (24, 32) or not width or not height:
        return None
    start = header_size + ncolors * _XWD_COLOR_SIZE
    if len(data) < start + bytes_per_line * height or bytes_per_line < width * bits_per_pixel // 8:
        return None
    rows = np.frombuffer(data, np.uint8, bytes_per_line * height, start).reshape(height, bytes_per_line)
    step = bits_per_pixel // 8
    pixel_bytes = rows[:, : width * step].reshape(height, width, step).astype(np.uint32)
    if byte_order == 0:  # LSBFirst: the first byte of a pixel is its least significant
        pixel_bytes = pixel_bytes[:, :, ::-1]
    values = np.zeros((height, width), np.uint32)
    for i in range(step):
        values = (values << 8) | pixel_bytes[:, :, i]
    rgb = np.stack([_channel(values, m) for m in (red_mask, green_mask, blue_mask)], axis=-1)
    return Image.fromarray(rgb.astype(np.uint8), "RGB")


def _open_image(path: str) -> Image.Image | None:
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError):
        pass
    try:
        return read_xwd(path)
    except (OSError, ValueError):
        return None


def ocr_text(image: Image.Image) -> str:
    """The words Tesseract reads in the image, joined by single spaces.

    Tesseract reads dark text on a light ground best, so a mostly dark image (a terminal) is inverted;
    small screenshots are upscaled. A host without Tesseract raises: an environment fault, not a score.
    """
    gray = image.convert("L")
    if ImageStat.Stat(gray).mean[0] < 128:
        gray = ImageOps.invert(gray)
    if gray.width < _MIN_OCR_WIDTH:
        factor = 2 if gray.width * 2 >= _MIN_OCR_WIDTH else 3
        gray = gray.resize((gray.width * factor, gray.height * factor), Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    gray.save(buffer, "PNG")
    binary = shutil.which("tesseract")
    if binary is None:
        raise RuntimeError("compare_image_text needs the tesseract binary (Debian package tesseract-ocr)")
    done = subprocess.run(
        [binary, "stdin", "stdout", "-l", "eng"],
        input=buffer.getvalue(),
        # one thread: Tesseract's OpenMP threads only slow a screenshot down, more so on a busy host
        env={**os.environ, "OMP_THREAD_LIMIT": "1"},
        capture_output=True,
        timeout=_OCR_TIMEOUT_S,
        check=True,
    )
    return " ".join(done.stdout.decode("utf-8", "replace").split())


def compare_image_text(image_path: str | None, rule: dict[str, Any]) -> float:
    """1.0 when `rule["text"]` occurs in the text OCR reads in the image (`rule["type"]` "text", the
    only type OSWorld defines). An image that is missing or cannot be decoded scores 0.0."""
    if rule.get("type") != "text":
        raise UnsupportedMetric(f"compare_image_text rule type {rule.get('type')!r} is not implemented")
    if not image_path or not isinstance(image_path, (str, os.PathLike)) or not os.path.isfile(image_path):
        return 0.0
    image = _open_image(str(image_path))
    if image is None:
        return 0.0
    return float(rule["text"] in ocr_text(image))


METRICS: dict[str, Callable[..., float]] = {"compare_image_text": compare_image_text}
"""Registered through `writer.METRICS`."""
