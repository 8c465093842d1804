"""PDFs and archives of files (OSWorld's metrics/pdf.py and chrome.py's compare_pdfs, compare_pdf_images,
compare_archive), read with PyMuPDF as the reference reads them, so the extracted text is the same.

Differences from OSWorld: a missing, unreadable or corrupt result scores 0.0 where the reference raises
(check_pdf_pages, compare_archive) or reads None as a new empty PDF (compare_pdfs, which so scores 1.0 when
the gold PDF has no text); archives are unpacked into a temporary directory (the reference unpacks next to
the archive and reuses a stale gold folder), with tar's "data" filter against paths outside it.
"""

from __future__ import annotations

import io
import operator
import os
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from PIL import Image
from rapidfuzz import fuzz

from guirl.vmpool.tasks.metrics import UnsupportedMetric
from guirl.vmpool.tasks.metrics.media_av import HASH_THRESHOLD, phash_distance

REQUIRES = ("pymupdf",)
"""Modules beyond guirl's own dependencies that this module's functions import (the `osworld` extra)."""


_RELATIONS = {"eq", "ne", "lt", "le", "gt", "ge"}

# compare_archive's `file_type` -> the metric (by OSWorld's name) each pair of members is scored with
_ARCHIVE_METRICS = {
    "text": "compare_text_file",
    "pdf": "compare_pdfs",
    "docx": "compare_docx_files",
    "ppt": "compare_pptx_files",
    "image": "compare_images",
    "csv": "compare_csv",
    "table": "compare_table",
    "audio": "compare_audios",
    "video": "compare_videos",
}


def _is_file(path: Any) -> bool:
    return isinstance(path, (str, os.PathLike)) and bool(path) and os.path.isfile(path)


def _open_pdf(path: Any) -> Any:
    """The PyMuPDF document, or None for a missing or unreadable file."""
    import pymupdf

    if not _is_file(path):
        return None
    try:
        return pymupdf.open(path, filetype="pdf")
    except Exception:  # noqa: BLE001  (any parse failure means the policy's file is unusable)
        return None


def _pdf_text(path: Any) -> str | None:
    doc = _open_pdf(path)
    if doc is None:
        return None
    with doc:
        try:
            return "".join(page.get_text() for page in doc).strip()
        except Exception:  # noqa: BLE001  (a page MuPDF cannot render: the file is damaged)
            return None


def compare_pdfs(result: Any, expected: Any, **options: Any) -> float:
    """The mean over file pairs of the fuzzy ratio (rapidfuzz `ratio` / 100) between the two PDFs' text,
    page texts joined and stripped. `result`/`expected` are paths or lists of paths (paired in order,
    divided by the number of gold files); a pair whose result is missing or unreadable counts 0."""
    if not isinstance(expected, list):
        result, expected = [result], [expected]
    if not isinstance(result, list) or not expected:
        return 0.0
    total = 0.0
    for pred, gold in zip(result, expected):
        pred_text, gold_text = _pdf_text(pred), _pdf_text(gold)
        if pred_text is None or gold_text is None:
            continue
        total += fuzz.ratio(pred_text, gold_text) / 100
    return total / len(expected)


def check_pdf_pages(result: Any, rules: Mapping[str, Any]) -> float:
    """1.0 when the PDF's page count satisfies `rules` (`relation`: eq/ne/lt/le/gt/ge, `ref_value`)."""
    relation = rules["relation"]
    if relation not in _RELATIONS:
        raise UnsupportedMetric(f"check_pdf_pages relation {relation!r} is not implemented")
    doc = _open_pdf(result)
    if doc is None:
        return 0.0
    with doc:
        return float(getattr(operator, relation)(doc.page_count, rules["ref_value"]))


def _pdf_images(path: Any) -> list[Image.Image] | None:
    """Every image XObject of every page, in page order, as stored (as the reference extracts them)."""
    doc = _open_pdf(path)
    if doc is None:
        return None
    images = []
    with doc:
        try:
            for page in doc:
                for info in page.get_images(full=True):
                    data = doc.extract_image(info[0])["image"]
                    try:
                        image = Image.open(io.BytesIO(data))
                        image.load()
                    except Exception:  # noqa: BLE001  (the reference skips an image Pillow cannot open)
                        continue
                    images.append(image)
        except Exception:  # noqa: BLE001  (a damaged page or image stream)
            return None
    return images


def compare_pdf_images(result: Any, expected: Any, **options: Any) -> float:
    """The fraction of the PDFs' embedded images (paired in order) whose perceptual hashes differ by at
    most 5 bits; 0.0 when the image counts differ, 1.0 when neither has an image."""
    pred, gold = _pdf_images(result), _pdf_images(expected)
    if pred is None or gold is None or len(pred) != len(gold):
        return 0.0
    if not pred:
        return 1.0
    same = sum(phash_distance(a, b) <= HASH_THRESHOLD for a, b in zip(pred, gold))
    return same / len(pred)


def _unpack(archive: str, into: Path) -> bool:
    """Unpack a zip or tar archive (by its content, not its name); False when it is neither or corrupt."""
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(into)  # zipfile drops absolute paths and `..` components
            return True
        if tarfile.is_tarfile(archive):
            with tarfile.open(archive) as tf:
                tf.extractall(into, filter="data")
            return True
    except (OSError, zipfile.BadZipFile, tarfile.TarError, EOFError, ValueError):
        return False
    return False


def compare_archive(result: Any, expected: Any, **options: Any) -> float:
    """The mean score of the archives' members, paired by sorted name, under the metric for `file_type`
    (default "text"); 0.0 when the member names (under the folder `file_path`) differ. Other options go to
    that metric."""
    options = dict(options)
    folder = options.pop("file_path", "")
    file_type = options.pop("file_type", "text")
    if file_type not in _ARCHIVE_METRICS:
        raise UnsupportedMetric(f"compare_archive file_type {file_type!r} is not implemented")
    if not _is_file(result):
        return 0.0
    from guirl.vmpool.tasks.metrics import get_metric  # the registry imports this module

    metric: Callable[..., float] = get_metric(_ARCHIVE_METRICS[file_type])
    with tempfile.TemporaryDirectory(prefix="guirl-archive-") as tmp:
        pred_root, gold_root = Path(tmp, "pred"), Path(tmp, "gold")
        if not _unpack(result, pred_root):
            return 0.0
        if not _unpack(expected, gold_root):
            raise ValueError(f"the gold archive {expected!r} is not a readable zip or tar archive")
        pred_dir, gold_dir = pred_root / folder, gold_root / folder
        if not pred_dir.is_dir():
            return 0.0
        pred_names, gold_names = sorted(os.listdir(pred_dir)), sorted(os.listdir(gold_dir))
        if pred_names != gold_names:
            return 0.0
        if not pred_names:  # two empty archives agree (the reference divides by zero)
            return 1.0
        total = sum(float(metric(str(pred_dir / n), str(gold_dir / n), **options)) for n in pred_names)
    return total / len(pred_names)


METRICS: dict[str, Callable[..., float]] = {
    "compare_pdfs": compare_pdfs,
    "check_pdf_pages": check_pdf_pages,
    "compare_pdf_images": compare_pdf_images,
    "compare_archive": compare_archive,
}
