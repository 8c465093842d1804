"""Step latency on a local VM: guirl's typed `/action` (action + next screenshot in one call, in-process)
vs OSWorld's way (`/execute` of `python -c "import pyautogui; ..."`, then `/screenshot`), side by side
on the same VM, in interleaved rounds; a local VM's start and reset, bare and with every application a
local desktop offers open (each application's time to its first window is reported too); and what one
read of the accessibility tree costs with a light and a heavy application open. Prints one line of JSON.

    python bench/vm_step.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from guirl.agent.actions import Click, to_pyautogui  # noqa: E402
from guirl.vmpool.client import VMClient  # noqa: E402
from guirl.vmpool.local import LocalProvider  # noqa: E402

OSWORLD_PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; "
"""What OSWorld's controller prepends to every pyautogui command it sends to `/execute`."""


async def typed_step(client: VMClient, x: int, y: int) -> float:
    t = time.perf_counter()
    result = await client.act(Click(x=x, y=y))
    assert result.ok and result.screenshot
    return time.perf_counter() - t


async def osworld_step(client: VMClient, x: int, y: int) -> float:
    t = time.perf_counter()
    out = await client.execute(["python", "-c", OSWORLD_PREFIX + to_pyautogui(Click(x=x, y=y))])
    assert out["returncode"] == 0, out
    assert await client.screenshot()
    return time.perf_counter() - t


APPS = {
    "xterm": (["xterm"], ["--class", "xterm"]),
    "gnome-terminal": (["gnome-terminal"], ["--class", "gnome-terminal"]),
    "mousepad": (["mousepad"], ["--class", "mousepad"]),
    "calc": (["localc", "--norestore"], ["--name", "LibreOffice Calc"]),
    "writer": (["lowriter", "--norestore"], ["--name", "LibreOffice Writer"]),
    "impress": (["loimpress", "--norestore"], ["--name", "LibreOffice Impress"]),
    "gimp": (["gimp"], ["--name", "GNU Image Manipulation Program"]),
    "vlc": (["vlc", "--no-audio"], ["--name", "VLC media player"]),
    "thunderbird": (["thunderbird"], ["--class", "thunderbird"]),
    "chromium": (["google-chrome", "--remote-debugging-port=1337"], ["--class", "chromium"]),
}
"""Every application of a local desktop (`guirl/vmpool/apps.py`), how it is started, and how its first
window is found."""


async def open_app(client: VMClient, name: str) -> float:
    """Seconds from starting `name` to its first visible window."""
    command, window = APPS[name]
    t = time.perf_counter()
    await client.launch(command)
    for _ in range(20):  # a window that goes while xdotool walks the tree (a splash screen) fails one search
        out = await client.execute(
            ["timeout", "120", "xdotool", "search", "--sync", "--onlyvisible", *window], timeout_s=130
        )
        if out["returncode"] == 0:
            return time.perf_counter() - t
    raise AssertionError((name, out))


async def desktop_figures(provider: LocalProvider, vm: str, quick: bool) -> dict:
    """Start, reset bare and with every application open, each application's start, the tree's cost."""
    starts, resets, full_resets = [], [], []
    for _ in range(3 if quick else 10):
        t = time.perf_counter()
        other = await provider.create("bench-start")
        starts.append(time.perf_counter() - t)
        await provider.delete(other)
    app_s: dict[str, list[float]] = {name: [] for name in APPS}
    tree_s: dict[str, list[float]] = {"mousepad": [], "calc": []}
    tree_nodes: dict[str, int] = {}
    async with VMClient(provider.address(vm), timeout_s=120) as client:
        for _ in range(2 if quick else 5):
            await provider.reset(vm)
            for name in APPS:
                app_s[name].append(await open_app(client, name))
            t = time.perf_counter()
            await provider.reset(vm)  # every application open: the session and all it started go
            full_resets.append(time.perf_counter() - t)
        for name in list(tree_s):
            await provider.reset(vm)
            await open_app(client, name)
            await client.accessibility_tree()  # the helper's start, and the application's first answers
            for _ in range(3 if quick else 5):
                t = time.perf_counter()
                tree = await client.accessibility_tree()
                tree_s[name].append(time.perf_counter() - t)
            tree_nodes[name] = sum(1 for _ in ET.fromstring(tree).iter())
        for _ in range(3 if quick else 10):
            t = time.perf_counter()
            await provider.reset(vm)
            resets.append(time.perf_counter() - t)
    return {
        "start_median_s": round(statistics.median(starts), 3),
        "reset_bare_median_s": round(statistics.median(resets), 3),
        "reset_all_apps_median_s": round(statistics.median(full_resets), 3),
        "reset_all_apps_max_s": round(max(full_resets), 3),
        "app_start_median_s": {name: round(statistics.median(v), 2) for name, v in app_s.items()},
        "a11y_tree_median_s": {name: round(statistics.median(v), 3) for name, v in tree_s.items()},
        "a11y_tree_nodes": tree_nodes,
    }


