"""Self-contained HTML timeline of a dump directory: one lane per rank.

Each ledger entry is a bar from its creation to its completion (or to the dump
time if it never completed). The stuck collective is outlined in red on every
lane; ranks that have not arrived or are gone are marked in the lane label.
"""
from __future__ import annotations

import html
from typing import Any

from torch_ext.diagnose import Analysis

_CSS = """
body{font:13px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:18px} h2{font-size:15px;margin-top:28px}
pre{background:#f6f6f6;padding:10px;border-radius:4px;white-space:pre-wrap}
.bad{color:#a00} .lane{fill:#fafafa;stroke:#ddd} .culprit{fill:#fff0f0;stroke:#d33}
.done{fill:#8ab4f8} .pending{fill:#fbbc04} .failed{fill:#ea4335} .stuck{stroke:#d00;stroke-width:2.5}
text{font:11px monospace}
"""


def _entries(dump: Any, group: str) -> list[dict[str, Any]]:
    for g in dump.data.get("groups", []):
        if g["name"] == group:
            return g.get("entries", [])
    return []


def render(a: Analysis, title: str = "torch_ext diagnose") -> str:
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
           f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    out.append(f"<p>{len(a.dumps)} dump(s) from rank(s) {', '.join(map(str, a.ranks)) or '(none)'}</p>")
    for b in a.bad:
        out.append(f"<p class='bad'>bad file {html.escape(b.path)}: {html.escape(b.reason)}</p>")
    for v in a.verdicts:
        group = v.get("group_name", "")
        out.append(f"<h2>group {html.escape(v.get('group', group))}: {html.escape(v['kind'])}</h2>")
        out.append(f"<pre>{html.escape(v['text'])}</pre>")
        out.append(_timeline(a, group, v))
    out.append("</body></html>")
    return "\n".join(out)


def _timeline(a: Analysis, group: str, verdict: dict[str, Any]) -> str:
    lanes = []
    t0, t1 = None, None
    for d in sorted(a.dumps, key=lambda d: d.rank):
        entries = _entries(d, group)
        end = int(d.data.get("time_ns", 0))
        lanes.append((d, entries, end))
        for e in entries:
            start = int(e["time_created_ns"])
            t0 = start if t0 is None else min(t0, start)
            t1 = max(t1 or 0, end)
    if t0 is None or not t1 or t1 <= t0:
        return "<p>(no entries to draw)</p>"
    culprits = set(verdict.get("not_arrived", [])) | set(verdict.get("gone", []))
    stuck_seq = int(verdict.get("seq", 0) or 0)
    width, left, lane_h = 1100, 150, 34
    height = lane_h * len(lanes) + 30
    scale = (width - left - 10) / (t1 - t0)
    svg = [f"<svg width='{width}' height='{height}' xmlns='http://www.w3.org/2000/svg'>"]
    for i, (d, entries, end) in enumerate(lanes):
        y = 10 + i * lane_h
        cls = "culprit" if d.rank in culprits else "lane"
        svg.append(f"<rect class='{cls}' x='0' y='{y}' width='{width}' height='{lane_h - 4}'/>")
        label = f"rank {d.rank}" + (" (culprit)" if d.rank in culprits else "")
        svg.append(f"<text x='6' y='{y + 19}'>{html.escape(label)}</text>")
        for e in entries:
            start = int(e["time_created_ns"])
            done = e.get("time_discovered_completed_ns")
            stop = int(done) if done else end
            x = left + (start - t0) * scale
            w = max(2.0, (stop - start) * scale)
            state = {"completed": "done", "scheduled": "pending", "failed": "failed"}.get(e["state"], "done")
            stuck = " stuck" if stuck_seq and int(e["collective_seq_id"]) == stuck_seq and not e["is_p2p"] else ""
            where = e["frames"][0] if e.get("frames") else None
            tip = f"#{e['collective_seq_id']} {e['fingerprint']} [{e['state']}]"
            if where:
                tip += f" at {where['filename']}:{where['line']} in {where['name']}"
            svg.append(f"<rect class='{state}{stuck}' x='{x:.1f}' y='{y + 4}' width='{w:.1f}' height='{lane_h - 12}'>"
                       f"<title>{html.escape(tip)}</title></rect>")
    svg.append(f"<text x='{left}' y='{height - 4}'>0 s</text>")
    svg.append(f"<text x='{width - 80}' y='{height - 4}'>{(t1 - t0) / 1e9:.2f} s</text>")
    svg.append("</svg>")
    return "\n".join(svg)
