"""A static HTTP server for a dataset folder, with Range requests and a count of the bytes it sends.

What ``validate --metadata-only`` is measured against (scripts/bench_metadata_only.py) and tested
with (tests/validate/test_metadata_only.py): the standard library's ``http.server`` serving one
folder, as a static file server or a CDN does, plus

- ``Range: bytes=a-b`` (also ``a-`` and ``-n``): 206 with the slice and ``Content-Range``;
- HEAD with ``Content-Length`` (fsspec's ``info`` and episodekit's ``exists``);
- folder pages as HTML links (what fsspec's ``http`` filesystem lists), or none
  (``listing=False``: 404 for a folder, as many object stores serve);
- counters: requests, response body bytes sent (what the server put on the wire after the
  headers), and per path.

Usage: ``python scripts/range_server.py ROOT [--port 8000] [--no-listing]`` (Ctrl-C prints the
counts); in Python: ``with serve(root) as server: ... server.url ... server.body_bytes``.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
CHUNK = 1 << 16


class Counters:
    """What the server sent, summed over every request (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.body_bytes = 0
        self.by_path: collections.Counter[str] = collections.Counter()
        self.log: list[tuple[str, str, int]] = []  # (method, path, body bytes sent)

    def add(self, path: str, sent: int, method: str = "GET") -> None:
        with self.lock:
            self.body_bytes += sent
            self.by_path[path] += sent
            self.log.append((method, path, sent))

    def request(self) -> None:
        with self.lock:
            self.requests += 1


class RangeHandler(SimpleHTTPRequestHandler):
    """SimpleHTTPRequestHandler with single-range GET, counted bodies, optional folder pages."""

    protocol_version = "HTTP/1.1"
    counters: Counters
    listing = True

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base's signature
        pass

    def do_GET(self) -> None:
        self.counters.request()
        self._respond(body=True)

    def do_HEAD(self) -> None:
        self.counters.request()
        self._respond(body=False)
        self.counters.add(self.path.split("?", 1)[0], 0, "HEAD")

    def _respond(self, body: bool) -> None:
        path = self.translate_path(self.path)
        if os.path.isdir(path):
            if not self.listing:
                self.send_error(404, "no folder pages")
                return
            f = self.send_head()  # the base's redirect or HTML page, with Content-Length
            if f is not None:
                try:
                    if body:
                        self._copy(f, None)
                finally:
                    f.close()
            return
        try:
            f = open(path, "rb")
        except OSError:
            self.send_error(404, "File not found")
            return
        with f:
            size = os.fstat(f.fileno()).st_size
            start, end = 0, size  # [start, end)
            m = RANGE.match(self.headers.get("Range", "").strip())
            if m and (m.group(1) or m.group(2)):
                a, b = m.group(1), m.group(2)
                if a:
                    start, end = int(a), min(size, int(b) + 1) if b else size
                else:
                    start, end = max(0, size - int(b)), size
                if start >= size or start >= end:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
            else:
                self.send_response(200)
            self.send_header("Content-Type", self.guess_type(path))
            self.send_header("Content-Length", str(end - start))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if body:
                f.seek(start)
                self._copy(f, end - start)

    def _copy(self, f, n: int | None) -> None:
        """Send ``n`` bytes of ``f`` (None: to its end), counting what was written."""
        sent = 0
        try:
            while n is None or sent < n:
                chunk = f.read(CHUNK if n is None else min(CHUNK, n - sent))
                if not chunk:
                    break
                self.wfile.write(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up: what was written so far still counts
        finally:
            self.counters.add(self.path.split("?", 1)[0], sent)


class RangeServer:
    """A running server over ``root`` on ``host:port`` (0: any free port), in a thread."""

    def __init__(
        self, root: str | os.PathLike, host: str = "127.0.0.1", port: int = 0, listing: bool = True
    ) -> None:
        self.root = str(Path(root).resolve())
        self.counters = Counters()
        handler = type(
            "Handler",
            (RangeHandler,),
            {"counters": self.counters, "listing": listing},
        )

        def make(*args, **kwargs):
            return handler(*args, directory=self.root, **kwargs)

        self.httpd = ThreadingHTTPServer((host, port), make)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def body_bytes(self) -> int:
        return self.counters.body_bytes

    @property
    def requests(self) -> int:
        return self.counters.requests

    def start(self) -> RangeServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)

    def __enter__(self) -> RangeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(root: str | os.PathLike, port: int = 0, listing: bool = True) -> RangeServer:
    """A :class:`RangeServer` over ``root`` on 127.0.0.1 (use it in a ``with`` block)."""
    return RangeServer(root, port=port, listing=listing)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="folder to serve (its files at http://127.0.0.1:PORT/...)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--no-listing", action="store_true", help="404 for folders (no HTML pages)")
    args = ap.parse_args(argv)
    server = RangeServer(args.root, port=args.port, listing=not args.no_listing).start()
    print(f"serving {server.root} at {server.url} (Ctrl-C stops)", flush=True)
    try:
        server.thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        print(f"{server.requests} requests, {server.body_bytes:,} body bytes sent", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
