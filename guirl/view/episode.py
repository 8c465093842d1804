"""The episode page: each step's screenshot with its action drawn on it, what the model said and what was
parsed from it, timing, the judge's verdict and the step's advantage; then the final screen and how the
evaluator scored it. A GUI-R1 row (one step) shows its ground-truth box and the predicted point.

Coordinates: an executed action's are the desktop's (the screenshot's pixels, as recorded); a row's ground
truth and answer are in the row's image as the policy saw it (its step_000.png). Both are drawn in an SVG
whose viewBox is the image's own size, laid over the image, so a mark stays on its pixel at any zoom.
"""

from __future__ import annotations

import json
from typing import Any

from guirl.view import html as H
from guirl.view.html import esc, fmt
from guirl.view.site import Episode, Run, _num, _read_jsonl, _strs, href, png_size


def _shot(ep: Episode, name: str, up: str, marks: str, size: tuple[int, int] | None, alt: str) -> str:
    src = f"{up}{href('episodes', ep.task_id, ep.episode_id, name)}"
    if size is None:
        return f"<div class='box error'>{esc(name)}: missing or not a PNG</div>"
    w, h = size
    return (
        f'<div class=shot><img loading=lazy src="{src}" width="{w}" height="{h}" alt="{esc(alt)}">'
        f'<svg viewBox="0 0 {w} {h}" preserveAspectRatio="none" data-width="{w}" data-height="{h}">{marks}'
        "</svg></div>"
    )


def _el(tag: str, inner: str = "", **attrs: object) -> str:
    """An SVG element; attribute names with `_` are written with `-` (numbers shortened)."""
    text = " ".join(
        f'{k.rstrip("_").replace("_", "-")}="{esc(f"{v:.4g}" if isinstance(v, float) else v)}"'
        for k, v in attrs.items()
    )
    return f"<{tag} {text}>{inner}</{tag}>" if inner else f"<{tag} {text}/>"


class _Marks:
    """The SVG marks of one step's actions, and the pointer's position carried from step to step (a
    `drag_to` starts where the pointer was)."""

    def __init__(self, size: tuple[int, int]) -> None:
        self.w, self.h = size
        self.r = max(8.0, min(self.w, self.h) / 40)
        self.labels: list[str] = []
        self.svg: list[str] = []

    def label(self, text: str, cls: str) -> None:
        fs = max(12.0, self.h / 40)
        y = fs * 1.4 * (len(self.labels) + 1)
        shown = text if len(text) <= 80 else text[:77] + "…"
        width = min(self.w - 8, fs * 0.6 * len(shown) + 12)
        self.labels.append(
            f'<g class="{esc(cls)}"><title>{esc(text)}</title>'
            + _el("rect", x=4, y=y - fs * 1.1, width=width, height=fs * 1.35, fill="#000", opacity=0.7, rx=3)
            + _el("text", esc(shown), x=10, y=y, font_size=fs, fill="#fff", font_family="monospace")
            + "</g>"
        )

    def point(self, x: float, y: float, cls: str, colour: str, title: str) -> None:
        r = self.r
        self.svg.append(
            f'<g class="{esc(cls)}" data-x="{x:g}" data-y="{y:g}"><title>{esc(title)}</title>'
            + _el("circle", cx=x, cy=y, r=r, fill="none", stroke="#fff", stroke_width=r / 1.5)
            + _el("circle", cx=x, cy=y, r=r, fill="none", stroke=colour, stroke_width=r / 3)
            + _el("line", x1=x - 2 * r, y1=y, x2=x + 2 * r, y2=y, stroke=colour, stroke_width=1.5)
            + _el("line", x1=x, y1=y - 2 * r, x2=x, y2=y + 2 * r, stroke=colour, stroke_width=1.5)
            + "</g>"
        )

    def path(self, x0: float, y0: float, x1: float, y1: float, cls: str, title: str) -> None:
        r, colour = self.r, "#8250df"
        self.svg.append(
            f'<g class="{esc(cls)}" data-x="{x0:g}" data-y="{y0:g}" data-to-x="{x1:g}" data-to-y="{y1:g}">'
            f"<title>{esc(title)}</title>"
            + _el("line", x1=x0, y1=y0, x2=x1, y2=y1, stroke=colour, stroke_width=r / 2)
            + _el("circle", cx=x0, cy=y0, r=r / 1.5, fill=colour)
            + _el("circle", cx=x1, cy=y1, r=r, fill="none", stroke=colour, stroke_width=r / 3)
            + "</g>"
        )

    def box(self, box: list[float], cls: str, title: str) -> None:
        x1, y1, x2, y2 = box
        self.svg.append(
            _el(
                "rect",
                f"<title>{esc(title)}</title>",
                class_=cls,
                data_box=f"{x1:g},{y1:g},{x2:g},{y2:g}",
                x=x1,
                y=y1,
                width=x2 - x1,
                height=y2 - y1,
                fill="#1a7f37",
                fill_opacity=0.15,
                stroke="#1a7f37",
                stroke_width=3,
                stroke_dasharray="8 4",
            )
        )

    def markup(self) -> str:
        return "".join(self.svg) + "".join(self.labels)


