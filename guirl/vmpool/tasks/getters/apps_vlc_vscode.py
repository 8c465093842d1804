"""VLC's and VS Code's getters (OSWorld's getters/vlc.py, vscode.py); merged into apps.py's `GETTERS`.

Everything runs through the VM's own routes (`/execute`, `/file`): guirl's local VMs have no network a
getter could reach VLC's HTTP interface over, so `vlc_playing_info` asks it from inside the VM.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from collections import Counter
from typing import Any

from guirl.vmpool.client import VMClient, VMFatalError
from guirl.vmpool.tasks.getters.base import Getter, save
from guirl.vmpool.tasks.setup import TaskContext

VLC_CONFIG = "~/.config/vlc/vlcrc"
"""VLC 3's configuration file on the VM (Linux)."""
VLC_HTTP_PORT = 8080
"""VLC's HTTP interface inside the VM, as OSWorld's image configures it (`env.vlc_port`)."""
VLC_HTTP_PASSWORD = "password"
"""The interface's password in OSWorld's image (the user name is empty)."""
VSCODE_FILE_WAIT_S = 5.0
"""How long `vscode_config` waits for the file the VS Code command writes (OSWorld sleeps 1 s, then reads)."""

# Fetches VLC's status.xml on the VM itself and prints it base64-encoded (any bytes survive the JSON
# reply); exits 1 when VLC does not answer 200, as OSWorld's getter then returns None.
_VLC_STATUS = """
import base64, sys, urllib.request
url, password = sys.argv[1], sys.argv[2]
auth = base64.b64encode((":" + password).encode()).decode()
request = urllib.request.Request(url, headers={"Authorization": "Basic " + auth})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(request, timeout=10) as reply:
        body = reply.read()
except Exception as exc:
    print(exc, file=sys.stderr)
    sys.exit(1)
sys.stdout.write(base64.b64encode(body).decode())
"""

# OSWorld's list of video MIME subtypes, duplicates included: an app counts once per entry, so the
# duplicates weigh as they do there when the most common default is picked.
_VIDEO_SUBTYPES = (
    "3gp 3gp 3gpp 3gpp 3gpp2 3gpp2 avi avi divx divx dv dv fli fli flv flv mp2t mp2t mp4 mp4 mp4v-es "
    "mp4v-es mpeg mpeg mpeg-system mpeg-system msvideo msvideo ogg ogg quicktime quicktime vnd.divx "
    "vnd.divx vnd.mpegurl vnd.mpegurl vnd.rn-realvideo vnd.rn-realvideo webm webm x-anim x-anim "
    "x-avi x-avi x-flc x-flc x-fli x-fli x-flv x-flv x-m4v x-m4v x-matroska x-matroska x-mpeg x-mpeg "
    "x-mpeg-system x-mpeg-system x-mpeg2 x-mpeg2 x-ms-asf x-ms-asf x-ms-asf-plugin x-ms-asf-plugin "
    "x-ms-asx x-ms-asx x-ms-wm x-ms-wm x-ms-wmv x-ms-wmv x-ms-wmx x-ms-wmx x-ms-wvx x-ms-wvx "
    "x-msvideo x-msvideo x-nsv x-nsv x-ogm x-ogm x-ogm+ogg x-theora x-theora x-theora+ogg "
    "x-theora+ogg"
).split()

# Asks xdg-mime for each subtype's default app in one VM command (a few at a time: each query is a shell
# script that takes a tenth of a second); prints {subtype: output}.
_XDG_DEFAULTS = """
import json, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
def query(subtype):
    try:
        return subprocess.run(["xdg-mime", "query", "default", "video/" + subtype],
                              capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
with ThreadPoolExecutor(16) as pool:
    print(json.dumps(dict(zip(sys.argv[1:], pool.map(query, sys.argv[1:])))))
"""


def _save(ctx: TaskContext, dest: str, data: bytes) -> str:
    local = save(ctx, dest, data)
    return str(local)


async def vlc_config(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """VLC's configuration file (`~/.config/vlc/vlcrc`) saved as `dest`; None when VLC never wrote one."""
    # OSWorld asks the VM's Python to expand `~` first; both servers expand it in /file themselves
    data = await client.get_file(VLC_CONFIG)
    return None if data is None else _save(ctx, config["dest"], data)


async def vlc_playing_info(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """VLC's `/requests/status.xml` (its HTTP interface, read inside the VM) saved as `dest`; None when VLC
    does not answer (not running, or its interface is off)."""
    url = f"http://localhost:{VLC_HTTP_PORT}/requests/status.xml"
    reply = await client.execute(["python", "-c", _VLC_STATUS, url, VLC_HTTP_PASSWORD])
    if reply.get("returncode") != 0:
        return None
    try:
        data = base64.b64decode(str(reply.get("output") or "").strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return _save(ctx, config["dest"], data)


async def default_video_player(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """The desktop file of the app that is the default for most video types (`xdg-mime query default`,
    output as printed, e.g. "vlc.desktop\\n"), or "unknown" when none is set."""
    subtypes = list(dict.fromkeys(_VIDEO_SUBTYPES))
    try:
        reply = await client.execute(["python", "-c", _XDG_DEFAULTS, *subtypes])
        defaults = json.loads(reply.get("output") or "{}")
    except (VMFatalError, json.JSONDecodeError):  # the VM refused: like OSWorld, no app found
        defaults = {}
    apps = [defaults[s] for s in _VIDEO_SUBTYPES if isinstance(defaults.get(s), str) and defaults[s]]
    if not apps:
        return "unknown"
    return Counter(apps).most_common(1)[0][0]


async def vscode_config(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """Runs a VS Code command (`vscode_extension_command`, typed into the command palette) that writes a
    file, then fetches that file (`path`) as `dest`; None when it does not appear."""
    command = str(config["vscode_extension_command"])
    # OSWorld replays the three keys as three VM commands, each a fresh Python importing pyautogui (about
    # half a second apart, time for the palette to open); one command with those pauses is as slow on the
    # VM and three times cheaper to run
    script = (
        "import time, pyautogui; pyautogui.FAILSAFE = False; "
        f"pyautogui.hotkey('ctrl', 'shift', 'p'); time.sleep(0.5); pyautogui.typewrite({command!r}); "
        "time.sleep(0.5); pyautogui.press('enter')"
    )
    await client.execute(["python", "-c", script])
    # OSWorld sleeps 1 s and reads once; polling until the file is there is as fast and less flaky
    deadline = time.monotonic() + VSCODE_FILE_WAIT_S
    while True:
        data = await client.get_file(config["path"])
        if data is not None or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.25)
    return None if data is None else _save(ctx, config["dest"], data)


GETTERS: dict[str, Getter] = {
    "vlc_config": vlc_config,
    "vlc_playing_info": vlc_playing_info,
    "default_video_player": default_video_player,
    "vscode_config": vscode_config,
}
"""VLC's and VS Code's getters, by OSWorld's names."""
