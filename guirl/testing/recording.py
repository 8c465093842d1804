"""A recorded run made without desktops: for the `replay` provider's tests and `bench/control_plane.py`.

`write_recording` writes a run directory laid out as an eval run writes it (`episodes/<task>/<episode>/`
with `step_NNN.png`, `final.png`, `traj.jsonl`, `result.json`, and a task file per task) and the scripts the
scripted backend plays to take the recorded actions again (`scripts/<task>.jsonl`). The screens are drawn
like a desktop (a panel, windows with title bars, lines of text, a photo-like gradient whose share of the
screen sets the PNG's size), so they compress as desktop screenshots do: about 40-200 KB at 1920x1080.
"""

from __future__ import annotations

import io
import json
import os
import random
from pathlib import Path

from PIL import Image, ImageDraw


def desktop_png(width: int, height: int, seed: int, photo: float = 0.03) -> bytes:
    """A desktop-like screenshot: `photo` (0-1) is the share of its width given to a noisy, photo-like
    picture (what makes a desktop PNG large)."""
    rnd = random.Random(seed)
    img = Image.new("RGB", (width, height), (38, 50, 72))
    draw = ImageDraw.Draw(img)
    draw.rectangle([0, 0, width, 28], fill=(30, 30, 30))  # the panel
    for i in range(6):
        draw.text((10 + 90 * i, 8), f"Menu{i}", fill=(220, 220, 220))
    for w in range(rnd.randint(2, 4)):  # windows
        x0, y0 = rnd.randint(0, width // 2), rnd.randint(40, height // 2)
        x1, y1 = min(width - 1, x0 + rnd.randint(width // 4, width // 2)), min(height - 1, y0 + height // 3)
        draw.rectangle([x0, y0, x1, y1], fill=(245, 245, 245), outline=(90, 90, 90))
        draw.rectangle([x0, y0, x1, y0 + 24], fill=(60, 90, 150))
        draw.text((x0 + 8, y0 + 6), f"Window {seed}-{w}", fill=(255, 255, 255))
        for line in range(y0 + 34, y1 - 12, 16):  # text
            words = " ".join(
                rnd.choice(("file", "edit", "cell", "42", "total", "report", "x")) for _ in range(8)
            )
            draw.text((x0 + 8, line), words, fill=(20, 20, 20))
    pw = int(width * photo)
    if pw > 0:  # a photo: noise is what PNG cannot compress
        noise = Image.effect_noise((pw, height // 3), 60).convert("RGB")
        img.paste(noise, (width - pw - 20, height - height // 3 - 20))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def write_recording(
    root: Path,
    *,
    tasks: int = 4,
    steps: int = 5,
    size: tuple[int, int] = (1920, 1080),
    distinct_screens: int = 8,
    photo: float = 0.03,
    score: float = 1.0,
    vary: bool = False,
) -> dict:
    """A run directory at `root` with one completed episode per task (`steps` steps: clicks and typing,
    then DONE), its screens links to `distinct_screens` desktop images (`root/screens/`); and
    `root/scripts/` for the scripted backend. `vary`: episodes of `steps` / 2 to 3 x `steps` / 2 steps
    (their mean is about `steps`), so that desktops started together drift apart. Returns {"tasks": [...],
    "screen_bytes": mean PNG size, "scripts": dir, "suite": the task list file}."""
    w, h = size
    pngs = [desktop_png(w, h, seed, photo) for seed in range(distinct_screens)]
    pool = root / "screens"  # the distinct screens; episodes hold links to them
    pool.mkdir(parents=True, exist_ok=True)
    for i, png in enumerate(pngs):
        (pool / f"{i}.png").write_bytes(png)

    def put(path: Path, i: int) -> None:
        path.unlink(missing_ok=True)
        os.link(pool / f"{i % len(pngs)}.png", path)

    scripts = root / "scripts"
    scripts.mkdir(parents=True, exist_ok=True)
    examples = root / "suite" / "examples" / "replayed"
    examples.mkdir(parents=True, exist_ok=True)
    ids = []
    for t in range(tasks):
        task_id = f"replayed-{t:04d}"
        ids.append(task_id)
        episode = root / "episodes" / task_id / f"{task_id}-e0"
        episode.mkdir(parents=True, exist_ok=True)
        length = steps // 2 + (t * 7919) % (steps + 1) if vary else steps
        length = max(1, length)
        actions = []
        for s in range(length - 1):
            if s % 2 == 0:
                actions.append(
                    {"type": "click", "x": (97 * (s + t + 1)) % (w - 1), "y": (61 * (s + 3)) % (h - 1)}
                )
            else:
                actions.append({"type": "type", "text": f"step {s}"})
        actions.append({"type": "done"})
        with open(episode / "traj.jsonl", "w") as traj:
            for s, action in enumerate(actions):
                put(episode / f"step_{s:03d}.png", t + s)
                traj.write(
                    json.dumps({"step": s, "screenshot": f"step_{s:03d}.png", "actions": [action]}) + "\n"
                )
        put(episode / "final.png", t + length)
        (episode / "result.json").write_text(
            json.dumps(
                {
                    "episode_id": episode.name,
                    "task_id": task_id,
                    "domain": "replayed",
                    "status": "completed",
                    "outcome": "done",
                    "score": score,
                    "steps": length,
                    "env_error": "",
                }
            )
        )
        (scripts / f"{task_id}.jsonl").write_text("".join(json.dumps(a) + "\n" for a in actions))
        task = {
            "id": task_id,
            "snapshot": "replayed",
            "instruction": f"Replay recorded task {t}.",
            "source": "guirl.testing.recording",
            "config": [],
            "related_apps": [],
            "evaluator": {"func": "infeasible"},
        }
        (examples / f"{task_id}.json").write_text(json.dumps(task))
    (root / "suite" / "list.json").write_text(json.dumps({"replayed": ids}))
    return {
        "tasks": ids,
        "screen_bytes": sum(map(len, pngs)) // len(pngs),
        "scripts": str(scripts),
        "suite": str(root / "suite" / "list.json"),
    }
