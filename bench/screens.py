"""Synthetic 1920×1080 screenshots for benchmarks: a plain desktop (≈ 50 KB PNG) and one with a
photo-like wallpaper (≈ 2.5 MB PNG), drawn with Pillow so no image file has to ship."""

from __future__ import annotations

import io
import random

from PIL import Image, ImageDraw, ImageFilter


def _png(img: Image.Image, level: int = 6) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=level)
    return buf.getvalue()


def _windows(img: Image.Image, rng: random.Random) -> None:
    d = ImageDraw.Draw(img)
    w, h = img.size
    d.rectangle([0, h - 40, w, h], fill=(30, 30, 36))  # task bar
    for i in range(8):
        d.rectangle([8 + i * 48, h - 34, 44 + i * 48, h - 6], fill=(70 + 20 * i, 90, 160))
    for k in range(3):
        x, y = rng.randrange(50, w - 900), rng.randrange(30, h - 600)
        ww, wh = rng.randrange(600, 880), rng.randrange(380, 560)
        d.rectangle([x, y, x + ww, y + wh], fill=(246, 246, 246), outline=(120, 120, 120))
        d.rectangle([x, y, x + ww, y + 30], fill=(60, 63, 70))
        d.text((x + 10, y + 8), f"Window {k + 1} - Document.txt", fill=(240, 240, 240))
        for line in range(wh // 22 - 2):
            words = " ".join(
                rng.choice(["alpha", "beta", "gamma", "delta", "menu", "file", "edit"])
                for _ in range(rng.randrange(3, 12))
            )
            d.text((x + 12, y + 40 + line * 20), words, fill=(20, 20, 20))


def plain_desktop(seed: int = 0) -> bytes:
    """A flat-coloured desktop with a task bar and three text windows."""
    rng = random.Random(seed)
    img = Image.new("RGB", (1920, 1080), (46, 84, 128))
    d = ImageDraw.Draw(img)
    for i in range(18):  # desktop icons with labels
        x, y = 1810 - (i // 6) * 100, 30 + (i % 6) * 110
        d.rounded_rectangle([x, y, x + 56, y + 56], 8, fill=(rng.randrange(256), rng.randrange(256), 200))
        d.text((x - 8, y + 62), f"report_{i:02d}.odt", fill=(255, 255, 255))
    _windows(img, rng)
    return _png(img)


def photo_desktop(seed: int = 0) -> bytes:
    """The same desktop over a noisy photographic wallpaper (PNG compresses it badly, as with real photos)."""
    rng = random.Random(seed)
    base = Image.radial_gradient("L").resize((1920, 1080)).convert("RGB")
    noise = Image.merge("RGB", [Image.effect_noise((1920, 1080), 40 + 10 * c) for c in range(3)])
    img = Image.blend(base, noise.filter(ImageFilter.GaussianBlur(0.9)), 0.6)
    _windows(img, rng)
    return _png(img)
