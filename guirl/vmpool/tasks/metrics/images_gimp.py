"""One image checked alone, and GIMP's settings files: a triangle's position, a text box's side, a green
background, an image's pixel and file size, a gimprc/sessionrc entry (OSWorld's metrics/gimp.py).

`images.py` holds the comparisons of two images by structure (SSIM, MSE) and imports `open_image` from here.
Differences from OSWorld, on purpose (each is listed in tests/integration/test_parity_images.py):
- a missing, empty or unreadable file scores 0.0 where OSWorld raises;
- `check_triangle_position` takes the triangle to be the second most common colour, as OSWorld's comment
  says it does (its code sorts the counts ascending and so picks the second least common colour: the
  background itself in a two-colour picture, one anti-aliasing shade in GIMP's usual output);
- `check_green_background` indexes pixels as (row, column), so it checks every pixel of a picture of any
  shape (OSWorld's (x, y) indexing raises on every picture that is not square);
- `check_image_size` crops to the opaque area only when `ignore_transparent` is set (OSWorld's
  `a and b or c` also crops any picture with a transparency key when it is not);
- `check_config_status` skips blank lines of spaces (OSWorld raises IndexError on them).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image


def open_image(path: Any) -> Image.Image | None:
    """The decoded image at `path` (its first frame), or None when there is none: no path, no such file,
    an empty file, or bytes Pillow cannot decode (which the policy may well have produced)."""
    if not path or not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        return None
    try:
        with Image.open(path) as image:
            image.load()
            return image.copy()
    except Exception:  # Pillow raises OSError, SyntaxError, ValueError, EOFError ... on a corrupt file
        return None


def check_triangle_position(result: Any) -> float:
    """1.0 when the triangle (the second most common colour; the most common is the background) has its
    centroid within 5% of the picture's height and width of the picture's centre."""
    image = open_image(result)
    if image is None:
        return 0.0
    pixels = np.asarray(image)
    if pixels.ndim == 2:  # one band (L, P): a colour is one value
        pixels = pixels[..., None]
    colours, counts = np.unique(pixels.reshape(-1, pixels.shape[2]), axis=0, return_counts=True)
    if len(colours) < 2:
        return 0.0
    triangle = colours[np.argsort(-counts, kind="stable")[1]]
    centroid = np.argwhere(np.all(pixels == triangle, axis=2)).mean(axis=0)
    shape = np.array(pixels.shape[:2])
    return 1.0 if bool(np.all(np.abs(centroid - shape / 2) < 0.05 * shape)) else 0.0


def check_image_size(result: Any, rule: dict[str, Any]) -> float:
    """1.0 when the picture's height and width equal `rule["height"]` / `rule["width"]` (each checked only
    when given); with `ignore_transparent`, the size of the bounding box of its non-transparent pixels."""
    image = open_image(result)
    if image is None:
        return 0.0
    width, height = image.size
    if rule.get("ignore_transparent", False) and (
        image.mode in ("RGBA", "LA") or "transparency" in image.info
    ):
        box = image.convert("RGBA").getchannel("A").getbbox()
        width, height = (0, 0) if box is None else (box[2] - box[0], box[3] - box[1])
    if rule.get("height") is not None and height != rule["height"]:
        return 0.0
    if rule.get("width") is not None and width != rule["width"]:
        return 0.0
    return 1.0


def check_green_background(result: Any, expected: Any) -> float:
    """1.0 when every pixel that is not black (RGB 0, 0, 0) in the original (`expected`) is green in the
    edited picture (`result`): its green above both its red and its blue."""
    edited, original = open_image(result), open_image(expected)
    if edited is None or original is None or edited.size != original.size:
        return 0.0
    # RGBA -> RGB drops the alpha band without compositing: OSWorld reads the first three bands
    rgb = np.asarray(edited.convert("RGB"))
    background = np.any(np.asarray(original.convert("RGB")) != 0, axis=2)
    red, green, blue = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    green_enough = (green > red) & (green > blue)
    return 1.0 if bool(np.all(green_enough[background])) else 0.0


def check_image_file_size(result: Any, rule: dict[str, Any]) -> float:
    """1.0 when the file is smaller than `rule["max_size"]` bytes."""
    if not result or not isinstance(result, (str, os.PathLike)) or not os.path.isfile(result):
        return 0.0
    return 1.0 if os.path.getsize(result) < rule["max_size"] else 0.0


def check_textbox_on_leftside(result: Any) -> float:
    """1.0 when the leftmost dark pixel (grey below 128: the text) lies in the left 5% of the picture."""
    image = open_image(result)
    if image is None:
        return 0.0
    width = image.size[0]
    dark_columns = np.flatnonzero((np.asarray(image.convert("L")) < 128).any(axis=0))
    leftmost = int(dark_columns[0]) if dark_columns.size else width
    return 1.0 if leftmost < width * 0.05 else 0.0


def check_config_status(result: Any, rule: dict[str, Any]) -> float:
    """1.0 when a line of GIMP's settings file (gimprc, sessionrc: `(key value)` S-expressions, one per line,
    nested ones indented) has `rule["key"]` as its first word and `rule["value"]` as its last; a key of two
    words ([outer, inner]) must be the line's first two words."""
    if not result or not isinstance(result, (str, os.PathLike)) or not os.path.isfile(result):
        return 0.0
    key, value = rule["key"], rule["value"]
    with open(result, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    for line in lines:
        if line.startswith("#"):
            continue
        words = line.strip().lstrip("(").rstrip(")\n").split()
        if not words or words[-1] != value:
            continue
        if isinstance(key, str) and words[0] == key:
            return 1.0
        if isinstance(key, list) and len(key) == 2 and words[:2] == key:
            return 1.0
    return 0.0


METRICS: dict[str, Callable[..., float]] = {
    "check_triangle_position": check_triangle_position,
    "check_image_size": check_image_size,
    "check_green_background": check_green_background,
    "check_image_file_size": check_image_file_size,
    "check_textbox_on_leftside": check_textbox_on_leftside,
    "check_config_status": check_config_status,
}
"""The single-image and settings checks, by OSWorld's names (merged into `images.METRICS`)."""
