"""Self-contained HTML page of a dump directory: ``diagnose DUMP_DIR --html FILE``.

One lane per rank and one column per operation, aligned across ranks by
collective seq (a send/recv sits after the collective it followed), so the
stuck op is one column: a bar per rank that issued it, a dashed "not issued"
box for a rank that has not. Bars carry the op and its seq; hovering shows
shapes, dtypes, call site, state and times. Each culprit lane (not arrived,
gone, differing) is tinted and shows its main thread's stack beneath it.

The page opens on a window of columns around the stuck op; the overview strip
(every column of every rank, one pixel row per rank) and the zoom and pan
controls reach the rest, so 1,024 entries x 32 ranks stay readable. Real time
lives in the Perfetto trace (``--trace``); this page is about who is where.
Below, per group with enough collectives, a table of the time each rank
waited in them, the straggler's row highlighted (stragglers.py).

No network access is needed: the data is embedded as JSON and drawn by a
small script (any current browser; checked with headless Chromium in tests).
"""
from __future__ import annotations

import html
import json
import math
import os
from typing import Any

from torch_ext.diagnose import Analysis, Dump, _loop, culprits, group_sizes
from torch_ext.diagnose._words import call_site, global_rank
from torch_ext.diagnose.stragglers import stragglers_from_snapshots

__all__ = ["render", "page_model"]

_STATES = {"completed": 0, "scheduled": 1, "failed": 2}


def _labelled(where: str, label: dict[str, Any] | None, site: list[dict[str, Any]] | None = None) -> str:
    """The call site followed by the entry's torch_ext.label, as the text report writes it
    (the origin left out when it is the call site's own line)."""
    if not label:
        return where
    text = f"{where} for {label.get('text', '')}"
    origin = label.get("origin")
    same = bool(origin and site and (origin[0]["filename"], origin[0]["line"]) == (site[0]["filename"], site[0]["line"]))
    if origin and not same:
        text += f" (asked for at {call_site(origin)})"
    return text


def _frame(f: dict[str, Any]) -> str:
    """One frame as the text report writes it: a library frame names its library."""
    name, lib = f["filename"], f.get("library", "")
    base = os.path.basename(name)
    where = f"{lib} .../{base}" if lib and base != name else f"{lib} {name}" if lib else base
    return f"{where}:{f['line']}" + (f" in {f['name']}" if f.get("name") else "")


def _stack(frames: list[dict[str, Any]], max_user: int = 4) -> list[str]:
    """A main thread's stack, innermost first, as the text report shows it: where the
    thread is now, then the user's frames, each run of library frames (torch's own,
    torch_ext's, the standard library's) folded into one "... N torch frames ..."."""
    if not frames:
        return []
    user = [not f.get("library") for f in frames]
    parts, users, i = [_frame(frames[0])], int(user[0]), 1
    while i < len(frames) and users < max_user:
        if user[i]:
            parts.append(_frame(frames[i]))
            users, i = users + 1, i + 1
            continue
        j = i
        while j < len(frames) and not user[j]:
            j += 1
        if j - i == 1 and j < len(frames):
            parts.append(_frame(frames[i]))
        else:
            libs = list(dict.fromkeys(f.get("library", "") for f in frames[i:j]))
            parts.append(f"... {j - i} {', '.join(libs)} frame{'s' if j - i > 1 else ''} ...")
        i = j
    if i < len(frames):
        rest = len(frames) - i
        parts.append(f"... {rest} outer frame{'s' if rest > 1 else ''}")
    return parts


def _group(d: Dump, name: str) -> dict[str, Any] | None:
    for g in d.data.get("groups", []):
        if g["name"] == name:
            return g
    return None


def _stuck(verdict: dict[str, Any]) -> tuple[int, bool]:
    """(seq, is_p2p) of the op the verdict is about; seq 0: none."""
    seq = int(verdict.get("seq") or 0)
    if seq:
        return seq, False
    if verdict.get("kind") in ("hang", "failure", "mismatch") and verdict.get("pending", True):
        return 0, True  # a point-to-point op: the oldest unfinished p2p entry of each rank
    return 0, False