def draw_actions(actions: list[Any], size: tuple[int, int], pointer: list[float | None]) -> _Marks:
    """Marks for executed actions (as traj.jsonl records them); `pointer` ([x, y]) is updated."""
    m = _Marks(size)
    for a in actions:
        if not isinstance(a, dict):
            continue
        kind = a.get("type")
        x, y = _num(a.get("x")), _num(a.get("y"))
        if kind == "click" and x is not None and y is not None:
            clicks = a.get("clicks") if isinstance(a.get("clicks"), int) else 1
            button = a.get("button", "left")
            times = {2: "double-", 3: "triple-"}.get(clicks, "")
            what = f"{times}{button} click at ({x:g}, {y:g})"
            m.point(x, y, "click-marker", "#cf222e", what)
            pointer[:] = [x, y]
        elif kind == "move" and x is not None and y is not None:
            m.point(x, y, "move-marker", "#0969da", f"move to ({x:g}, {y:g})")
            pointer[:] = [x, y]
        elif kind in ("drag", "drag_to"):
            tx, ty = _num(a.get("to_x")), _num(a.get("to_y"))
            if kind == "drag_to":
                x, y = pointer if pointer[0] is not None else (None, None)
            if tx is not None and ty is not None:
                if x is not None and y is not None:
                    m.path(x, y, tx, ty, "drag-path", f"drag from ({x:g}, {y:g}) to ({tx:g}, {ty:g})")
                else:
                    m.point(
                        tx,
                        ty,
                        "drag-path",
                        "#8250df",
                        f"drag (from where the pointer was) to ({tx:g}, {ty:g})",
                    )
                pointer[:] = [tx, ty]
        elif kind == "scroll":
            amount = a.get("amount")
            if x is not None and y is not None:  # a scroll at a point moves the pointer there first
                pointer[:] = [x, y]
            sx = x if x is not None else (pointer[0] if pointer[0] is not None else m.w / 2)
            sy = y if y is not None else (pointer[1] if pointer[1] is not None else m.h / 2)
            axis = "horizontally" if a.get("horizontal") else ""
            m.point(sx, sy, "scroll-marker", "#9a6700", f"scroll {amount} {axis}".strip())
            m.label(f"scroll {amount} {axis}".strip(), "scroll")
        elif kind == "type":
            m.label(f"type {json.dumps(str(a.get('text', '')), ensure_ascii=False)}", "typed")
        elif kind == "key":
            m.label("key " + "+".join(_strs(a.get("keys"))), "keys")
        elif kind in ("done", "fail", "wait"):
            m.label(kind.upper() + (f" {a.get('seconds')} s" if kind == "wait" else ""), "terminal")
        else:
            m.label(f"{kind}", "other")
    return m


def _grounding_marks(line: dict, size: tuple[int, int]) -> tuple[_Marks, str]:
    """A GUI-R1 row: the ground truth's box (or point) and the predicted point, with what the answer was."""
    from guirl.agent.unified import parse_answer

    m = _Marks(size)
    gt = line.get("ground_truth") if isinstance(line.get("ground_truth"), dict) else {}
    box = gt.get("bbox")
    if isinstance(box, list) and len(box) == 4 and all(_num(v) is not None for v in box):
        b = [float(v) for v in box]
        if b[0] == b[2] and b[1] == b[3]:
            m.point(b[0], b[1], "gt-box", "#1a7f37", f"ground truth point ({b[0]:g}, {b[1]:g})")
        else:
            m.box(b, "gt-box", f"ground truth box {b}")
    parsed = parse_answer(str(line.get("response") or ""))
    pred = parsed.actions[0] if parsed.actions else None
    text = "no answer could be parsed" + (f": {parsed.error}" if getattr(parsed, "error", "") else "")
    if pred is not None:
        point = getattr(pred, "point", None)
        text = f"{pred.action}" + (f" at {list(point)}" if point else "")
        if getattr(pred, "input_text", ""):
            text += f" text {pred.input_text!r}"
        if point:
            m.point(float(point[0]), float(point[1]), "pred-point", "#cf222e", f"predicted: {text}")
    m.label(f"answer: {text}", "answer")
    return m, text


