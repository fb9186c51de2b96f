"""Tables of where a test run's time went, from the lines tests/python/cpu_profile.py wrote.

    bash scripts/test.sh --cpu-profile /tmp/prof.jsonl             # or any pytest run with --cpu-profile
    python scripts/test_profile.py /tmp/prof.jsonl [--top 25]       # markdown tables

Per module: tests, test-seconds (wall summed over tests), CPU-seconds of the tests' process trees,
processes started (ranks forked from the forkserver, new Python interpreters, others). Then the
tests with the most CPU. docs/testing.md, "CI time", holds the last output.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict


def load(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def table(rows: list[dict], top: int) -> str:
    mods: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in rows:
        m = mods[r["test"].split("::", 1)[0].rsplit("/", 1)[-1]]
        m["tests"] += 1
        for k in ("wall", "cpu", "fork", "python", "other"):
            m[k] += r.get(k, 0)
    total = {k: sum(m[k] for m in mods.values()) for k in ("tests", "wall", "cpu", "fork", "python", "other")}
    out = ["| module | tests | test-s | CPU-s | forked ranks | interpreters | other processes |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for name, m in sorted(mods.items(), key=lambda kv: -kv[1]["cpu"]):
        out.append(f"| {name} | {m['tests']:.0f} | {m['wall']:.0f} | {m['cpu']:.0f} | {m['fork']:.0f} | "
                   f"{m['python']:.0f} | {m['other']:.0f} |")
    out.append(f"| **all** | {total['tests']:.0f} | {total['wall']:.0f} | {total['cpu']:.0f} | {total['fork']:.0f} | "
               f"{total['python']:.0f} | {total['other']:.0f} |")
    out += ["", f"The {top} tests with the most CPU:", "",
            "| test | wall s | CPU-s | forked | interpreters |", "|---|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: -r["cpu"])[:top]:
        out.append(f"| {r['test'].split('/')[-1]} | {r['wall']:.1f} | {r['cpu']:.1f} | {r.get('fork', 0)} | "
                   f"{r.get('python', 0)} |")
    sources = {r.get("cpu_source") for r in rows}
    if sources != {"cgroup"}:
        out.append(f"\n(CPU source: {sorted(s for s in sources if s)}; 'rusage' misses forkserver ranks)")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    print(table(load(args.file), args.top))


if __name__ == "__main__":
    main()
