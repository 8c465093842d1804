"""Audio and video comparisons (OSWorld's metrics/vlc.py compare_audios and compare_videos) and the
perceptual hash that compare_videos and compare_pdf_images share.

compare_audios follows the reference's definition: both files decoded to mono float32 at 22050 Hz
(libsndfile, then soxr's high-quality resampler, as librosa.load does), 20 MFCCs per 2048-sample frame
(librosa's defaults: Hann window, hop 512, 128 Slaney mel bands, power in dB with an 80 dB floor, DCT-II),
each coefficient scaled to a peak of 1 over the file, aligned with FastDTW (radius 1) under cosine distance,
and scored exp(-distance / path length). It is computed here with numpy/scipy/soxr instead of librosa and
fastdtw; the scores agree to floating-point rounding (tests/integration/test_parity_media.py).

compare_videos reads frames with OpenCV as the reference does (so rotation metadata and colour conversion
are the same), and hashes them with the same DCT perceptual hash as imagehash.phash.

Differences from OSWorld: a missing or undecodable result scores 0.0 (the reference scores two undecodable
audio files 1.0, and two unopenable videos 1.0).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
from PIL import Image

REQUIRES = ("cv2", "scipy", "soundfile", "soxr")
"""Modules beyond guirl's own dependencies that this module's functions import (the `osworld` extra)."""

HASH_THRESHOLD = 5
"""Perceptual hashes differing by at most this many bits are the same picture (OSWorld's threshold)."""

_SR = 22050
_N_FFT = 2048
_HOP = 512
_N_MELS = 128
_N_MFCC = 20
_AMIN = 1e-10
_TOP_DB = 80.0


def phash(image: Image.Image) -> np.ndarray:
    """imagehash.phash's 64 bits: the 8x8 lowest frequencies of a 32x32 greyscale DCT against their median."""
    import scipy.fftpack

    pixels = np.asarray(image.convert("L").resize((32, 32), Image.Resampling.LANCZOS))
    dct = scipy.fftpack.dct(scipy.fftpack.dct(pixels, axis=0), axis=1)
    low = dct[:8, :8]
    return low > np.median(low)


def phash_distance(a: Image.Image, b: Image.Image) -> int:
    """How many of the two images' perceptual-hash bits differ."""
    return int(np.count_nonzero(phash(a) != phash(b)))


# -- audio ---------------------------------------------------------------------------------------------


def _load(path: Any) -> np.ndarray | None:
    """Mono float32 samples at 22050 Hz, or None when the file is missing or cannot be decoded."""
    import soundfile
    import soxr

    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        return None
    try:
        data, sr = soundfile.read(path, dtype="float32", always_2d=False)
    except Exception:  # noqa: BLE001  (libsndfile's errors: not audio, or a codec it lacks)
        return None
    y = data.T
    if y.ndim > 1:
        y = np.mean(y, axis=tuple(range(y.ndim - 1)))
    if y.shape[-1] == 0:
        return y
    if sr != _SR:
        n = int(np.ceil(y.shape[-1] * _SR / sr))
        y = np.asarray(soxr.resample(y, sr, _SR, quality="soxr_hq"), dtype=np.float32)
        y = y[:n] if y.shape[-1] >= n else np.pad(y, (0, n - y.shape[-1]))
    return y


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    # Slaney's mel scale: linear below 1 kHz, logarithmic above
    f = np.asanyarray(f, dtype=float)
    mels = f / (200.0 / 3)
    log_t = f >= 1000.0
    mels[log_t] = 15.0 + np.log(f[log_t] / 1000.0) / (np.log(6.4) / 27.0)
    return mels


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    freqs = (200.0 / 3) * mels
    log_t = mels >= 15.0
    freqs[log_t] = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mels[log_t] - 15.0))
    return freqs


