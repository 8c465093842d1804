"""Where rows come from: a file, or `synth:<split>:<rows>:<seed>` — synthetic screens made on first use.

A `synth:` source is generated once into guirl's cache
(`~/.cache/guirl/synth/<split>-<rows>-<seed>-<code hash>/rows.jsonl`; the
hash of the generator's source: a changed generator makes fresh rows, never stale ones) by the process that
first asks for it — the launcher, before any actor starts — and written to a temporary directory renamed
into place, so a reader never sees half of it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from guirl.errors import InputError
from guirl.fileio import cache_dir

MAX_SYNTH_ROWS = 1_000_000


def resolve_rows(spec: str, *, cache: Path | None = None) -> Path:
    """The rows file of `spec`: a path as it is, or the generated file of a `synth:` source."""
    if not spec.startswith("synth:"):
        return Path(spec)
    parts = spec.split(":")
    if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
        raise InputError(
            f"{spec!r}: a synthetic source is synth:<split>:<rows>:<seed>, e.g. synth:train:256:0"
        )
    from guirl.data import synth

    split, n, seed = parts[1], int(parts[2]), int(parts[3])
    if split not in synth.SPLITS:
        raise InputError(f"{spec!r}: split {split!r} is not one of {list(synth.SPLITS)}")
    if not 1 <= n <= MAX_SYNTH_ROWS:
        raise InputError(f"{spec!r}: between 1 and {MAX_SYNTH_ROWS} rows")
    code = hashlib.sha256(Path(synth.__file__).read_bytes()).hexdigest()[:10]
    cache = cache if cache is not None else cache_dir("synth")
    folder = cache / f"{split}-{n}-{seed}-{code}"
    rows = folder / "rows.jsonl"
    if not rows.is_file():
        from guirl.data.rows import write_rows_jsonl

        tmp = cache / f".{folder.name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write_rows_jsonl(synth.synthesize(n, seed=seed, split=split), tmp / "rows.jsonl")
        try:
            os.replace(tmp, folder)
        except OSError:  # another process made it first: theirs is the same
            shutil.rmtree(tmp, ignore_errors=True)
    return rows
