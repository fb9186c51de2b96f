#!/usr/bin/env python
"""Compares two result files of run_torch_suite.py and prints Markdown.

    python tests/conformance/summarize.py build/conformance/guard.json build/conformance/gloo.json

Prints: counts per backend; every test whose outcome differs; every failure
(with the baseline's outcome next to it); skip reasons grouped, with the number
of tests each reason skips on each backend.
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter, defaultdict

# Groups of skip reasons, first match wins. Reasons are the suite's own texts.
GROUPS = [
    # Tests gated by comparing the backend's name with "gloo" (or a fixed list of
    # names): they skip for guard although guard serves CPU tensors through gloo.
    ("gated on the backend name",
     re.compile(r"one of \{'gloo'\}|\{'nccl', 'gloo', 'ucc'\}|GLOO|Only [Gg]loo|get_future is only|Nccl & Gloo|"
                r"Gloo and N(CCL|ccl)|backend does not support|supports timeouts")),
    ("needs GPUs (CUDA) or NCCL", re.compile(r"CUDA|GPU|NCCL|Nccl|nccl|high priority stream")),
    ("needs another world size", re.compile(r"world size|worldsize", re.I)),
    ("MPI-only", re.compile(r"MPI")),
    ("disabled or flaky upstream", re.compile(r"github\.com/pytorch|[Ff]laky|flakiness|is failing|Skipped internally")),
    ("needs INIT_METHOD=file://", re.compile(r"file:// initialization")),
    ("optional package missing", re.compile(r"torchvision|import", re.I)),
]


def group_of(reason: str) -> str:
    for name, rx in GROUPS:
        if rx.search(reason):
            return name
    return "other"


def load(path: str) -> tuple[dict, dict]:
    with open(path) as f:
        doc = json.load(f)
    return doc.get("meta", {}), doc["results"]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    (meta_a, a), (meta_b, b) = load(argv[1]), load(argv[2])
    name_a, name_b = meta_a.get("backend", "A"), meta_b.get("backend", "B")
    names = sorted(set(a) | set(b))

    print(f"## Counts (torch {meta_a.get('torch')}, world size {meta_a.get('world_size')}, "
          f"{meta_a.get('tests_in_suite')} tests)\n")
    print("| backend | passed | skipped | failed | not recorded |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, res in ((name_a, a), (name_b, b)):
        c = Counter(res[n]["status"] for n in names if n in res)
        print(f"| {label} | {c['passed']} | {c['skipped']} | {c['failed']} | {sum(1 for n in names if n not in res)} |")

    print(f"\n## Outcomes that differ ({name_a} vs {name_b})\n")
    print(f"| test | {name_a} | {name_b} |")
    print("| --- | --- | --- |")
    for n in names:
        sa, sb = a.get(n, {}).get("status", "-"), b.get(n, {}).get("status", "-")
        if sa != sb:
            ra = a.get(n, {}).get("reason", "")
            rb = b.get(n, {}).get("reason", "")
            print(f"| `{n}` | {sa}{': ' + ra if ra else ''} | {sb}{': ' + rb if rb else ''} |")

    for label, res, other_label, other in ((name_a, a, name_b, b), (name_b, b, name_a, a)):
        fails = [n for n in names if res.get(n, {}).get("status") == "failed"]
        print(f"\n## Failures on {label} ({len(fails)})\n")
        for n in fails:
            print(f"- `{n}` ({res[n].get('seconds')} s; {other_label}: {other.get(n, {}).get('status', '-')}): "
                  f"{res[n].get('reason', '')}")

    print("\n## Skip reasons\n")
    print(f"| group | reason | {name_a} | {name_b} |")
    print("| --- | --- | ---: | ---: |")
    rows: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for i, res in enumerate((a, b)):
        for n in names:
            e = res.get(n)
            if e and e["status"] == "skipped":
                reason = re.sub(r"\s*\[rank: .*\]$", "", e.get("reason", ""))
                if reason.startswith("Test skipped at subprocess level"):
                    m = re.search(r"\[rank: (.*)\]$", e.get("reason", ""))
                    reason = m.group(1) if m else reason
                group = group_of(reason)
                reason = reason.replace(f"backend {name_a} ", "backend <backend> ").replace(
                    f"backend {name_b} ", "backend <backend> ").replace(f"The {name_a} ", "The <backend> ").replace(
                    f"The {name_b} ", "The <backend> ")
                rows[(group, reason)][i] += 1
    order = [g for g, _ in GROUPS] + ["other"]
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for (g, reason), (x, y) in sorted(rows.items(), key=lambda kv: (order.index(kv[0][0]), -kv[1][0], kv[0][1])):
        print(f"| {g} | {reason} | {x} | {y} |")
        totals[g][0] += x
        totals[g][1] += y
    print(f"\n| group | {name_a} | {name_b} |")
    print("| --- | ---: | ---: |")
    for g in order:
        if g in totals:
            print(f"| {g} | {totals[g][0]} | {totals[g][1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
