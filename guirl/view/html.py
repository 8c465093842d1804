"""The viewer's HTML: escaping, the page frame, its stylesheet and script, and plots as inline SVG.

Everything a page shows comes from a run directory, which holds what models and VMs wrote: every string
goes through `esc` (text) or `href` (a link), and nothing read from the run is ever put inside a script.
The script is guirl's own (sorting and filtering tables, the live refresh under `guirl view --serve`); it
reads the page, never data.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from urllib.parse import quote


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def href(*parts: str) -> str:
    """A relative link from path segments (each percent-encoded: a task id is a name, not a path)."""
    return "/".join(p if p in (".", "..") else quote(p, safe="") for p in parts)


def fmt(value: object, spec: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    try:
        return format(value, spec) if spec else str(value)
    except (TypeError, ValueError):
        return str(value)


def pct(share: object) -> str:
    return f"{share:.1%}" if isinstance(share, int | float) and math.isfinite(share) else "–"


CSS = """
:root { --fg:#1b1f24; --muted:#59636e; --line:#d0d7de; --bg:#f6f8fa; --ok:#1a7f37; --bad:#cf222e;
        --warn:#9a6700; --accent:#0969da; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); margin: 0; }
header.top { background: #24292f; color: #fff; padding: 8px 16px; display: flex; gap: 16px;
             align-items: baseline; flex-wrap: wrap; }
header.top a { color: #fff; }
header.top .run { font-weight: 600; }
main { padding: 12px 16px 40px; max-width: 1500px; }
h1 { font-size: 20px; margin: 8px 0 12px; word-break: break-all; }
h2 { font-size: 16px; margin: 24px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 14px; margin: 12px 0 6px; }
a { color: var(--accent); }
table { border-collapse: collapse; margin: 4px 0; }
th, td { border: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: var(--bg); }
th.sortable { cursor: pointer; user-select: none; }
th.sortable::after { content: " \\2195"; color: var(--muted); }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: var(--bg); border: 1px solid var(--line); padding: 8px; white-space: pre-wrap;
      word-break: break-word; max-height: 420px; overflow: auto; margin: 4px 0; }
.muted { color: var(--muted); }
.ok { color: var(--ok); } .bad { color: var(--bad); } .warn { color: var(--warn); }
.box { border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; margin: 8px 0; }
.error { border-color: var(--bad); background: #ffebe9; }
.cards { display: flex; flex-wrap: wrap; gap: 8px; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 6px 12px; min-width: 120px; }
.card b { display: block; font-size: 18px; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
figure.plot { margin: 0; border: 1px solid var(--line); border-radius: 6px; padding: 4px; }
figure.plot figcaption { font-weight: 600; font-size: 13px; padding: 0 4px; }
.step { display: grid; grid-template-columns: minmax(320px, 860px) minmax(280px, 1fr); gap: 12px;
        border-top: 1px solid var(--line); padding: 12px 0; }
.shot { position: relative; display: inline-block; max-width: 100%; line-height: 0; }
.shot img { max-width: 100%; height: auto; border: 1px solid var(--line); }
.shot svg { position: absolute; inset: 0; width: 100%; height: 100%; pointer-events: none; }
.thumb { width: 120px; height: auto; border: 1px solid var(--line); }
.filters { display: flex; gap: 8px; align-items: center; margin: 8px 0; flex-wrap: wrap; }
.filters input { padding: 4px 8px; min-width: 260px; }
dl.kv { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 4px 0; }
dl.kv dt { color: var(--muted); } dl.kv dd { margin: 0; word-break: break-word; }
.tag { display: inline-block; border-radius: 10px; padding: 0 8px; font-size: 12px; border: 1px solid; }
"""

JS = """
(function () {
  function key(td) {
    var v = td.getAttribute('data-v');
    if (v === null) v = td.textContent.trim();
    var n = parseFloat(v);
    return isNaN(n) || v === '' ? [1, v.toLowerCase()] : [0, n];
  }
  function cmp(a, b) { return a[0] - b[0] || (a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0); }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    table.querySelectorAll('th.sortable').forEach(function (th, i) {
      th.addEventListener('click', function () {
        var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
        var dir = th.getAttribute('data-dir') === 'asc' ? -1 : 1;
        table.querySelectorAll('th').forEach(function (h) { h.removeAttribute('data-dir'); });
        th.setAttribute('data-dir', dir === 1 ? 'asc' : 'desc');
        var col = th.cellIndex;
        rows.sort(function (r, s) { return dir * cmp(key(r.cells[col]), key(s.cells[col])); });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
  var q = document.getElementById('filter'), sel = document.getElementById('outcome');
  function apply() {
    var text = q ? q.value.trim().toLowerCase() : '', want = sel ? sel.value : '';
    var shown = 0;
    document.querySelectorAll('table.filterable tbody tr').forEach(function (tr) {
      var ok = (!text || tr.textContent.toLowerCase().indexOf(text) >= 0) &&
               (!want || (' ' + tr.getAttribute('data-outcomes') + ' ').indexOf(' ' + want + ' ') >= 0);
      tr.hidden = !ok; if (ok) shown++;
    });
    var n = document.getElementById('shown'); if (n) n.textContent = shown;
  }
  if (q) q.addEventListener('input', apply);
  if (sel) sel.addEventListener('change', apply);
  // guirl view --serve: reload when the site is rebuilt (never from file://)
  // (build.json says which build last wrote each page; this page knows which build wrote it)
  var body = document.body, live = body.getAttribute('data-build'), me = body.getAttribute('data-page');
  var mine = parseInt(body.getAttribute('data-generation') || '0', 10);
  if (live && me && location.protocol.indexOf('http') === 0) {
    var look = function () {
      fetch(live, {cache: 'no-store'}).then(function (r) { return r.json(); }).then(function (b) {
        var at = b.written && b.written[me];
        if (at && at > mine) location.reload();
      }).catch(function () {});
    };
    look();
    setInterval(look, 1000);
  }
})();
"""


def page(title: str, body: str, *, root: str, run_name: str, nav: Sequence[tuple[str, str]] = ()) -> str:
    """A whole page; `root` is the relative way up to the site's folder (`view/`)."""
    links = "".join(f'<a href="{root}{h}">{esc(label)}</a>' for label, h in nav)
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title>"
        f'<link rel=stylesheet href="{root}assets/view.css"></head>'
        f'<body data-build="{root}build.json"><header class=top><span class=run>{esc(run_name)}</span>'
        f"{links}</header><main>{body}</main>"
        f'<script src="{root}assets/view.js"></script></body></html>\n'
    )


def table(
    head: Sequence[str],
    rows: Iterable[str],
    *,
    cls: str = "",
    sortable: bool = False,
    attrs: str = "",
) -> str:
    """`rows` are `<tr>…</tr>` strings (their cells already escaped)."""
    th = "".join(f'<th class="{"sortable" if sortable else ""}">{esc(h)}</th>' for h in head)
    classes = " ".join(c for c in (cls, "sortable" if sortable else "") if c)
    return (
        f'<table class="{classes}" {attrs}><thead><tr>{th}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )


def td(value: object, *, num: bool = False, sort: object = None, raw: bool = False) -> str:
    v = "" if sort is None else f' data-v="{esc(sort)}"'
    cls = ' class="num"' if num else ""
    return f"<td{cls}{v}>{value if raw else esc(value)}</td>"


def kv(pairs: Iterable[tuple[str, object]]) -> str:
    return "<dl class=kv>" + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in pairs) + "</dl>"


def line_plot(
    name: str,
    caption: str,
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    *,
    x_label: str = "policy version",
    percent: bool = False,
    size: tuple[int, int] = (340, 190),
) -> str:
    """A small line chart as inline SVG: one polyline per series, a dot per point with its value as a
    tooltip, the axes' ends labelled. Points whose value is not finite are left out (and counted)."""
    w, h = size
    left, right, top, bottom = 46, 10, 10, 28
    clean = [(label, [(x, y) for x, y in pts if _finite(x) and _finite(y)]) for label, pts in series]
    dropped = sum(len(pts) for _, pts in series) - sum(len(pts) for _, pts in clean)
    xs = [x for _, pts in clean for x, _ in pts]
    ys = [y for _, pts in clean for _, y in pts]
    if not xs:
        return ""
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if percent:
        y0, y1 = min(0.0, y0), max(1.0, y1)
    if y0 == y1:
        y0, y1 = y0 - 0.5 if y0 else -1.0, y1 + 0.5 if y1 else 1.0
    if x0 == x1:
        x0, x1 = x0 - 1, x1 + 1

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (w - left - right)

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * (h - top - bottom)

    def label(y: float) -> str:
        return f"{y:.0%}" if percent else f"{y:.3g}"

    colours = ("#0969da", "#cf222e", "#1a7f37", "#8250df")
    out = [
        f'<figure class=plot data-metric="{esc(name)}"><figcaption>{esc(caption)}</figcaption>',
        f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}" role=img aria-label="{esc(caption)}">',
        f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="#8c959f"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="#8c959f"/>',
        f'<text x="{left - 4}" y="{top + 8}" font-size="10" text-anchor="end">{esc(label(y1))}</text>',
        f'<text x="{left - 4}" y="{h - bottom}" font-size="10" text-anchor="end">{esc(label(y0))}</text>',
        f'<text x="{left}" y="{h - 12}" font-size="10">{esc(fmt(x0, "g"))}</text>',
        f'<text x="{w - right}" y="{h - 12}" font-size="10" text-anchor="end">{esc(fmt(x1, "g"))}</text>',
        f'<text x="{(left + w - right) / 2}" y="{h - 2}" font-size="10" text-anchor="middle"'
        f' fill="#59636e">{esc(x_label)}</text>',
    ]
    for i, (series_label, pts) in enumerate(clean):
        colour = colours[i % len(colours)]
        if len(pts) > 1:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        for x, y in pts:
            out.append(
                f'<circle class=point cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{colour}">'
                f"<title>{esc(series_label)} {esc(fmt(x, 'g'))}: {esc(label(y))}</title></circle>"
            )
    out.append("</svg>")
    if len(clean) > 1:
        out.append(
            "<div class=muted>"
            + " · ".join(
                f'<span style="color:{colours[i % len(colours)]}">{esc(lbl)}</span>'
                for i, (lbl, _) in enumerate(clean)
            )
            + "</div>"
        )
    if dropped:
        out.append(f"<div class=muted>{dropped} point(s) not finite, left out</div>")
    out.append("</figure>")
    return "".join(out)


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
