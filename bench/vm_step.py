"""Step latency on a local VM: guirl's typed `/action` (action + next screenshot in one call, in-process)
vs OSWorld's way (`/execute` of `python -c "import pyautogui; ..."`, then `/screenshot`), side by side
on the same VM, in interleaved rounds; and the reset latency of a local VM. Prints one line of JSON.

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


async def run(quick: bool) -> dict:
    rounds, reps, resets = (3, 5, 5) if quick else (6, 10, 20)
    with tempfile.TemporaryDirectory(prefix="guirl-bench-") as root:
        provider = LocalProvider(root)  # 1920x1080, PNG level 1: the defaults
        vm = await provider.create("bench")
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
        "targets_met": {
            "typed_ge_10x_faster": med_os / med_typed >= 10,
            "reset_under_2s": max(reset_s) < 2.0,
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
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