def _rounded(v: Any) -> Any:
    if isinstance(v, list):
        return [round(x, 1) if isinstance(x, float) else x for x in v]
    return v


def _pre(label: str, text: Any, cls: str = "") -> str:
    return f"<h3>{esc(label)}</h3><pre class='{cls}'>{esc(text)}</pre>"


def _prompt_text(line: dict) -> str:
    out = []
    for msg in line.get("prompt") if isinstance(line.get("prompt"), list) else []:
        if not isinstance(msg, dict):
            continue
        for part in msg.get("parts") if isinstance(msg.get("parts"), list) else []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(f"[{msg.get('role')}] {part['text']}")
            elif isinstance(part, dict) and "image" in part:
                out.append(f"[{msg.get('role')}] <image {part['image']}>")
    return "\n".join(out)


def _prm(v: dict) -> str:
    votes = v.get("vote_scores") or []
    answers = v.get("answers") or []
    parts = [
        H.kv(
            [
                ("score", fmt(v.get("score"))),
                ("votes", f"{fmt(v.get('votes'))} ({fmt(v.get('invalid'))} invalid)"),
                ("vote scores", ", ".join(fmt(x) for x in votes) if isinstance(votes, list) else votes),
                ("latency", f"{fmt(v.get('latency_s'), '.2f')} s (queued {fmt(v.get('queue_s'), '.2f')} s)"),
                ("template", v.get("template")),
            ]
        )
    ]
    for err in _strs(v.get("errors")):
        parts.append(f"<div class='box error'>{esc(err)}</div>")
    for reason in _strs(v.get("invalid_reasons")):
        parts.append(f"<div class='muted'>invalid vote: {esc(reason)}</div>")
    if isinstance(answers, list):
        for i, a in enumerate(answers):
            parts.append(f"<details><summary>judge's answer {i + 1}</summary><pre>{esc(a)}</pre></details>")
    return "<div class='box prm'><h3>Process reward (the judge)</h3>" + "".join(parts) + "</div>"


def episode_body(run: Run, ep: Episode, problems: list[str]) -> str:
    """The page's body; what it cannot show is added to `problems`."""
    up = "../../../"
    r = ep.result
    # once the episode has its result, a cut-short last line of traj.jsonl is a fault, not a write under way
    lines = _read_jsonl(ep.folder / "traj.jsonl", problems, run.root, finished=bool(r))
    prm: dict[int, list[dict]] = {}
    for v in _read_jsonl(ep.folder / "prm.jsonl", problems, run.root):
        if isinstance(v.get("step"), int):
            prm.setdefault(v["step"], []).append(v)
    head = [
        ("task", ep.task_id),
        ("domain", r.get("domain", "")),
        ("status", ep.status),
        ("outcome", ep.outcome),
        ("score", fmt(ep.score)),
        ("steps", fmt(r.get("steps"))),
        ("attempt", fmt(r.get("attempt"))),
        ("policy versions", ", ".join(_strs(r.get("policy_versions")))),
        ("worker", r.get("worker", "")),
        ("seconds", fmt(r.get("seconds"))),
    ]
    if ep.eval_round:
        head.append(("evaluation round", f"version {ep.eval_round}"))
    elif ep.assigned.get("group_id"):
        head.append(("group", f"{ep.assigned.get('group_id')} (sample {ep.assigned.get('sample_index')})"))
    if isinstance(r.get("reward"), int | float):
        head.append(("reward", fmt(r.get("reward"))))
    parts = [f"<h1>{esc(ep.episode_id)}</h1>", H.kv(head)]
    parts.append(f'<p><a href="../../{href("t", ep.task_id)}.html">all episodes of this task</a></p>')
    if r.get("env_error"):
        parts.append(
            "<div class='box error env-error'><b>Environment error</b> "
            "(not the policy's: the episode was played "
            f"again) <pre>{esc(r['env_error'])}</pre></div>"
        )
    if r.get("parse_error"):
        parts.append(
            f"<div class='box error parse-error'><b>Policy failure: the answer did not parse</b>"
            f"<pre>{esc(r['parse_error'])}</pre></div>"
        )
    if lines:
        instruction = _prompt_text(lines[0])
        parts.append(
            f"<details><summary>the first step's prompt</summary><pre>{esc(instruction)}</pre></details>"
        )
    pointer: list[float | None] = [None, None]
    for line in lines:
        parts.append(_step(run, ep, line, prm, pointer, up, problems))
    if not lines and (ep.folder / "traj.jsonl").exists() is False:
        parts.append(
            "<p class=muted>No steps recorded (traj.jsonl is missing: the episode never reached its "
            "first step, or is still starting).</p>"
        )
    final = png_size(ep.folder / "final.png")
    parts.append("<h2 id=final>The end</h2>")
    if final:
        parts.append(_shot(ep, "final.png", up, "", final, "the final screen"))
    parts.append(_evaluation(r))
    if problems:
        parts.append("<h2>Not shown</h2><ul>" + "".join(f"<li>{esc(p)}</li>" for p in problems) + "</ul>")
    parts.append(
        "<details><summary>result.json</summary><pre>"
        + esc(json.dumps(r, indent=1)[:100_000])
        + "</pre></details>"
    )
    return "".join(parts)