def page_model(a: Analysis) -> dict[str, Any]:
    """What the page draws, as plain data (embedded in the page as JSON)."""
    sizes = group_sizes(a.dumps)
    groups = []
    for v in a.verdicts:
        name = v.get("group_name", "")
        blamed = culprits(v)
        stuck_seq, stuck_p2p = _stuck(v)
        lanes_raw = []
        cols: set[tuple[int, int]] = set()
        t0 = None
        for d in sorted(a.dumps, key=lambda d: d.rank):
            g = _group(d, name)
            if g is None:
                continue
            entries = g.get("entries", [])
            first_coll = next((e for e in entries if not e["is_p2p"]), None)
            last = int(first_coll["collective_seq_id"]) - 1 if first_coll else int(g["last_seq"])
            k = 0
            placed = []
            stuck_p2p_done = False
            for e in entries:
                if not e["is_p2p"]:
                    last, k = int(e["collective_seq_id"]), 0
                    key = (last, 0)
                else:
                    k += 1
                    key = (last, k)
                cols.add(key)
                start = int(e["time_created_ns"])
                t0 = start if t0 is None else min(t0, start)
                is_stuck = (not e["is_p2p"] and stuck_seq and key[0] == stuck_seq)
                if stuck_p2p and e["is_p2p"] and e["state"] != "completed" and not stuck_p2p_done:
                    is_stuck = stuck_p2p_done = True
                placed.append((key, e, bool(is_stuck)))
            lanes_raw.append((d, g, placed))
        ordered = sorted(cols)
        index = {c: i for i, c in enumerate(ordered)}
        ops: list[list[Any]] = []
        op_index: dict[tuple, int] = {}
        lanes = []
        world = sizes.get(name, 0)
        have = {}
        for d, g, placed in lanes_raw:
            cells = []
            for key, e, is_stuck in placed:
                desc = (e.get("fingerprint", e["op"]), _labelled(call_site(e.get("frames", [])), e.get("label"), e.get("frames")), json.dumps(e["input_sizes"]),
                        ",".join(e["input_dtypes"]))
                if desc not in op_index:
                    op_index[desc] = len(ops)
                    short = e["op"] if not e["is_p2p"] else f"{e['op']} r{global_rank(g, int(e.get('peer', -1)))}"
                    ops.append([short, *desc])
                start = int(e["time_created_ns"]) - (t0 or 0)
                done = e.get("time_discovered_completed_ns")
                cell = [index[key], op_index[desc], _STATES.get(e["state"], 0), round(start / 1e6, 3),
                        round((int(done) - int(e["time_created_ns"])) / 1e6, 3) if done else None,
                        0 if e["is_p2p"] else int(e["collective_seq_id"]), 1 if is_stuck else 0]
                if e.get("error"):
                    cell.append(e["error"])
                cells.append(cell)
            main = d.data.get("main_thread", {})
            have[int(g["rank"])] = {
                "rank": d.rank, "host": d.data.get("hostname", ""), "pid": d.data.get("pid"),
                "dump_ms": round((int(d.data.get("time_ns", 0)) - (t0 or 0)) / 1e6, 3),
                "last_seq": int(g["last_seq"]), "cells": cells,
                "stack": _stack(main.get("frames", [])),
                "note": main.get("note", ""),
            }
        global_ranks = None
        for d, g, _ in lanes_raw:
            global_ranks = [int(r) for r in g["ranks"]]
            break
        for gr in range(world):
            lane = have.get(gr)
            rank = global_ranks[gr] if global_ranks and gr < len(global_ranks) else gr
            if lane is None:
                lane = {"rank": rank, "missing": True, "cells": [], "stack": [], "note": "", "last_seq": -1}
            lane["culprit"] = blamed.get(lane["rank"])
            lanes.append(lane)
        stuck_col = -1
        if stuck_seq and (stuck_seq, 0) in index:
            stuck_col = index[(stuck_seq, 0)]
        elif stuck_p2p:
            stuck_cols = [c[0] for lane in lanes for c in lane["cells"] if c[6]]
            stuck_col = min(stuck_cols) if stuck_cols else -1
        groups.append({
            "name": name, "label": v.get("group", name), "kind": v["kind"], "text": v.get("text", ""),
            "seq": stuck_seq, "cols": [list(c) for c in ordered], "stuck_col": stuck_col, "ops": ops,
            "lanes": lanes, "culprits": {str(r): why for r, why in blamed.items()},
            "t0_ns": t0 or 0,
        })
    return {"ranks": a.ranks, "bad": [[b.path, b.reason] for b in a.bad], "groups": groups}


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out: list[str] = []
    last: int | None = None
    for r in sorted(ranks):
        if out and last is not None and r == last + 1:
            first = out.pop().split("-")[0]
            out.append(f"{first}-{r}")
        else:
            out.append(str(r))
        last = r
    return ", ".join(out) or "(none)"


