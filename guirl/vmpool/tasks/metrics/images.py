"""Images and GIMP: two pictures compared by structure (SSIM, MSE) after an edit: brightness, saturation,
contrast, a palette, a mirror, a resize, an export (OSWorld's metrics/gimp.py, and `compare_images` from
metrics/vlc.py). The single-picture checks and GIMP's settings are in `images_gimp.py`.

OSWorld defines these scores with scikit-image's SSIM (`structural_similarity`, 7x7 uniform window, data
range 255 for 8-bit pictures), so guirl calls the same function rather than a look-alike that would move
the 0.9 / 0.65 / 0.99 thresholds by rounding. Differences from OSWorld, on purpose (each is listed in
tests/integration/test_parity_images.py): a missing, empty or unreadable picture scores 0.0 where OSWorld
raises; `compare_image_list` compares every band (OSWorld's `getbbox()` on an RGBA difference looks only at
alpha, so two opaque pictures of different colours count as equal) and scores lists of unequal length 0.0;
`compare_images` scores pictures under 7 pixels wide or high 0.0 (scikit-image raises) and never returns a
negative SSIM; a black picture in `check_brightness_decrease_and_structure_sim` scores 0.0 (OSWorld
divides by its zero brightness), and a 16-bit grey one is scored (OSWorld's `Image.point` raises on it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image, ImageStat

from guirl.vmpool.tasks.metrics import images_gimp
from guirl.vmpool.tasks.metrics.images_gimp import open_image

REQUIRES = ("skimage",)
"""Modules beyond guirl's own dependencies that this module's functions import (the `osworld` extra)."""

SSIM_WINDOW = 7
"""OSWorld's SSIM window (scikit-image's default); smaller pictures are never "the same structure"."""


def _ssim(first: np.ndarray, second: np.ndarray, **kwargs: Any) -> float:
    # imported here: scikit-image is in guirl's `osworld` extra, and it costs ~0.7 s to import
    from skimage.metrics import structural_similarity

    return float(structural_similarity(first, second, win_size=SSIM_WINDOW, **kwargs))


def same_structure(first: Image.Image, second: Image.Image, threshold: float = 0.9) -> bool:
    """OSWorld's `structure_check_by_ssim`: both pictures as RGB, of one size, with SSIM >= `threshold`."""
    if min(first.size + second.size) < SSIM_WINDOW or first.size != second.size:
        return False
    # RGBA -> RGB drops alpha without compositing, as OSWorld's conversion does
    a, b = np.asarray(first.convert("RGB")), np.asarray(second.convert("RGB"))
    return _ssim(a, b, channel_axis=2) >= threshold


def same_structure_by_mse(first: Image.Image, second: Image.Image, threshold: float) -> bool:
    """OSWorld's `structure_check_by_mse`: `first` resized to `second` (Lanczos), both RGB scaled to [0, 1],
    mean squared difference below `threshold` (computed in float32, as OSWorld does)."""
    if first.size != second.size:
        first = first.resize(second.size, Image.Resampling.LANCZOS)
    a = np.asarray(first.convert("RGB"), dtype=np.float32) / 255
    b = np.asarray(second.convert("RGB"), dtype=np.float32) / 255
    return bool(np.mean((a - b) ** 2) < threshold)


def _brightness(image: Image.Image) -> float:
    return ImageStat.Stat(image.convert("L")).mean[0]


def _with_brightness(image: Image.Image, target: float) -> Image.Image:
    """Every band scaled so the grey mean becomes `target` (truncated to int, clipped to 0..255)."""
    factor = target / _brightness(image)
    if image.mode in ("I", "F") or image.mode.startswith("I;"):
        # Pillow maps only 8-bit bands through a function (OSWorld raises on a 16-bit grey PNG); the MSE
        # that follows compares RGB anyway
        image = image.convert("RGB")
    return image.point(lambda x: min(255, max(0, int(x * factor))))


def compare_images(result: Any, expected: Any, **options: Any) -> float:
    """SSIM of the two pictures in grey, both resized (Lanczos) to the size with the smaller width (the
    smaller (width, height) tuple, as OSWorld takes `min` of the sizes). With `reference_base_result` b,
    the gain over b: (SSIM - b) / (1 - b) when SSIM >= b + 0.01, else 0."""
    first, second = open_image(result), open_image(expected)
    if first is None or second is None:
        return 0.0
    size = min(first.size, second.size)
    if min(size) < SSIM_WINDOW:
        return 0.0
    a = np.asarray(first.convert("L").resize(size, Image.Resampling.LANCZOS))
    b = np.asarray(second.convert("L").resize(size, Image.Resampling.LANCZOS))
    similarity = _ssim(a, b)
    base = options.get("reference_base_result")
    if base is None:
        return max(0.0, similarity)
    return (similarity - base) / (1 - base) if similarity >= base + 0.01 else 0.0


def compare_image_list(result: Any, expected: Any) -> float:
    """1.0 when each picture equals its gold one pixel for pixel, after resizing it to the gold's size
    (Lanczos) and converting it to the gold's mode; a single path is a list of one."""
    if not isinstance(result, list):
        result, expected = [result], [expected]
    if not isinstance(expected, list) or len(result) != len(expected):
        return 0.0
    for path, gold_path in zip(result, expected, strict=True):
        picture, gold = open_image(path), open_image(gold_path)
        if picture is None or gold is None:
            return 0.0
        if picture.size != gold.size:
            picture = picture.resize(gold.size, Image.Resampling.LANCZOS)
        if picture.mode != gold.mode:
            picture = picture.convert(gold.mode)
        if not np.array_equal(np.asarray(picture), np.asarray(gold)):
            return 0.0
    return 1.0