def _mel_basis() -> np.ndarray:
    """Slaney-normalised triangular mel filters, float32, (128, 1025)."""
    fftfreqs = np.fft.rfftfreq(n=_N_FFT, d=1.0 / _SR)
    edges = _hz_to_mel(np.array([0.0, _SR / 2.0]))
    mel_f = _mel_to_hz(np.linspace(edges[0], edges[1], _N_MELS + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    weights = np.zeros((_N_MELS, fftfreqs.size), dtype=np.float32)
    for i in range(_N_MELS):
        weights[i] = np.maximum(0, np.minimum(-ramps[i] / fdiff[i], ramps[i + 2] / fdiff[i + 1]))
    weights *= (2.0 / (mel_f[2 : _N_MELS + 2] - mel_f[:_N_MELS]))[:, np.newaxis]
    return weights


def mfcc(y: np.ndarray) -> np.ndarray:
    """librosa.feature.mfcc(y=y, sr=22050) with its defaults: (20, frames)."""
    import scipy.fft
    import scipy.signal

    window = scipy.signal.get_window("hann", _N_FFT, fftbins=True)
    padded = np.pad(y, _N_FFT // 2, mode="constant")
    frames = np.lib.stride_tricks.sliding_window_view(padded, _N_FFT)[::_HOP]
    spectrum = np.fft.rfft(frames * window, axis=-1).astype(np.complex64).T
    power = np.abs(spectrum) ** 2
    mel = _mel_basis() @ power
    db = 10.0 * np.log10(np.maximum(_AMIN, mel))
    db = np.maximum(db, db.max() - _TOP_DB)
    return scipy.fft.dct(db, axis=-2, type=2, norm="ortho")[:_N_MFCC]


def _normalize_rows(m: np.ndarray) -> np.ndarray:
    """Each row divided by its peak magnitude (rows that are all ~0 are left as they are)."""
    peak = np.max(np.abs(m).astype(float), axis=1, keepdims=True)
    peak[peak < np.finfo(m.dtype).tiny] = 1.0
    return m / peak


def _cosine(x: np.ndarray, y: np.ndarray, ii: np.ndarray, jj: np.ndarray) -> np.ndarray:
    """scipy's cosine distance between rows x[ii] and y[jj], clipped to [0, 2] as scipy clips it."""
    u, v = x[ii], y[jj]
    uv = np.einsum("ij,ij->i", u, v)
    uu = np.einsum("ij,ij->i", u, u)
    vv = np.einsum("ij,ij->i", v, v)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.clip(1.0 - uv / np.sqrt(uu * vv), 0.0, 2.0)


def _dtw(x: np.ndarray, y: np.ndarray, window: list[tuple[int, int]]) -> tuple[float, list[tuple[int, int]]]:
    """Dynamic time warping restricted to `window` (cells in row order), with fastdtw's tie-breaking:
    the first of (up, left, diagonal) with the least cost."""
    cells = np.asarray(window, dtype=np.intp).reshape(-1, 2)
    dists = _cosine(x, y, cells[:, 0], cells[:, 1]).tolist()
    inf = (math.inf, 0, 0)
    cost: dict[tuple[int, int], tuple[float, int, int]] = {(0, 0): (0.0, 0, 0)}
    get = cost.get
    for (i, j), dt in zip(window, dists):
        i, j = i + 1, j + 1
        best = (get((i - 1, j), inf)[0] + dt, i - 1, j)
        left = get((i, j - 1), inf)[0] + dt
        if left < best[0]:
            best = (left, i, j - 1)
        diag = get((i - 1, j - 1), inf)[0] + dt
        if diag < best[0]:
            best = (diag, i - 1, j - 1)
        cost[i, j] = best
    path = []
    i, j = len(x), len(y)
    while not (i == j == 0):
        path.append((i - 1, j - 1))
        _, i, j = cost[i, j]
    path.reverse()
    return cost[len(x), len(y)][0], path


def _expand_window(path: list[tuple[int, int]], len_x: int, len_y: int, radius: int) -> list[tuple[int, int]]:
    """FastDTW's projection of a coarse path onto the finer grid, widened by `radius`."""
    near = {
        (i + a, j + b)
        for i, j in path
        for a in range(-radius, radius + 1)
        for b in range(-radius, radius + 1)
    }
    fine = {(2 * i + a, 2 * j + b) for i, j in near for a in (0, 1) for b in (0, 1)}
    window = []
    start_j = 0
    for i in range(len_x):
        new_start = None
        for j in range(start_j, len_y):
            if (i, j) in fine:
                window.append((i, j))
                if new_start is None:
                    new_start = j
            elif new_start is not None:
                break
        if new_start is not None:  # (fastdtw itself fails on a row without cells; a path never leaves one)
            start_j = new_start
    return window


def _halve(x: np.ndarray) -> np.ndarray:
    """Means of consecutive pairs of rows (an odd last row is dropped), as fastdtw coarsens a series."""
    n = len(x) - len(x) % 2
    return (x[0:n:2] + x[1:n:2]) / 2


def fastdtw(x: np.ndarray, y: np.ndarray, radius: int = 1) -> tuple[float, list[tuple[int, int]]]:
    """Salvador & Chan's FastDTW (as the `fastdtw` package computes it) under cosine distance."""
    if len(x) < radius + 2 or len(y) < radius + 2:
        return _dtw(x, y, [(i, j) for i in range(len(x)) for j in range(len(y))])
    _, path = fastdtw(_halve(x), _halve(y), radius)
    return _dtw(x, y, _expand_window(path, len(x), len(y), radius))


def compare_audios(result: Any, expected: Any, **options: Any) -> float:
    """exp(-d), where d is the FastDTW cosine distance per path step between the two files' peak-normalised
    MFCC sequences: 1.0 for the same sound, falling towards 0 as they differ (see the module docstring).
    Two silent-but-empty files score 1.0, one empty and one not 0.0, as in the reference."""
    y1 = _load(result)
    if y1 is None:
        return 0.0
    y2 = _load(expected)
    if y2 is None:
        raise ValueError(f"the gold audio {expected!r} cannot be decoded")
    if y1.shape[0] == 0 or y2.shape[0] == 0:
        return float(y1.shape[0] == y2.shape[0])
    m1 = _normalize_rows(mfcc(y1)).T.astype(float)
    m2 = _normalize_rows(mfcc(y2)).T.astype(float)
    distance, path = fastdtw(m1, m2)
    return float(np.exp(-distance / len(path)))


# -- video ---------------------------------------------------------------------------------------------


def compare_videos(
    result: Any, expected: Any, max_frames_to_check: int = 100, threshold: int = 5, **options: Any
) -> float:
    """1.0 when the first `max_frames_to_check` frames of the two videos match (at most `threshold`
    frames whose perceptual hashes differ by more than `threshold` bits) and, if either ends within them,
    both end at the same frame; else 0.0."""
    import cv2

    if not isinstance(result, (str, os.PathLike)) or not os.path.isfile(result):
        return 0.0
    cap1, cap2 = cv2.VideoCapture(str(result)), cv2.VideoCapture(str(expected))
    if not cap1.isOpened():
        return 0.0
    try:
        mismatches = 0
        for _ in range(max_frames_to_check):
            ok1, frame1 = cap1.read()
            ok2, frame2 = cap2.read()
            if not ok1 or not ok2:
                return float(ok1 == ok2)
            image1 = Image.fromarray(cv2.cvtColor(frame1, cv2.COLOR_BGR2RGB))
            image2 = Image.fromarray(cv2.cvtColor(frame2, cv2.COLOR_BGR2RGB))
            if phash_distance(image1, image2) > threshold:
                mismatches += 1
                if mismatches > threshold:
                    return 0.0
        return 1.0
    finally:
        cap1.release()
        cap2.release()