async def run(quick: bool) -> dict:
    rounds, reps, resets = (3, 5, 5) if quick else (6, 10, 20)
    with tempfile.TemporaryDirectory(prefix="guirl-bench-") as root:
        provider = LocalProvider(root)  # 1920x1080, PNG level 1: the defaults
        vm = await provider.create("bench")
        desktop = await desktop_figures(provider, vm, quick)
        await provider.reset(vm)
        typed: list[float] = []
        osworld: list[float] = []
        async with VMClient(provider.address(vm), timeout_s=60) as client:
            # clicks land inside a terminal window, so the screen (and what a screenshot costs) stays put
            await client.launch(["xterm", "-geometry", "100x30+50+50"])
            await client.execute(["xdotool", "search", "--sync", "--onlyvisible", "--class", "xterm"])
            await typed_step(client, 200, 200)  # warm-up: imports, first grab
            await osworld_step(client, 200, 200)
            for r in range(rounds):
                for i in range(reps):
                    typed.append(await typed_step(client, 200 + i, 200 + r))
                for i in range(reps):
                    osworld.append(await osworld_step(client, 200 + i, 200 + r))
        reset_s = []
        for _ in range(resets):
            t = time.perf_counter()
            await provider.reset(vm)
            reset_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        await provider.delete(vm)
        delete_s = time.perf_counter() - t
    med_typed, med_os = statistics.median(typed), statistics.median(osworld)
    return {
        "bench": "vm_step",
        "screen": "1920x1080",
        "samples": {"typed": len(typed), "osworld": len(osworld), "resets": len(reset_s)},
        "step_median_ms": {
            "typed_action": round(med_typed * 1e3, 1),
            "osworld_execute": round(med_os * 1e3, 1),
        },
        "osworld_over_typed": round(med_os / med_typed, 1),
        "reset_median_s": round(statistics.median(reset_s), 3),
        "reset_max_s": round(max(reset_s), 3),
        "delete_s": round(delete_s, 3),
        **desktop,
        "targets_met": {
            "typed_ge_10x_faster": med_os / med_typed >= 10,
            "reset_under_2s": max(reset_s) < 2.0,
            "reset_with_all_apps_under_2s": desktop["reset_all_apps_median_s"] < 2.0,
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples")
    args = ap.parse_args()
    import uvloop

    figures = uvloop.run(run(args.quick))
    s = figures["step_median_ms"]
    print(f"typed /action step:            {s['typed_action']:8.1f} ms (action + next screenshot, one call)")
    print(
        f"OSWorld /execute + /screenshot: {s['osworld_execute']:8.1f} ms  ({figures['osworld_over_typed']}x)"
    )
    print(
        f"local VM reset:                 {figures['reset_median_s'] * 1e3:8.0f} ms median, "
        f"{figures['reset_max_s'] * 1e3:.0f} ms max"
    )
    print(
        f"local VM start:                 {figures['start_median_s'] * 1e3:8.0f} ms median; reset with every "
        f"application open: {figures['reset_all_apps_median_s'] * 1e3:.0f} ms median"
    )
    apps = figures["app_start_median_s"]
    print("application start (to its window): " + ", ".join(f"{k} {v:.1f} s" for k, v in apps.items()))
    trees = figures["a11y_tree_median_s"]
    print(
        "accessibility tree, one read:      "
        + ", ".join(f"{k} {v * 1e3:.0f} ms ({figures['a11y_tree_nodes'][k]} nodes)" for k, v in trees.items())
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
