"""smart_resize against sizes worked out by hand, and the PNG helpers around it."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from guirl.agent.imaging import image_size, image_tokens, resize_image, smart_resize

MIN, MAX = 3136, 1920 * 1080  # AgentConfig's defaults


def _png(width: int, height: int, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (10, 120, 200)).save(buf, format=fmt)
    return buf.getvalue()


def test_full_hd_under_the_default_cap():
    # round: 1080/32 = 33.75 -> 34 -> 1088; 1920/32 = 60 -> 1920. 1088 * 1920 = 2,088,960 > 2,073,600, so
    # scale down: beta = sqrt(1920*1080 / 2,073,600) = 1, floor(1080/32) = 33 -> 1056, floor(60) -> 1920.
    assert smart_resize(1080, 1920, 32, MIN, MAX) == (1056, 1920)
    assert image_tokens(1056, 1920, 32) == 33 * 60


def test_full_hd_with_qwens_default_cap():
    # Qwen's default cap (16384 tokens) leaves room: just the rounding, 1080 -> 1088.
    assert smart_resize(1080, 1920) == (1088, 1920)
    assert image_tokens(1088, 1920) == 34 * 60


def test_square():
    # 1000/32 = 31.25 -> 31 -> 992; 992^2 = 984,064 is within bounds.
    assert smart_resize(1000, 1000, 32, MIN, MAX) == (992, 992)


def test_tiny_images_scale_up_to_min_pixels():
    # 10x10: round gives 0 -> max(32, 0) = 32; 32*32 = 1024 < 3136, so beta = sqrt(3136/100) = 5.6,
    # ceil(56/32) = 2 -> 64 on both sides.
    assert smart_resize(10, 10, 32, MIN, MAX) == (64, 64)
    # 28x10: 32x32 = 1024 < 3136; beta = sqrt(3136/280) = 3.347:
    # ceil(93.7/32) = 3 -> 96, ceil(33.5/32) = 2 -> 64.
    assert smart_resize(28, 10, 32, MIN, MAX) == (96, 64)


def test_huge_images_scale_down_under_max_pixels():
    # 6000x8000: beta = sqrt(48e6 / 2,073,600) = 4.811; 6000/4.811 = 1247.1 -> floor to 38*32 = 1216,
    # 8000/4.811 = 1662.8 -> 51*32 = 1632. 1216 * 1632 = 1,984,512 <= 2,073,600.
    h, w = smart_resize(6000, 8000, 32, MIN, MAX)
    assert (h, w) == (1216, 1632)
    assert h * w <= MAX


@pytest.mark.parametrize("size", [(1080, 1920), (777, 1333), (31, 4000), (5000, 5000), (33, 33)])
def test_results_are_multiples_of_the_factor_within_bounds(size):
    h, w = smart_resize(*size, 32, MIN, MAX)
    assert h % 32 == 0 and w % 32 == 0
    assert MIN <= h * w <= MAX


def test_aspect_ratio_limit():
    assert smart_resize(10, 2000, 32, MIN, MAX) == (32, 1984)  # exactly 200:1 is allowed
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 2010, 32, MIN, MAX)
    with pytest.raises(ValueError):
        smart_resize(0, 100)


def test_resize_image_and_image_size():
    png = _png(320, 200)
    assert image_size(png) == (320, 200)
    assert resize_image(png, 320, 200) is png  # already that size: untouched
    out = resize_image(png, 160, 96)
    assert out.startswith(b"\x89PNG") and image_size(out) == (160, 96)
    jpeg = _png(64, 48, "JPEG")
    assert image_size(jpeg) == (64, 48)
    assert image_size(resize_image(jpeg, 32, 32)) == (32, 32)
