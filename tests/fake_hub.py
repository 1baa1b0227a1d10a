"""A Hugging Face Hub on loopback for download tests: the model-info API and the resolve endpoint
(HEAD with the commit and ETag, GET with range requests for resume), as huggingface_hub reads them.
Files can be served slowly so a test can cancel part way, a connection cut after some bytes, and a
file's ETag (its sha256) claimed wrongly, as for bytes corrupted on the way."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SHA = "a" * 40


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, bytes]], chunk: int = 4096, delay: float = 0.0,
                 cut_after: int | None = None, etags: dict[str, str] | None = None, ranges: bool = True) -> None:
        self.repos, self.chunk, self.delay, self.ranges = repos, chunk, delay, ranges  # ranges: honour Range
        self.cut_after = cut_after  # the next GET of a longer file ends after this many body bytes, connection closed
        self.etags = etags or {}  # file name -> the ETag claimed instead of its sha256
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def do_HEAD(self) -> None:  # http.server's naming
                hub.serve(self, body=False)

            def do_GET(self) -> None:
                hub.serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="fake-hub", daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    def serve(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = h.path.split("?")[0]
        self.requests.append((h.command, path, h.headers.get("Range")))
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path):
            return self._info(h, m.group(1))
        if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path):
            return self._file(h, m.group(1), m.group(2), body)
        self._missing(h)

    def _missing(self, h: BaseHTTPRequestHandler) -> None:
        h.send_response(404)
        h.send_header("X-Error-Code", "RepoNotFound")
        h.send_header("Content-Length", "0")
        h.end_headers()

    def _info(self, h: BaseHTTPRequestHandler, repo: str) -> None:
        files = self.repos.get(repo)
        if files is None:
            return self._missing(h)
        doc = json.dumps({"id": repo, "modelId": repo, "sha": SHA, "private": False,
                          "siblings": [{"rfilename": n, "size": len(d)} for n, d in files.items()]}).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(doc)))
        h.end_headers()
        h.wfile.write(doc)

    def _file(self, h: BaseHTTPRequestHandler, repo: str, name: str, body: bool) -> None:
        data = self.repos.get(repo, {}).get(name)
        if data is None:
            return self._missing(h)
        start = 0
        if self.ranges and (rng := h.headers.get("Range")) and (m := re.fullmatch(r"bytes=(\d+)-", rng)):
            start = int(m.group(1))
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", SHA)
        h.send_header("ETag", f'"{self.etags.get(name) or hashlib.sha256(data).hexdigest()}"')
        h.send_header("Accept-Ranges", "bytes")
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.send_header("Content-Length", str(len(data) - start))
        h.end_headers()
        if not body:
            return
        end = len(data)
        if self.cut_after is not None and end - start > self.cut_after:
            end, self.cut_after = start + self.cut_after, None
            h.close_connection = True
        try:
            for i in range(start, end, self.chunk):
                h.wfile.write(data[i : min(i + self.chunk, end)])
                h.wfile.flush()
                time.sleep(self.delay)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading (a cancel)
