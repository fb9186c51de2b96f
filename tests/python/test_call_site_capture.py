"""The call site of a collective, captured on the issuing thread without taking the GIL back (issue 70).

torch's binding releases the GIL before a collective reaches the guard. A site the thread has
captured before is found from its own frame records without the GIL; the first capture of a
site takes it. These tests hold the capture to what it named before: the issuing line, on
every thread, with another Python thread holding the GIL, and again after the library list
changed (each thread's copy of the decisions is dropped).
"""

from __future__ import annotations

import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import torch_ext

pytestmark = pytest.mark.timeout(120)

_HELPER = '''
import torch
import torch.distributed as dist


def reduce_here(group):
    dist.all_reduce(torch.ones(1), group=group)  # mylab_line
'''


def _frames(group: dist.ProcessGroup) -> list[dict]:
    return torch_ext.ledger(group, 1)[-1]["frames"]


def _line(path: Path, marker: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if marker in text)


@pytest.fixture
def world_of_one(tmp_path, monkeypatch):
    package = tmp_path / "capturelab"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text(textwrap.dedent(_HELPER))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    dist.init_process_group("guard", store=dist.HashStore(), rank=0, world_size=1)
    yield package / "helper.py"
    dist.destroy_process_group()
    sys.modules.pop("capturelab.helper", None)
    sys.modules.pop("capturelab", None)


def test_a_site_captured_again_without_the_gil_names_the_same_line(world_of_one):
    from capturelab import helper

    group = dist.group.WORLD
    here = sys._getframe().f_lineno
    for _ in range(3):  # the first capture takes the GIL, the next two read this thread's copy
        helper.reduce_here(group)
        frames = _frames(group)
        assert (frames[0]["filename"].endswith("helper.py"), frames[0]["line"]) == (
            True, _line(world_of_one, "mylab_line")), frames
    lines = []
    for _ in range(2):
        dist.all_reduce(torch.ones(1))
        lines.append(_frames(group)[0]["line"])
    assert lines == [here + 8, here + 8], (here, lines)


def test_each_thread_names_its_own_line_while_another_holds_the_gil(world_of_one):
    from capturelab import helper

    group = dist.group.WORLD
    stop = threading.Event()

    def spin():  # pure Python: holds the GIL but for the switch interval
        while not stop.is_set():
            pass

    found: dict[str, object] = {}

    def issue():
        try:
            for _ in range(3):
                dist.all_reduce(torch.ones(1))  # thread_line
                found.setdefault("thread", []).append(_frames(group)[0]["line"])
        except Exception as e:  # noqa: BLE001 - handed to the main thread's assertion
            found["error"] = e

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        for _ in range(3):
            helper.reduce_here(group)
            found.setdefault("main", []).append(_frames(group)[0]["line"])
        worker = threading.Thread(target=issue)
        worker.start()
        worker.join(timeout=60)
        assert not worker.is_alive()
    finally:
        stop.set()
        spinner.join(timeout=10)
    assert "error" not in found, found
    assert found["main"] == [_line(world_of_one, "mylab_line")] * 3, found
    assert found["thread"] == [_line(Path(__file__), "# thread_line")] * 3, found


def test_listing_a_package_after_captures_moves_the_site_to_its_caller(world_of_one):
    from capturelab import helper

    group = dist.group.WORLD

    def call():
        helper.reduce_here(group)  # caller_line

    sites, listed = [], None
    try:
        for i in range(4):  # one loop: the same stack before and after
            if i == 2:
                # A group created with the package listed: the decisions cached so far, this
                # thread's copies included, are dropped, and the same call now names its caller.
                listed = dist.new_group(
                    [0], backend="guard", pg_options=torch_ext.GuardOptions(library_packages=["capturelab"]))
            call()
            sites.append(_frames(group)[0])
    finally:
        if listed is not None:
            dist.destroy_process_group(listed)
    lines = [(Path(f["filename"]).name, f["line"]) for f in sites]
    assert lines == [("helper.py", _line(world_of_one, "mylab_line"))] * 2 + [
        (Path(__file__).name, _line(Path(__file__), "# caller_line"))] * 2, sites