def check_structure_sim(result: Any, expected: Any) -> float:
    """1.0 when the pictures have the same size and the same structure (SSIM >= 0.9)."""
    picture, gold = open_image(result), open_image(expected)
    if picture is None or gold is None or picture.size != gold.size:
        return 0.0
    return 1.0 if same_structure(picture, gold) else 0.0


def check_structure_sim_resized(result: Any, expected: Any) -> float:
    """1.0 when the picture, cropped to its opaque area if it has transparency and resized (Pillow's default
    filter) to the gold's size, has the gold's structure (SSIM >= 0.9)."""
    picture, gold = open_image(result), open_image(expected)
    if picture is None or gold is None:
        return 0.0
    if picture.mode in ("RGBA", "LA") or "transparency" in picture.info:
        picture = picture.convert("RGBA")
        box = picture.getchannel("A").getbbox()
        if box is None:  # wholly transparent
            return 0.0
        picture = picture.crop(box).convert("RGB")
    return 1.0 if same_structure(picture.resize(gold.size), gold.convert("RGB")) else 0.0


def check_brightness_decrease_and_structure_sim(result: Any, expected: Any, threshold: float = 0.03) -> float:
    """1.0 when `result` is darker (grey mean) than `expected` and, both scaled to a grey mean of 128, their
    mean squared difference is below `threshold`."""
    picture, original = open_image(result), open_image(expected)
    if picture is None or original is None:
        return 0.0
    darker, brighter = _brightness(picture), _brightness(original)
    if darker == 0 or brighter == 0:  # a black picture has no structure to compare
        return 0.0
    same = same_structure_by_mse(_with_brightness(picture, 128), _with_brightness(original, 128), threshold)
    return 1.0 if brighter > darker and same else 0.0


def check_saturation_increase_and_structure_sim(result: Any, expected: Any) -> float:
    """1.0 when `result` is more saturated (mean HSV saturation) than `expected` while its hue and value
    bands each keep the structure (SSIM >= 0.9)."""
    picture, original = open_image(result), open_image(expected)
    if picture is None or original is None:
        return 0.0
    h1, s1, v1 = picture.convert("HSV").split()
    h2, s2, v2 = original.convert("HSV").split()
    more_saturated = np.mean(np.asarray(s2)) < np.mean(np.asarray(s1))
    return 1.0 if more_saturated and same_structure(h1, h2) and same_structure(v1, v2) else 0.0


def _contrast(image: Image.Image) -> float:
    """Standard deviation over every band's values (alpha included), in float32 as OSWorld computes it."""
    return float(np.std(np.asarray(image, dtype=np.float32)))


def check_contrast_increase_and_structure_sim(result: Any, expected: Any) -> float:
    """1.0 when `result` has more contrast (standard deviation of its values) than `expected` and a similar
    structure (SSIM >= 0.65)."""
    picture, original = open_image(result), open_image(expected)
    if picture is None or original is None:
        return 0.0
    more_contrast = _contrast(original) < _contrast(picture)
    return 1.0 if more_contrast and same_structure(picture, original, threshold=0.65) else 0.0


def check_file_exists_and_structure_sim(result: Any, expected: Any) -> float:
    """1.0 when the exported file exists and has the original's size and structure (SSIM >= 0.9)."""
    if not result or not isinstance(result, (str, os.PathLike)) or not os.path.isfile(result):
        return 0.0
    picture, original = open_image(result), open_image(expected)
    if picture is None or original is None:
        return 0.0
    return 1.0 if same_structure(picture, original) else 0.0


def check_palette_and_structure_sim(result: Any, expected: Any) -> float:
    """1.0 when `result` is an indexed (palette, mode P) picture with the original's structure
    (SSIM >= 0.9)."""
    picture, original = open_image(result), open_image(expected)
    if picture is None or original is None:
        return 0.0
    return 1.0 if picture.mode == "P" and same_structure(picture.convert("RGB"), original) else 0.0


def check_image_mirror(result: Any, expected: Any) -> float:
    """1.0 when `result` flipped left-right has `expected`'s structure (SSIM >= 0.99: GIMP's flip is exact,
    up to re-encoding)."""
    picture, original = open_image(result), open_image(expected)
    if picture is None or original is None:
        return 0.0
    mirrored = picture.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return 1.0 if same_structure(mirrored, original, threshold=0.99) else 0.0


METRICS: dict[str, Callable[..., float]] = {
    "compare_images": compare_images,
    "compare_image_list": compare_image_list,
    "check_structure_sim": check_structure_sim,
    "check_structure_sim_resized": check_structure_sim_resized,
    "check_brightness_decrease_and_structure_sim": check_brightness_decrease_and_structure_sim,
    "check_saturation_increase_and_structure_sim": check_saturation_increase_and_structure_sim,
    "check_contrast_increase_and_structure_sim": check_contrast_increase_and_structure_sim,
    "check_file_exists_and_structure_sim": check_file_exists_and_structure_sim,
    "check_palette_and_structure_sim": check_palette_and_structure_sim,
    "check_image_mirror": check_image_mirror,
    **images_gimp.METRICS,
}
"""This family's metrics, by OSWorld's names."""
