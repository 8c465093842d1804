"""Getters that read inside a file from the VM: a slide's audio or background image, a spreadsheet's last
row, and the desktop's wallpaper (OSWorld's getters/impress.py, file.py get_content_from_vm_file,
info.py get_vm_wallpaper). Merged into info.py's `GETTERS`.

Differences from OSWorld: a deck, media file or spreadsheet the VM does not have, or that is corrupt, gives
None (the reference raises on a missing deck or workbook); a linked (not embedded) media file's `file://`
URL is percent-decoded before it is fetched (the reference fetches the encoded path, which does not exist
when the name has a space); a media part outside the deck's folders is not extracted.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse
from xml.etree import ElementTree as ET

from guirl.vmpool.client import VMClient, VMFatalError
from guirl.vmpool.tasks.getters.base import Getter, save
from guirl.vmpool.tasks.setup import TaskContext

_RELS = "{http://schemas.openxmlformats.org/package/2006/relationships}Relationship"
_BG_PR = "{http://schemas.openxmlformats.org/presentationml/2006/main}bgPr"
_BLIP = "{http://schemas.openxmlformats.org/drawingml/2006/main}blip"
_EMBED = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}embed"


async def _fetch(client: VMClient, ctx: TaskContext, path: str, dest: str) -> Path | None:
    """The VM's file copied to `cache_dir/dest`, or None when the VM has no such file."""
    data = await client.get_file(path)
    if data is None:
        return None
    local = save(ctx, dest, data)
    return local


def _slide_target(deck: Path, slide: int, kind: str, rel_id: str | None) -> str | None:
    """The target of slide `slide`'s (1-based) first relationship whose type mentions `kind` (and whose id
    is `rel_id`, if given)."""
    name = f"ppt/slides/_rels/slide{slide}.xml.rels"
    with zipfile.ZipFile(deck) as zf:
        if name not in zf.namelist():
            return None
        root = ET.fromstring(zf.read(name))
    for rel in root.iter(_RELS):
        if kind in rel.get("Type", "") and (rel_id is None or rel.get("Id") == rel_id):
            return rel.get("Target")
    return None


def _background_blip(deck: Path, slide: int) -> str | None:
    """The relationship id of the picture filling slide `slide`'s (1-based) own background, if any."""
    name = f"ppt/slides/slide{slide}.xml"
    with zipfile.ZipFile(deck) as zf:
        if name not in zf.namelist():
            return None
        root = ET.fromstring(zf.read(name))
    for bg in root.iter(_BG_PR):
        for blip in bg.iter(_BLIP):
            if _EMBED in blip.attrib:
                return blip.attrib[_EMBED]
    return None


async def _resolve(target: str | None, deck: Path, client: VMClient, ctx: TaskContext, dest: str) -> Any:
    """An embedded part (`../media/x`) extracted next to the deck as `ppt/media/x`, as the reference
    extracts it; a linked `file://` one fetched from the VM to `dest`."""
    if target is None:
        return None
    if target.startswith(".."):
        member = posixpath.normpath(posixpath.join("ppt/slides", target))
        if member.startswith(("..", "/")):
            return None
        try:
            with zipfile.ZipFile(deck) as zf:
                data = zf.read(member)
        except KeyError:  # the relationship names a part the deck lacks
            return None
        local = deck.parent / member
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(data)
        return str(local)
    if target.startswith("file://"):
        local = await _fetch(client, ctx, unquote(urlparse(target).path), dest)
        return None if local is None else str(local)
    return None


async def _slide_part(config: dict[str, Any], client: VMClient, ctx: TaskContext, kind: str) -> Any:
    ppt_path, slide = config["ppt_file_path"], int(config["slide_index"]) + 1
    deck = await _fetch(client, ctx, ppt_path, posixpath.basename(ppt_path))
    if deck is None:
        return None
    try:
        if kind == "audio":
            target = _slide_target(deck, slide, "audio", None)
        else:
            blip = _background_blip(deck, slide)
            target = None if blip is None else _slide_target(deck, slide, "image", blip)
    except (zipfile.BadZipFile, ET.ParseError):
        return None
    return await _resolve(target, deck, client, ctx, config["dest"])


async def audio_in_slide(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """The local path of the audio the deck `ppt_file_path` has on slide `slide_index` (0-based): the
    slide's first audio relationship, extracted from the deck or fetched from the VM to `dest`."""
    return await _slide_part(config, client, ctx, "audio")


async def background_image_in_slide(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """The local path of the picture filling the background of slide `slide_index` (0-based) of the deck
    `ppt_file_path`, extracted from the deck or fetched from the VM to `dest`; None without one."""
    return await _slide_part(config, client, ctx, "image")


def _last_row(path: Path) -> list[str] | None:
    import pandas as pd

    try:
        frame = pd.read_excel(path)
    except Exception:  # noqa: BLE001  (pandas and openpyxl raise many kinds on a file that is no workbook)
        return None
    if frame.empty:
        return None
    return frame.iloc[-1].astype(str).tolist()


async def content_from_vm_file(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """A piece of a VM file's content: for `file_type` "xlsx" and `file_content` "last_row", the first
    sheet's last row (header excluded) as pandas reads it, each cell as str."""
    from guirl.vmpool.tasks.getters import UnsupportedGetter  # the package imports this module

    kind, content = config.get("file_type"), config.get("file_content")
    if (kind, content) != ("xlsx", "last_row"):
        raise UnsupportedGetter(f"content_from_vm_file of {kind!r} / {content!r} is not implemented")
    path = config["path"]
    local = await _fetch(client, ctx, path, os.path.basename(path))
    if local is None:
        return None
    return await asyncio.to_thread(_last_row, local)


async def vm_wallpaper(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """The desktop's wallpaper image (POST /wallpaper) written to `cache_dir/dest`; an empty file when the
    VM has none to give (as the reference writes one)."""
    try:
        _, body, _ = await client._call("POST", "/wallpaper", idempotent=True)
    except VMFatalError:  # 4xx: no wallpaper file (a VM that does not answer raises VMTransientError)
        body = b""
    local = save(ctx, config["dest"], body)
    return str(local)


GETTERS: dict[str, Getter] = {
    "audio_in_slide": audio_in_slide,
    "background_image_in_slide": background_image_in_slide,
    "content_from_vm_file": content_from_vm_file,
    "vm_wallpaper": vm_wallpaper,
}
"""These getters, by OSWorld's names."""