def _step(
    run: Run, ep: Episode, line: dict, prm: dict[int, list[dict]], pointer: list, up: str, problems: list[str]
) -> str:
    step = line.get("step")
    shot_name = line.get("screenshot") if isinstance(line.get("screenshot"), str) else ""
    # a recorded name is only ever a file beside traj.jsonl
    if not shot_name or "/" in shot_name or "\\" in shot_name or shot_name.startswith("."):
        shot_name = f"step_{step:03d}.png" if isinstance(step, int) else ""
    size = png_size(ep.folder / shot_name) if shot_name else None
    if size is None:
        where = f"episodes/{ep.task_id}/{ep.episode_id}"
        problems.append(
            f"{where}: step {step}'s screenshot {shot_name or '(none recorded)'} is missing or not a PNG"
        )
    grounding = "ground_truth" in line
    actions = line.get("actions") if isinstance(line.get("actions"), list) else []
    side: list[str] = []
    marks = ""
    if grounding and size is not None:
        marks = _grounding_marks(line, size)[0].markup()
    elif not grounding:  # the pointer is followed through a step whose screenshot cannot be shown, too
        drawn = draw_actions(actions, size or (1, 1), pointer)
        marks = drawn.markup() if size is not None else ""
    left = _shot(ep, shot_name, up, marks, size, f"step {step}")
    if line.get("parse_error"):
        side.append(
            "<div class='box error parse-error'><b>Parse error: nothing was executed</b>"
            f"<pre>{esc(line['parse_error'])}</pre></div>"
        )
    side.append(_pre("model output", line.get("response", ""), "response"))
    if line.get("action_line"):
        side.append(_pre("tool call / action", line["action_line"], "action-line"))
    if isinstance(line.get("actions"), list):
        side.append(_pre("parsed actions", json.dumps(actions, ensure_ascii=False, indent=1), "actions"))
    if line.get("refused"):
        side.append(
            "<div class='box error'><b>refused by the VM</b><pre>"
            + esc("\n".join(_strs(line["refused"]) or [str(line["refused"])]))
            + "</pre></div>"
        )
    if grounding:
        gt = line.get("ground_truth") or {}
        side.append(
            "<h3>ground truth</h3>"
            + H.kv([(k, _rounded(v)) for k, v in gt.items()] if isinstance(gt, dict) else [])
        )
        parts = line.get("reward_parts") if isinstance(line.get("reward_parts"), dict) else {}
        side.append(
            "<h3>reward</h3>"
            + H.table(
                ("part", "value"),
                [f"<tr>{H.td(k)}{H.td(fmt(v), num=True)}</tr>" for k, v in parts.items()]
                + [f"<tr>{H.td('total')}{H.td(fmt(line.get('reward')), num=True)}</tr>"],
                cls="reward-parts",
            )
        )
    timing = line.get("timing") if isinstance(line.get("timing"), dict) else {}
    facts = [
        ("policy version", f"{fmt(line.get('policy_version'))} (epoch {fmt(line.get('policy_epoch'))})"),
        ("engine", line.get("engine", "")),
        ("tokens", f"{fmt(line.get('prompt_tokens'))} prompt, {fmt(line.get('response_tokens'))} response"),
        ("finish", line.get("finish_reason", "")),
    ]
    if "prompt_s" in timing:
        facts.append(("prompt built", f"{fmt(timing['prompt_s'], '.3f')} s"))
    if "infer_s" in timing:
        facts.append(("policy wait", f"{fmt(timing['infer_s'], '.3f')} s (prompt and answer)"))
    if "act_s" in timing:
        facts.append(("action + screenshot", f"{fmt(timing['act_s'], '.3f')} s"))
    side.append("<h3>step</h3>" + H.kv(facts))
    for v in prm.get(step, []) if isinstance(step, int) else []:
        side.append(_prm(v))
    for a in run.advantages.get((ep.episode_id, step), []) if isinstance(step, int) else []:
        side.append(
            "<div class='box advantage'><h3>Credit in training</h3>"
            + H.kv(
                [
                    ("update to version", fmt(a.get("version"))),
                    (
                        "advantage",
                        fmt(a.get("advantage"), "+.4f")
                        if isinstance(a.get("advantage"), float)
                        else fmt(a.get("advantage")),
                    ),
                    ("episode reward", fmt(a.get("reward"))),
                    ("PRM score", f"{fmt(a.get('prm_score'))} ({a.get('prm_status', '')})"),
                ]
            )
            + "</div>"
        )
    return (
        f'<section class=step id="step-{esc(step)}" data-step="{esc(step)}">'
        f"<div><h2>Step {esc(step)}</h2>{left}</div>"
        f"<div>{''.join(side)}</div></section>"
    )


