"""Who the others wait for: the straggler of each group, from the ledgers of dumps or live snapshots.

A rank's wait in a collective is its completion minus its issue time, on its
own clock: only durations are compared, so the ranks' clocks need not agree.
The rank that arrives last at a collective waits least; the others wait for it.

Per group, over the completed collectives (seq > 0) that every rank's ledger
holds, each rank's total wait and its share of the range's span (first issue
to last completion, on its own clock). A rank is named the straggler when its
wait is below the median of the others' by at least ``LOST_SHARE`` of the
median span, and it waited least in at least half of the collectives (one
odd collective does not make a straggler), over ``MIN_COLLECTIVES`` or more.
"""
from __future__ import annotations

import statistics
from typing import Any

from torch_ext.diagnose._words import call_site

__all__ = ["stragglers_from_snapshots", "format_stragglers", "MIN_COLLECTIVES", "LOST_SHARE"]

MIN_COLLECTIVES = 8  # fewer common collectives (a hang's dumps, often): no verdict
LOST_SHARE = 0.05  # the others' extra wait, as a share of the span, that names a straggler


def _completed(g: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """seq -> entry, for the group's completed collectives (no send/recv)."""
    return {int(e["collective_seq_id"]): e for e in g.get("entries", [])
            if not e.get("is_p2p") and int(e.get("collective_seq_id") or 0) > 0
            and e.get("state") == "completed" and e.get("time_discovered_completed_ns")}


def _wait_s(e: dict[str, Any]) -> float:
    return (int(e["time_discovered_completed_ns"]) - int(e["time_created_ns"])) / 1e9


def stragglers_from_snapshots(snapshots: list[dict[str, Any]],
                              min_collectives: int = MIN_COLLECTIVES) -> list[dict[str, Any]]:
    """One dict per group (dump or live-snapshot dicts in; see the module's docstring)::

        {"group": label, "group_name": name, "first_seq", "last_seq", "collectives", "median_wait_s",
         "ranks": [{"rank" (global), "wait_s", "span_s", "wait_share"}],
         "straggler": {"rank", "lost_s", "extra_s_per_collective", "share", "site"} or None}
    """
    groups: dict[str, dict[int, tuple[dict[str, Any], dict[int, dict[str, Any]]]]] = {}
    for snap in sorted(snapshots, key=lambda s: int(s["rank"])):
        for g in snap.get("groups", []):
            groups.setdefault(g["name"], {})[int(snap["rank"])] = (g, _completed(g))
    return [_group(name, ranks, min_collectives) for name, ranks in groups.items()]


def _group(name: str, ranks: dict[int, tuple[dict[str, Any], dict[int, dict[str, Any]]]],
           min_collectives: int) -> dict[str, Any]:
    first_group = next(iter(ranks.values()))[0]
    common = sorted(set.intersection(*(set(done) for _, done in ranks.values())))
    out: dict[str, Any] = {"group": first_group.get("desc") or name, "group_name": name,
                           "first_seq": common[0] if common else None, "last_seq": common[-1] if common else None,
                           "collectives": len(common), "median_wait_s": None, "ranks": [], "straggler": None}
    if not common:
        return out
    waits = {r: [_wait_s(done[s]) for s in common] for r, (_, done) in ranks.items()}
    spans = {r: (int(done[common[-1]]["time_discovered_completed_ns"]) - int(done[common[0]]["time_created_ns"])) / 1e9
             for r, (_, done) in ranks.items()}
    total = {r: sum(w) for r, w in waits.items()}
    out["median_wait_s"] = round(statistics.median(total.values()), 6)
    out["ranks"] = [{"rank": r, "wait_s": round(total[r], 6), "span_s": round(spans[r], 6),
                     "wait_share": round(total[r] / spans[r], 4) if spans[r] > 0 else 0.0} for r in sorted(ranks)]
    if len(ranks) < 2 or len(common) < min_collectives:
        return out
    late = min(total, key=lambda r: (total[r], r))  # waits least: the others wait for it
    lost = statistics.median(t for r, t in total.items() if r != late) - total[late]
    span = statistics.median(spans.values())
    least = sum(1 for i in range(len(common)) if min(waits, key=lambda r: (waits[r][i], r)) == late)
    if span <= 0 or lost < LOST_SHARE * span or 2 * least < len(common):
        return out
    sites: dict[str, float] = {}  # where the others waited for it: call site -> their extra wait
    for r, (_, done) in ranks.items():
        if r != late:
            for i, s in enumerate(common):
                site = call_site(done[s].get("frames", []))
                sites[site] = sites.get(site, 0.0) + waits[r][i] - waits[late][i]
    out["straggler"] = {"rank": late, "lost_s": round(lost, 6), "extra_s_per_collective": round(lost / len(common), 6),
                        "share": round(lost / span, 4), "site": max(sites, key=sites.get)}
    return out


def format_stragglers(results: list[dict[str, Any]], prefix: str = "") -> list[str]:
    """The text report's section: one line per group with a straggler, and its ranks' wait shares; [] if none."""
    lines: list[str] = []
    for g in results:
        s = g["straggler"]
        if not s:
            continue
        lines.append(f'{prefix}rank {s["rank"]} is the straggler on group "{g["group"]}" over collectives '
                     f'{g["first_seq"]}-{g["last_seq"]}: the other ranks waited on average '
                     f'{s["extra_s_per_collective"] * 1e3:.1f} ms per collective for it ({s["share"]:.0%} of the '
                     f'time), most at {s["site"]}')
        lines.append("  time each rank waited in these collectives: " +
                     ", ".join(f'rank {r["rank"]} {r["wait_share"]:.0%}' for r in g["ranks"]))
    return ["", "Stragglers:", *lines] if lines else []