_CSS = """
body{font:13px/1.4 system-ui,sans-serif;margin:20px;color:#222;background:#fff}
h1{font-size:18px;margin:0 0 6px} h2{font-size:15px;margin:26px 0 6px}
pre{background:#f6f6f6;padding:10px;border-radius:4px;white-space:pre-wrap;margin:6px 0}
.bad{color:#a00}
.controls{margin:8px 0;display:flex;gap:6px;align-items:center;flex-wrap:wrap}
.controls button,.controls select{font:12px system-ui,sans-serif;padding:2px 8px}
.legend{display:flex;gap:14px;flex-wrap:wrap;margin:6px 0 10px;font-size:12px}
.legend span{display:inline-flex;align-items:center;gap:5px}
.sw{display:inline-block;width:18px;height:12px;border:1px solid #888}
.overview{border:1px solid #ccc;cursor:pointer;display:block;margin:4px 0}
svg.lanes text{font:11px ui-monospace,monospace}
svg.lanes .lane{fill:#fafafa;stroke:#e2e2e2}
svg.lanes .culprit{fill:#fff0f0;stroke:#d33}
svg.lanes .done{fill:#8ab4f8} svg.lanes .pending{fill:#fbbc04} svg.lanes .failed{fill:#ea4335}
svg.lanes .stuck{stroke:#d00;stroke-width:3}
svg.lanes .noissue{fill:#fff;stroke:#d00;stroke-width:1.5;stroke-dasharray:4 3}
svg.lanes .stack{fill:#7a1f1f}
svg.lanes .bar:hover{stroke:#000;stroke-width:1.5}
table.waits{border-collapse:collapse;margin:6px 0} table.waits td,table.waits th{padding:2px 10px;text-align:right}
table.waits th{border-bottom:1px solid #ccc} table.waits tr.straggler{background:#fff0f0;color:#b00;font-weight:bold}
table.waits .share{display:inline-block;height:10px;background:#8ab4f8;vertical-align:middle}
#tip{position:fixed;display:none;background:#222;color:#fff;font:12px/1.45 ui-monospace,monospace;
  padding:7px 9px;border-radius:4px;white-space:pre;pointer-events:none;max-width:720px;z-index:9}
"""