def _evaluation(r: dict) -> str:
    ev = r.get("evaluation") if isinstance(r.get("evaluation"), dict) else None
    errs = r.get("evaluation_errors") if isinstance(r.get("evaluation_errors"), list) else []
    out = ["<div class='box evaluation'><h3>Evaluation</h3>"]
    out.append(H.kv([("outcome", r.get("outcome", "")), ("score", fmt(r.get("score")))]))
    if ev:
        if ev.get("infeasible"):
            out.append(
                f"<p>An infeasible task: it scores 1 only when the agent says FAIL "
                f"(it did{'' if ev.get('agent_said_fail') else ' not'}).</p>"
            )
        elif ev.get("agent_said_fail"):
            out.append("<p>The agent said FAIL on a feasible task: 0, nothing evaluated.</p>")
        metrics = ev.get("metrics") if isinstance(ev.get("metrics"), list) else []
        if metrics:
            rows = []
            for m in metrics:
                if not isinstance(m, dict):
                    continue
                rows.append(
                    "<tr>"
                    + H.td(m.get("metric"))
                    + H.td(f"{m.get('result_getter', '')}: {json.dumps(m.get('result'), ensure_ascii=False)}")
                    + H.td(
                        f"{m.get('expected_getter', '')}: {json.dumps(m.get('expected'), ensure_ascii=False)}"
                        if "expected_getter" in m
                        else "–"
                    )
                    + H.td(json.dumps(m.get("options"), ensure_ascii=False) if m.get("options") else "")
                    + H.td(fmt(m.get("score")), num=True)
                    + "</tr>"
                )
            out.append(
                f"<p>metrics joined by <b>{esc(ev.get('conj', 'and'))}</b>; "
                f"final score {esc(fmt(ev.get('score')))}</p>"
                + H.table(
                    ("metric", "result (getter: value)", "expected (getter: value)", "options", "score"),
                    rows,
                    cls="metrics",
                )
            )
        if ev.get("not_run"):
            out.append(
                f"<p class=muted>not run (decided before them): {esc(', '.join(_strs(ev['not_run'])))}</p>"
            )
    elif not r.get("env_error") and r.get("outcome") != "parse_error" and "reward_parts" not in r:
        out.append("<p class=muted>This run did not record how the score was reached.</p>")
    for e in errs:
        out.append(f"<div class='box error'>scored 0 by OSWorld's rule: {esc(e)}</div>")
    out.append("</div>")
    return "".join(out)
