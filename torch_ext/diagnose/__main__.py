"""``python -m torch_ext.diagnose DUMP_DIR [--html report.html] [--json]``."""
from __future__ import annotations

import argparse
import json
import os
import sys

from torch_ext.diagnose import analyze_dir, format_text
from torch_ext.diagnose.html import render


def _version() -> str:
    import torch

    import torch_ext
    from torch_ext import _extension

    return (f"torch_ext {torch_ext.__version__} (compiled against torch {_extension.built_against() or '(not recorded)'}, "
            f"running torch {torch.__version__}) at {os.path.dirname(torch_ext.__file__)}")


class _PrintVersion(argparse.Action):
    """Like argparse's "version" action, without re-wrapping the line (it holds a path)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(_version())
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m torch_ext.diagnose",
        description="Cross-rank analysis of the per-rank dumps a guarded job wrote to TORCH_EXT_DUMP_DIR.",
    )
    ap.add_argument("dump_dir", help="the folder holding rank<N>.json dumps")
    ap.add_argument("--html", metavar="FILE", help="also write a self-contained timeline page")
    ap.add_argument("--json", action="store_true", help="print the analysis as JSON instead of text")
    ap.add_argument("--version", action=_PrintVersion,
                    help="print torch_ext's version and the torch it was compiled against, and exit")
    args = ap.parse_args(argv)
    try:
        analysis = analyze_dir(args.dump_dir)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({
            "ranks": analysis.ranks,
            "bad_files": [{"path": b.path, "reason": b.reason} for b in analysis.bad],
            "groups": analysis.verdicts,
        }, indent=2))
    else:
        print(format_text(analysis))
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(render(analysis, title=f"torch_ext diagnose: {args.dump_dir}"))
        if not args.json:
            print(f"\nwrote {args.html}")
    if not analysis.dumps:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
