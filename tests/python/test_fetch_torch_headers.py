"""scripts/fetch_torch_headers.py: a release's torch/include by range requests (issue 41).

CI checks the sources against torch 2.11's and 2.15's headers with it
(scripts/test.sh). Here it runs against a local package index that serves a
small wheel-shaped zip: the headers come out whole and checked, only their span
of the wheel travels, and a missing release or a host without ranges is one
clear line, exit 2.
"""
from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "fetch_torch_headers.py"
WHEEL = "torch-9.9.0-cp312-cp312-manylinux_2_28_x86_64.whl"
HEADERS = {
    "torch/include/torch/version.h": b"#define TORCH_VERSION_MAJOR 9\n",
    "torch/include/c10/core/Device.h": b"struct Device {};\n" * 200,
}


def _wheel(path: Path) -> None:
    # Large members on both sides of the headers, incompressible: a fetch that
    # took the whole file would be seen in the byte count.
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("torch/lib/libtorch_cpu.so", os.urandom(400_000))
        for name, data in HEADERS.items():
            z.writestr(name, data)
        z.writestr("torch/_C.so", os.urandom(400_000))
        z.writestr("torch-9.9.0.dist-info/RECORD", b"")


class _Index(http.server.BaseHTTPRequestHandler):
    """/simple/torch/ (PEP 691 JSON) and the wheel, with Range unless `ranges` is off."""

    wheel: bytes = b""
    ranges = True
    served = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/simple/torch/":
            body = json.dumps({"files": [{"filename": WHEEL, "url": f"/files/{WHEEL}", "size": len(self.wheel)}]})
            self._send(200, body.encode(), "application/vnd.pypi.simple.v1+json")
        elif self.path == f"/files/{WHEEL}":
            spec = self.headers.get("Range", "")
            if self.ranges and spec.startswith("bytes="):
                first, _, last = spec[6:].partition("-")
                start, end = int(first), int(last) + 1
                self._send(206, self.wheel[start:end], "application/octet-stream",
                           {"Content-Range": f"bytes {start}-{end - 1}/{len(self.wheel)}"})
            else:
                self._send(200, self.wheel, "application/octet-stream")
        else:
            self._send(404, b"not found", "text/plain")

    def _send(self, status: int, body: bytes, kind: str, extra: dict[str, str] | None = None) -> None:
        type(self).served += len(body) if status in (200, 206) and kind == "application/octet-stream" else 0
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def index(tmp_path):
    wheel = tmp_path / WHEEL
    _wheel(wheel)
    handler = type("Index", (_Index,), {"wheel": wheel.read_bytes(), "ranges": True, "served": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()


def _fetch(url: str, version: str, dest: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PIP_INDEX_URL": url}
    return subprocess.run([sys.executable, str(SCRIPT), version, str(dest)], capture_output=True, text=True,
                          timeout=60, env=env)


def test_the_headers_come_out_whole_and_only_their_span_travels(index, tmp_path):
    handler, url = index
    dest = tmp_path / "headers" / "9.9.0"
    done = _fetch(url, "9.9.0", dest)
    assert done.returncode == 0, done.stderr
    for name, data in HEADERS.items():
        assert (dest / name).read_bytes() == data
    assert not (dest / "torch" / "lib").exists() and not (dest / "torch" / "_C.so").exists()
    assert "2 headers" in done.stdout and WHEEL in (dest / "wheel.txt").read_text()
    # The zip's directory and the headers' span, not the two 400 KB members.
    assert handler.served < len(handler.wheel) / 4, (handler.served, len(handler.wheel))
    assert not [p for p in dest.parent.iterdir() if ".partial." in p.name]  # nothing half-written left


def test_a_release_the_index_lacks_is_one_line_naming_it(index, tmp_path):
    _, url = index
    done = _fetch(url, "9.8.0", tmp_path / "h")
    assert done.returncode == 2
    assert f"has no {WHEEL.replace('9.9.0', '9.8.0')}; no wheel of torch 9.8.0 at all" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "h").exists()


def test_a_host_without_range_requests_is_named_not_downloaded_whole(index, tmp_path):
    handler, url = index
    handler.ranges = False
    done = _fetch(url, "9.9.0", tmp_path / "h")
    assert done.returncode == 2
    assert "does not answer range requests" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "h").exists()
