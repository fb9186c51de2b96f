"""The layout of csrc/guard is part of the architecture (docs/architecture.md, "Layout"):
these checks read the sources, so a change that breaks a rule fails here with the file named."""
from __future__ import annotations

import pathlib
import re

GUARD = pathlib.Path(__file__).resolve().parents[2] / "csrc" / "guard"
INCLUDE = re.compile(r'^#include "guard/([^"]+)"', re.M)


def _sources(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix in (".h", ".cpp"))


def test_the_rooms_exist_and_hold_every_source():
    rooms = {p.name for p in GUARD.iterdir() if p.is_dir()}
    assert rooms == {"report", "collective", "watchdog", "device"}
    at_root = {p.stem for p in GUARD.iterdir() if p.is_file()}
    assert at_root == {"Config", "Errors", "Runtime", "TorchCompat"}, at_root


def test_the_report_layer_includes_nothing_from_the_live_side():
    offenders = []
    for src in _sources(GUARD / "report"):
        for inc in INCLUDE.findall(src.read_text()):
            if not inc.startswith("report/"):
                offenders.append(f"{src.relative_to(GUARD)} includes guard/{inc}")
    assert not offenders, "\n".join(offenders)


def test_the_device_layer_includes_only_itself_and_the_root():
    # device/ (the stream gate) sits under collective/: it knows words, streams and
    # tensors, not groups, verifiers or the watchdog.
    offenders = []
    for src in _sources(GUARD / "device"):
        for inc in INCLUDE.findall(src.read_text()):
            if "/" in inc and not inc.startswith("device/"):
                offenders.append(f"{src.relative_to(GUARD)} includes guard/{inc}")
    assert not offenders, "\n".join(offenders)


def test_the_root_includes_only_the_report_layer():
    offenders = []
    for src in GUARD.glob("*.*"):
        for inc in INCLUDE.findall(src.read_text()):
            if "/" in inc and not inc.startswith("report/"):
                offenders.append(f"{src.name} includes guard/{inc}")
    assert not offenders, "\n".join(offenders)


def test_store_keys_are_spelled_only_in_store_keys_h():
    key = re.compile(r'"(guard|st|alert|once|snap|report|strict|p2p)/|"alerts"')
    offenders = []
    for src in _sources(GUARD):
        if src.name == "StoreKeys.h":
            continue
        for n, line in enumerate(src.read_text().splitlines(), 1):
            code = line.split("//", 1)[0]
            if key.search(code) and not code.lstrip().startswith("#include"):
                offenders.append(f"{src.relative_to(GUARD)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_ops_and_states_are_compared_as_enums_not_strings():
    cmp = re.compile(r'\b(state|op|kind|phase|subject)\s*[!=]=\s*"')
    offenders = []
    for src in _sources(GUARD):
        for n, line in enumerate(src.read_text().splitlines(), 1):
            if cmp.search(line):
                offenders.append(f"{src.relative_to(GUARD)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
