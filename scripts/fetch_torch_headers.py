#!/usr/bin/env python3
"""Fetches one torch release's C++ headers (torch/include) without downloading its wheel.

    python scripts/fetch_torch_headers.py VERSION DEST [--python 3.12] [--platform manylinux_2_28_x86_64]

A torch wheel is a zip of about 530 MB; its headers are about 10 MB of it, stored
together. This reads the wheel's file list from the package index (PEP 691 JSON, or
the PEP 503 HTML page), then only the zip's central directory and the byte span
that holds ``torch/include/`` (HTTP range requests, 3 or 4 in all), and unpacks
that span into ``DEST/torch/include`` (atomically: a partial folder is renamed at
the end). Every member's CRC-32 is checked as it is unpacked.

The index is ``$PIP_INDEX_URL`` or https://pypi.org/simple. Exit status 0 when
DEST holds the headers, 2 with one line on stderr naming what failed (no such
release for that Python/platform, an index or host that does not answer ranges).
Used by ``scripts/check_torch_headers.sh`` (issue 41).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import struct
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import zipfile

PREFIX = "torch/include/"
TIMEOUT = 60.0


def fail(message: str) -> None:
    print(f"fetch_torch_headers: {message}", file=sys.stderr)
    sys.exit(2)


def wheel_url(index: str, version: str, python: str, platform: str) -> tuple[str, int | None]:
    """The URL (and size, when the index says it) of torch==VERSION's wheel for cpPY on PLATFORM."""
    page = index.rstrip("/") + "/torch/"
    request = urllib.request.Request(page, headers={
        "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
        body = response.read()
        kind = response.headers.get("Content-Type", "")
    if "json" in kind:
        files = [(f["filename"], f["url"], f.get("size")) for f in json.loads(body)["files"]]
    else:  # PEP 503: <a href="URL#sha256=...">FILENAME</a>
        files = [(name, href, None) for href, name in
                 re.findall(r'<a[^>]*href="([^"]+)"[^>]*>([^<]+)</a>', body.decode("utf-8", "replace"))]
    tag = "cp" + python.replace(".", "")
    wanted = f"torch-{version}-{tag}-{tag}-{platform}.whl"
    for name, url, size in files:
        if name == wanted:
            return urllib.parse.urljoin(page, url.split("#", 1)[0]), size
    near = sorted({n for n, _, _ in files if n.startswith(f"torch-{version}-")})
    fail(f"{page} has no {wanted}" + (f"; for {version} it has: {', '.join(near)}" if near else
                                      f"; no wheel of torch {version} at all"))
    raise AssertionError  # not reached


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file through HTTP range requests.

    ``load(start, end)`` fetches a span once; reads inside a loaded span cost
    nothing, reads elsewhere fetch exactly what they ask for.
    """

    def __init__(self, url: str, size: int | None) -> None:
        super().__init__()
        self.url = url
        self.requests = 0
        self.fetched = 0
        self.pos = 0
        self.spans: list[tuple[int, bytes]] = []
        self.size = size if size is not None else self._size()

    def _get(self, start: int, end: int) -> bytes:
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={start}-{end - 1}"})
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            if response.status != 206:
                fail(f"{self.url} does not answer range requests (HTTP {response.status}); "
                     f"pass a downloaded wheel to scripts/check_torch_headers.sh instead")
            data = response.read()
        self.requests += 1
        self.fetched += len(data)
        if len(data) != end - start:
            fail(f"{self.url}: asked for bytes {start}-{end - 1}, got {len(data)} bytes")
        return data

    def _size(self) -> int:
        request = urllib.request.Request(self.url, headers={"Range": "bytes=0-0"})
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            total = response.headers.get("Content-Range", "").rpartition("/")[2]
        if not total.isdigit():
            fail(f"{self.url} does not say its size (no Content-Range): it does not answer range requests")
        return int(total)

    def load(self, start: int, end: int) -> None:
        self.spans.append((start, self._get(start, end)))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.size}[whence]
        self.pos = base + offset
        return self.pos

    def readinto(self, buffer) -> int:  # noqa: ANN001 - a writable buffer
        n = min(len(buffer), self.size - self.pos)
        if n <= 0:
            return 0
        for start, data in self.spans:
            if start <= self.pos and self.pos + n <= start + len(data):
                buffer[:n] = data[self.pos - start:self.pos - start + n]
                break
        else:
            buffer[:n] = self._get(self.pos, self.pos + n)
        self.pos += n
        return n


def fetch(version: str, dest: str, python: str, platform: str, index: str) -> None:
    started = time.monotonic()
    url, size = wheel_url(index, version, python, platform)
    remote = RangeFile(url, size)
    # The zip's end record (the last 22 bytes, after a comment of up to 64 KiB)
    # says where its central directory starts: then one request for all of it.
    tail = remote.size - min(remote.size, (64 << 10) + 22)
    remote.load(tail, remote.size)
    end_record = remote.spans[-1][1]
    at = end_record.rfind(b"PK\x05\x06")
    if at < 0 or at + 22 > len(end_record):
        fail(f"{url} is not a zip (no end of central directory record)")
    directory = struct.unpack("<I", end_record[at + 16:at + 20])[0]
    if directory == 0xFFFFFFFF:  # ZIP64: its own end record says; the last 4 MB hold it for any wheel
        directory = max(0, remote.size - (4 << 20))
    if directory < tail:
        remote.load(directory, remote.size)
    archive = zipfile.ZipFile(io.BufferedReader(remote, buffer_size=1 << 16))
    members = sorted(archive.infolist(), key=lambda info: info.header_offset)
    headers = [i for i, info in enumerate(members) if info.filename.startswith(PREFIX)]
    if not headers:
        fail(f"{url} holds no {PREFIX}")
    # The span from the first header member's local entry to the entry after the last one.
    start = members[headers[0]].header_offset
    last = headers[-1]
    end = members[last + 1].header_offset if last + 1 < len(members) else archive.start_dir
    remote.load(start, end)
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    partial = tempfile.mkdtemp(prefix=os.path.basename(dest) + ".partial.", dir=os.path.dirname(os.path.abspath(dest)))
    try:
        for i in headers:
            archive.extract(members[i], partial)  # zipfile checks each member's CRC-32
        with open(os.path.join(partial, "wheel.txt"), "w") as f:
            f.write(f"{url.rsplit('/', 1)[-1]} {remote.size} bytes; {len(headers)} headers fetched by range\n")
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(partial, dest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    print(f"fetch_torch_headers: torch {version}: {len(headers)} headers from {url.rsplit('/', 1)[-1]} "
          f"({remote.size // 1_000_000} MB wheel): {remote.fetched / 1e6:.1f} MB in {remote.requests} "
          f"range requests, {time.monotonic() - started:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", help="a torch release, e.g. 2.11.0")
    parser.add_argument("dest", help="the folder to create: DEST/torch/include")
    parser.add_argument("--python", default="3.12", help="the wheel's Python (default 3.12)")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64", help="the wheel's platform tag")
    args = parser.parse_args()
    index = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    try:
        fetch(args.version, args.dest, args.python, args.platform, index)
    except (OSError, zipfile.BadZipFile) as e:  # urllib's errors are OSErrors
        fail(f"torch {args.version}: {e}")


if __name__ == "__main__":
    main()