_JS = r"""
(function(){
const M = JSON.parse(document.getElementById('model').textContent);
const SVGNS = 'http://www.w3.org/2000/svg';
const STATE = ['completed', 'scheduled', 'failed'], CLS = ['done', 'pending', 'failed'];
const tip = document.getElementById('tip');
function el(tag, attrs, parent, text){
  const e = document.createElementNS(SVGNS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function secs(ms){ return ms === null || ms === undefined ? '?' : (Math.abs(ms) < 1000 ? ms.toFixed(1) + ' ms' : (ms/1000).toFixed(2) + ' s'); }
function fit(s, px){ const n = Math.max(1, Math.floor(px / 6.7)); return s.length <= n ? s : s.slice(0, Math.max(1, n-1)) + '\u2026'; }
// A bar's label: "#57 all_reduce" on one line where it fits, else seq above op.
function label2(svg, x, ly, w, top, bottom, color){
  const one = top + ' ' + bottom;
  if (one.length * 6.7 <= w - 6){ el('text', {x: x + 3, y: ly + 21, fill: color, 'pointer-events': 'none'}, svg, one); return; }
  el('text', {x: x + 3, y: ly + 15, fill: color, 'pointer-events': 'none'}, svg, fit(top, w - 6));
  el('text', {x: x + 3, y: ly + 27, fill: color, 'pointer-events': 'none'}, svg, fit(bottom, w - 6));
}
function tipText(G, lane, c){
  const op = G.ops[c[1]], t0 = c[3], dur = c[4], st = STATE[c[2]];
  const lines = ['rank ' + lane.rank + '  group "' + G.label + '"', (c[5] ? '#' + c[5] + ' ' : '') + op[1],
    'shapes: ' + op[3] + '   dtypes: ' + (op[4] || '-'), 'at ' + op[2],
    'state: ' + st + (st === 'completed' ? '' : '  (' + secs(lane.dump_ms - t0) + ' since issued, at the dump)'),
    'issued: +' + secs(t0) + (dur !== null ? '   took ' + secs(dur) : '')];
  if (c.length > 7) lines.push('error: ' + c[7]);
  return lines.join('\n');
}
function draw(G, gi, view){
  const host = document.getElementById('g' + gi);
  host.querySelectorAll('svg.lanes').forEach(n => n.remove());
  const W = Math.max(600, host.clientWidth || 1100), left = 190, laneH = 34, stackLine = 13, maxStack = 8;
  const ncol = G.cols.length, span = Math.min(view.n, ncol), first = Math.max(0, Math.min(view.start, ncol - span));
  view.start = first;
  const colW = (W - left - 10) / Math.max(1, span);
  let y = 22; const rows = [];
  for (const lane of G.lanes){
    const extra = lane.culprit ? Math.min(lane.stack.length || 1, maxStack) * stackLine + 8 : 0;
    rows.push([lane, y, extra]); y += laneH + extra + 4;
  }
  const svg = el('svg', {class: 'lanes', width: W, height: y + 8, 'data-first': first, 'data-span': span});
  for (let i = 0; i < span; i++){
    const col = G.cols[first + i], x = left + i * colW;
    el('text', {x: x + 2, y: 14, fill: '#666'}, svg, fit(col[1] ? '+p2p' : '#' + col[0], colW - 4));
  }
  for (const [lane, ly, extra] of rows){
    el('rect', {class: lane.culprit ? 'culprit' : 'lane', x: 0, y: ly, width: W, height: laneH + extra}, svg);
    el('text', {x: 6, y: ly + 13, 'font-weight': lane.culprit ? 'bold' : 'normal'}, svg,
       'rank ' + lane.rank + (lane.missing ? ' (no dump)' : ''));
    if (lane.culprit) el('text', {x: 6, y: ly + 25, fill: '#b00', class: 'why'}, svg, fit('culprit: ' + lane.culprit, left - 10));
    const byCol = new Map(lane.cells.map(c => [c[0], c]));
    for (let i = 0; i < span; i++){
      const ci = first + i, x = left + i * colW + 1, w = Math.max(2, colW - 2), c = byCol.get(ci);
      if (!c){
        const col = G.cols[ci];
        if (!col[1] && ci === G.stuck_col && lane.last_seq < col[0]){
          const r = el('rect', {class: 'noissue', x: x, y: ly + 3, width: w, height: laneH - 6, 'data-col': ci}, svg);
          el('title', {}, r, 'rank ' + lane.rank + (lane.missing ? ': no dump (gone?)' : ' has not issued #' + col[0] + ' (last issued #' + lane.last_seq + ')'));
          if (w > 40) label2(svg, x, ly, w, '#' + col[0], lane.missing ? 'no dump' : 'not issued', '#b00');
        }
        continue;
      }
      const op = G.ops[c[1]];
      const r = el('rect', {class: 'bar ' + CLS[c[2]] + (c[6] ? ' stuck' : ''), x: x, y: ly + 3, width: w,
                            height: laneH - 6, 'data-col': ci, 'data-seq': c[5], 'data-state': STATE[c[2]]}, svg);
      const text = tipText(G, lane, c);
      el('title', {}, r, text);
      r.addEventListener('mousemove', ev => { tip.textContent = text; tip.style.display = 'block';
        tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - 740) + 'px'; tip.style.top = (ev.clientY + 14) + 'px'; });
      r.addEventListener('mouseleave', () => { tip.style.display = 'none'; });
      if (w > 18){
        let what = op[0];
        if (c[2] !== 0 && w > 150) what += '  (' + secs(lane.dump_ms - c[3]) + ')';  // how long it has waited
        label2(svg, x, ly, w, c[5] ? '#' + c[5] : 'p2p', what, '#000');
      }
    }
    if (lane.culprit){
      const lines = lane.stack.length ? lane.stack.slice(0, maxStack) : [lane.missing ? '(no dump: the process is gone or never wrote one)' : '(main thread stack not available)'];
      el('text', {class: 'stack', x: left, y: ly + laneH + 8}, svg, 'main thread:');
      lines.forEach((s, k) => el('text', {class: 'stack', x: left + 92, y: ly + laneH + 8 + k * stackLine}, svg, s));
    }
  }
  host.appendChild(svg);
  const info = host.querySelector('.range');
  if (info) info.textContent = 'columns ' + (first + 1) + '-' + (first + span) + ' of ' + ncol;
  overview(G, gi, view);
}
function overview(G, gi, view){
  const cv = document.getElementById('ov' + gi); if (!cv) return;
  const ctx = cv.getContext('2d'), n = Math.max(1, G.cols.length), rowH = 3;
  cv.width = Math.max(600, (document.getElementById('g' + gi).clientWidth || 1100));
  cv.height = G.lanes.length * rowH + 4;
  const cw = cv.width / n, colors = ['#8ab4f8', '#fbbc04', '#ea4335'];
  ctx.fillStyle = '#fafafa'; ctx.fillRect(0, 0, cv.width, cv.height);
  G.lanes.forEach((lane, li) => {
    if (lane.culprit){ ctx.fillStyle = '#ffd6d6'; ctx.fillRect(0, 2 + li * rowH, cv.width, rowH); }
    for (const c of lane.cells){ ctx.fillStyle = colors[c[2]]; ctx.fillRect(c[0] * cw, 2 + li * rowH, Math.max(1, cw), rowH - 1); }
  });
  if (G.stuck_col >= 0){ const w = Math.min(Math.max(2, cw), 4); ctx.fillStyle = '#d00';
    ctx.fillRect(G.stuck_col * cw + (cw - w) / 2, 0, w, cv.height); }
  ctx.strokeStyle = '#000'; ctx.lineWidth = 1.5;
  ctx.strokeRect(view.start * cw + 0.5, 0.5, Math.max(2, Math.min(view.n, n) * cw) - 1, cv.height - 1);
}
const views = [];
M.groups.forEach((G, gi) => {
  const ncol = G.cols.length, around = G.stuck_col >= 0 ? G.stuck_col : ncol - 1;
  // As many columns as fit with readable labels (about 72 px each), 8 at least.
  const width = document.getElementById('g' + gi).clientWidth || 1100;
  const fits = [24, 16, 12, 8].find(o => o * 72 <= width - 200) || 8;
  const view = {n: Math.min(fits, Math.max(1, ncol)), start: 0};
  view.start = Math.max(0, Math.min(around - view.n + 4, ncol - view.n));
  const host = document.getElementById('g' + gi);
  const bar = host.querySelector('.controls');
  const sel = bar.querySelector('select');
  sel.value = String(fits);
  sel.addEventListener('change', () => { const c = view.start + Math.floor(view.n / 2);
    view.n = sel.value === 'all' ? ncol : +sel.value; view.start = Math.max(0, c - Math.floor(view.n / 2)); draw(G, gi, view); });
  bar.querySelector('.prev').addEventListener('click', () => { view.start = Math.max(0, view.start - Math.max(1, Math.floor(view.n / 2))); draw(G, gi, view); });
  bar.querySelector('.next').addEventListener('click', () => { view.start = view.start + Math.max(1, Math.floor(view.n / 2)); draw(G, gi, view); });
  bar.querySelector('.home').addEventListener('click', () => { view.start = Math.max(0, Math.min(around - view.n + 4, ncol - view.n)); draw(G, gi, view); });
  const cv = document.getElementById('ov' + gi);
  cv.addEventListener('click', ev => { const r = cv.getBoundingClientRect(), ci = Math.floor((ev.clientX - r.left) / r.width * ncol);
    view.start = Math.max(0, ci - Math.floor(view.n / 2)); draw(G, gi, view); });
  host.addEventListener('wheel', ev => { if (!ev.ctrlKey && !ev.altKey) return; ev.preventDefault();
    const opts = [8, 16, 32, 64, 128, 256, 512, 1024]; let k = opts.findIndex(o => o >= view.n); if (k < 0) k = opts.length - 1;
    k = Math.max(0, Math.min(opts.length - 1, k + (ev.deltaY > 0 ? 1 : -1)));
    const c = view.start + Math.floor(view.n / 2); view.n = Math.min(ncol, opts[k]); view.start = Math.max(0, c - Math.floor(view.n / 2)); draw(G, gi, view); }, {passive: false});
  views.push(view);
  draw(G, gi, view);
});
window.addEventListener('resize', () => M.groups.forEach((G, gi) => draw(G, gi, views[gi])));
document.body.setAttribute('data-rendered', '1');
})();
"""

