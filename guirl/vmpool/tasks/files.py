"""Fetching task files from URLs, `file://` URLs and local paths, through a cache keyed by URL
(`<uuid5(url)>_<name>`, as OSWorld names them), so a file is downloaded once whatever task needs it."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from pathlib import Path
from urllib.parse import unquote, urlparse

import aiohttp


class FetchError(RuntimeError):
    """A file could not be fetched; the message names the URL."""


def cache_path(cache_dir: Path, url: str) -> Path:
    """Where `url`'s content is cached: keyed by the URL alone, so every task and getter shares it."""
    name = os.path.basename(unquote(urlparse(url).path)) or "file"
    return cache_dir / f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_{name}"


async def fetch(url: str, cache_dir: Path, *, attempts: int = 3, timeout_s: float = 300.0) -> Path:
    """The local path of `url`'s content (downloaded into the cache unless already there)."""
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        local = Path(unquote(parsed.path) if parsed.scheme == "file" else url).expanduser()
        if not local.is_file():
            raise FetchError(f"{url}: no such file")
        return local
    if parsed.scheme not in ("http", "https"):
        raise FetchError(f"{url}: unsupported URL scheme {parsed.scheme!r}")
    target = cache_path(cache_dir, url)
    key = (id(asyncio.get_running_loop()), str(target))
    async with _locks.setdefault(key, asyncio.Lock()):  # one download per URL at a time
        if target.is_file():
            return target
        cache_dir.mkdir(parents=True, exist_ok=True)
        return await _download(url, target, attempts, timeout_s)


_locks: dict[tuple[int, str], asyncio.Lock] = {}


async def _download(url: str, target: Path, attempts: int, timeout_s: float) -> Path:
    tmp = target.with_name(f"{target.name}.part-{uuid.uuid4().hex}")
    last: Exception | None = None
    for attempt in range(attempts):
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:
                async with http.get(url) as resp:
                    if resp.status != 200:
                        raise FetchError(f"{url}: HTTP {resp.status}")
                    with open(tmp, "wb") as f:
                        async for chunk in resp.content.iter_chunked(1 << 20):
                            f.write(chunk)
            os.replace(tmp, target)
            return target
        except (aiohttp.ClientError, TimeoutError, OSError, FetchError) as exc:
            last = exc
            tmp.unlink(missing_ok=True)
            if attempt + 1 < attempts:
                await asyncio.sleep(0.5 * (attempt + 1))
    raise FetchError(f"{url}: cannot be downloaded after {attempts} attempts: {last}")


def copy_into(source: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if source.resolve() != dest.resolve():
        shutil.copyfile(source, dest)
    return dest
