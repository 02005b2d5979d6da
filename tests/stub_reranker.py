"""A tiny real rerank server for the remote cross-encoder tests (run as its own process):

    python tests/stub_reranker.py PORT MODE [FAIL_FIRST]

MODE: `tei` (TEI's /rerank: [{index, score}]), `cohere` (Cohere v2: {results: [{index, relevance_score}]}),
`stall` (reads the request, then sleeps 120 s before answering) or `garbage` (200 with a body in no rerank shape).
The score of a text is its length in characters, so a test knows the ranking it must see. The first FAIL_FIRST requests are answered 503 (a flaky server).
Every request received is appended to stdout as one line, so a test can count them."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.seen += 1
        n = server.seen
        print(json.dumps({"path": self.path, "n": n}), flush=True)
        if server.mode == "stall":
            time.sleep(120)
        if n <= server.fail_first:
            return self.answer(503, {"error": "warming up"})
        if server.mode == "garbage":
            return self.answer(200, {"results": "not a list of scores"})
        texts = body["texts"] if server.mode == "tei" else body["documents"]
        ranked = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        if server.mode == "tei":
            return self.answer(200, [{"index": i, "score": float(len(texts[i]))} for i in ranked])
        self.answer(200, {"id": "stub", "results": [{"index": i, "relevance_score": float(len(texts[i]))}
                                                    for i in ranked[:body.get("top_n") or len(texts)]]})

    def answer(self, status: int, payload) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


    def do_GET(self):  # readiness of the stub itself
        self.answer(200, {"status": "ok"})


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, mode: str, fail_first: int):
        super().__init__(("127.0.0.1", port), Handler)
        self.mode, self.fail_first, self.seen = mode, fail_first, 0


class StubReranker:
    """The stub as a real subprocess on `port`; `requests()` = how many requests it has received."""

    def __init__(self, port: int, mode: str, log_path: Path, fail_first: int = 0):
        self.port, self.log_path = port, log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([sys.executable, __file__, str(port), mode, str(fail_first)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"stub reranker not up on {port}: {log_path.read_text()[-2000:]}")

    def requests(self) -> int:
        self.log.flush()
        return sum(1 for line in self.log_path.read_text().splitlines() if line.startswith("{"))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()


if __name__ == "__main__":
    Server(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0).serve_forever()