_LEGEND = (
    "<div class='legend'>"
    "<span><i class='sw' style='background:#8ab4f8'></i>completed</span>"
    "<span><i class='sw' style='background:#fbbc04'></i>pending (scheduled)</span>"
    "<span><i class='sw' style='background:#ea4335'></i>failed</span>"
    "<span><i class='sw' style='background:#fbbc04;border:3px solid #d00;width:14px;height:8px'></i>the op the report is about</span>"
    "<span><i class='sw' style='border:1.5px dashed #d00'></i>not issued by this rank</span>"
    "<span><i class='sw' style='background:#fff0f0;border-color:#d33'></i>culprit lane, with its main thread's stack</span>"
    "<span>hover a bar for shapes, call site, state and times; Ctrl+wheel zooms; click the strip to jump</span>"
    "</div>"
)


def deadlocks(verdicts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The verdicts that found a deadlock across groups, one per distinct loop (each group on it finds it)."""
    out, seen = [], set()
    for v in verdicts:
        key = _loop(v)
        if key is not None and key not in seen:
            seen.add(key)
            out.append(v)
    return out


def _edge_label(site: dict[str, Any]) -> str:
    desc = site.get("desc") or site["group"]
    if site.get("peer") is not None:
        return f'{desc}: {site.get("direction", "p2p")}'
    op = site["what"].split(" ", 2)[-1].split("(")[0]  # "collective #1 all_reduce(...)" -> "all_reduce"
    return f'{desc} #{site["collective_seq_id"]} {op}'


def cycle_svg(verdict: dict[str, Any]) -> str:
    """The loop of waits as a drawing: ranks on a circle, an arrow from each waiting rank to each rank it waits
    for, labelled with the group and the operation it waits in (server-side SVG: no script needed)."""
    sites = verdict["wait_sites"]
    order: list[int] = []
    for s in sites:
        for r in [*s["waiters"], *s["waits_for"]]:
            if r not in order:
                order.append(int(r))
    n = len(order)
    size, radius, node = 420, 140, 27
    cx = cy = size / 2
    pos = {r: (cx + radius * math.sin(2 * math.pi * k / n), cy - radius * math.cos(2 * math.pi * k / n))
           for k, r in enumerate(order)}
    parts = [f"<svg class='cycle' xmlns='http://www.w3.org/2000/svg' width='{size}' height='{size}' "
             f"viewBox='0 0 {size} {size}' role='img' aria-label='{html.escape(verdict['text'].splitlines()[0])}'>",
             "<defs><marker id='arrow' viewBox='0 0 10 10' refX='9' refY='5' markerWidth='7' markerHeight='7' "
             "orient='auto-start-reverse'><path d='M0,0 L10,5 L0,10 z' fill='#b00'/></marker></defs>"]
    for s in sites:
        label = html.escape(_edge_label(s))
        for w in s["waiters"]:
            for t in s["waits_for"]:
                (x1, y1), (x2, y2) = pos[int(w)], pos[int(t)]
                dx, dy = x2 - x1, y2 - y1
                d = math.hypot(dx, dy) or 1.0
                ux, uy = dx / d, dy / d
                # Bend each arrow to its left so that two ranks waiting for each other get two arrows.
                mx, my = (x1 + x2) / 2 - uy * 28, (y1 + y2) / 2 + ux * 28
                sx, sy, ex, ey = x1 + ux * node, y1 + uy * node, x2 - ux * node, y2 - uy * node
                parts.append(f"<path class='wait' d='M{sx:.1f},{sy:.1f} Q{mx:.1f},{my:.1f} {ex:.1f},{ey:.1f}' "
                             f"fill='none' stroke='#b00' stroke-width='1.6' marker-end='url(#arrow)'>"
                             f"<title>rank {w} waits for rank {t}: {html.escape(s['what'])} on group "
                             f"{html.escape(s.get('desc') or s['group'])} at {html.escape(s.get('where', ''))}</title></path>")
                parts.append(f"<text x='{mx:.1f}' y='{my:.1f}' font-size='11' text-anchor='middle' "
                             f"fill='#700'>{label}</text>")
    for r, (x, y) in pos.items():
        parts.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='{node}' fill='#fff0f0' stroke='#d33' stroke-width='2'/>"
                     f"<text x='{x:.1f}' y='{y + 4:.1f}' font-size='11' font-weight='bold' "
                     f"text-anchor='middle'>rank {r}</text>")
    parts.append("</svg>")
    return "".join(parts)


def _waits_tables(a: Analysis) -> list[str]:
    """Per group with enough common collectives: each rank's share of the time waiting in them, the
    straggler's row highlighted (stragglers.py)."""
    out = []
    for g in stragglers_from_snapshots([d.text for d in a.dumps]):
        if not g["collectives"]:
            continue
        late = {s["rank"] for s in g["stragglers"]}
        said = " ".join(s["text"] for s in g["stragglers"]) or "no straggler"
        rows = "".join(
            ("<tr class='straggler'>" if r["rank"] in late else "<tr>") + f"<td>rank {r['rank']}</td>"
            f"<td>{r['wait_s']:.3f} s</td><td>{r['span_s']:.3f} s</td><td>{r['wait_share']:.0%} "
            f"<i class='share' style='width:{round(100 * min(1.0, r['wait_share']))}px'></i></td></tr>"
            for r in g["ranks"])
        out.append(f"<section class='stragglers'><h2>group {html.escape(g['group'])}: time waiting in collectives "
                   f"#{g['first_seq']}-#{g['last_seq']}</h2><p>{html.escape(said)}</p>"
                   "<table class='waits'><tr><th>rank</th><th>waited</th><th>span</th><th>share of span</th></tr>"
                   f"{rows}</table></section>")
    return out


def render(a: Analysis, title: str = "torch_ext diagnose") -> str:
    model = page_model(a)
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
           f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    out.append(f"<p>{len(a.dumps)} dump(s) from rank(s) {_ranges(a.ranks)}</p>")
    for b in a.bad:
        out.append(f"<p class='bad'>bad file {html.escape(b.path)}: {html.escape(b.reason)}</p>")
    for v in deadlocks(a.verdicts):
        out.append(f"<section class='deadlock'><h2>{html.escape(v['text'].split(':', 1)[0])}</h2>"
                   "<p>Each arrow: a rank waiting in an operation (group, collective or send/recv) for the rank "
                   "it points to, which waits elsewhere; the arrows close a loop, so none of them can finish.</p>"
                   f"{cycle_svg(v)}</section>")
    if model["groups"]:
        out.append(_LEGEND)
    for gi, g in enumerate(model["groups"]):
        blamed = ", ".join(f"rank {r} {why}" for r, why in g["culprits"].items())
        out.append(f"<section id='g{gi}' class='group'><h2>group {html.escape(g['label'])}: {html.escape(g['kind'])}"
                   f"{(' (culprits: ' + html.escape(blamed) + ')') if blamed else ''}</h2>")
        out.append(f"<pre>{html.escape(g['text'])}</pre>")
        out.append("<div class='controls'><button class='prev'>&#9664; earlier</button>"
                   "<button class='home'>stuck op</button><button class='next'>later &#9654;</button>"
                   "<label>columns <select>" + "".join(
                       f"<option>{n}</option>" for n in (8, 12, 16, 24, 32, 64, 128, 256))
                   + "<option>all</option></select></label><span class='range'></span></div>")
        out.append(f"<canvas class='overview' id='ov{gi}' title='every column of every rank; click to jump'></canvas>")
        if not g["cols"] and not g["lanes"]:
            out.append("<p>(no entries to draw)</p>")
        out.append("</section>")
    out.extend(_waits_tables(a))
    out.append("<div id='tip'></div>")
    data = json.dumps(model, separators=(",", ":")).replace("</", "<\\/")
    out.append(f"<script type='application/json' id='model'>{data}</script>")
    out.append(f"<script>{_JS}</script>")
    out.append("<noscript><p>This page draws its timeline with JavaScript; the report above is the same text.</p>"
               "</noscript></body></html>")
    return "\n".join(out)
