"""Screenshot sizing for Qwen-VL vision encoders: `smart_resize` and what an image costs in tokens.

`smart_resize` is Qwen's algorithm (qwen-vl-utils `vision_process.smart_resize`) so the image the policy
sees here is the one its processor would make; with `factor = patch_size * merge_size` (16 * 2 = 32 for
Qwen3-VL) every side is a whole number of merged patches.
"""

from __future__ import annotations

import io
import math

from PIL import Image

MAX_RATIO = 200
"""Largest aspect ratio Qwen's vision encoder accepts."""


def _round_by(n: float, factor: int) -> int:
    return round(n / factor) * factor


def _ceil_by(n: float, factor: int) -> int:
    return math.ceil(n / factor) * factor


def _floor_by(n: float, factor: int) -> int:
    return math.floor(n / factor) * factor


def smart_resize(
    height: int,
    width: int,
    factor: int = 32,
    min_pixels: int = 4 * 32 * 32,
    max_pixels: int = 16384 * 32 * 32,
) -> tuple[int, int]:
    """(height, width) rounded to multiples of `factor`, with height * width in [min_pixels, max_pixels]
    and the aspect ratio kept as closely as possible."""
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if min_pixels > max_pixels:
        raise ValueError(f"min_pixels {min_pixels} > max_pixels {max_pixels}")
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_RATIO:
        raise ValueError(f"absolute aspect ratio must be smaller than {MAX_RATIO}, got {ratio}")
    h_bar = max(factor, _round_by(height, factor))
    w_bar = max(factor, _round_by(width, factor))
    if h_bar * w_bar > max_pixels:
        # Scale the original (not the rounded) size, and floor, so the result stays under the cap.
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = _floor_by(height / beta, factor)
        w_bar = _floor_by(width / beta, factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = _ceil_by(height * beta, factor)
        w_bar = _ceil_by(width * beta, factor)
    return h_bar, w_bar


def image_tokens(height: int, width: int, factor: int = 32) -> int:
    """LLM tokens of a `smart_resize`d image: one per factor x factor cell (a 2x2 merge of patches)."""
    return (height // factor) * (width // factor)


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) of an encoded image; Pillow reads only the header."""
    with Image.open(io.BytesIO(data)) as img:
        return img.size


def resize_image(data: bytes, width: int, height: int) -> bytes:
    """The image scaled to width x height as PNG (the input itself when it already has that size)."""
    with Image.open(io.BytesIO(data)) as img:
        if img.size == (width, height):
            return data
        # Bicubic as Qwen's processor resizes; RGB because the encoder takes three channels anyway.
        out = img.convert("RGB").resize((width, height), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    # the same pixels whatever the level; level 1 encodes a 1920x1088 screen in about half the time of the
    # default 6, for PNGs about 10 % larger
    out.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()
