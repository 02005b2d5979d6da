"""How the index scales: build, one-document and 100-document writes, a delete, top-512 search and its recall against
exact search, RSS steady and during a write + swap, disk; for N = 10k, 100k, 1M, for the segmented index (this code)
and, where it can still be measured in reasonable time, for the code before it (one monolithic version per write).

The encoder is a stub: document i's vector is a fixed clustered unit vector (1,024 Gaussian clusters in 384
dimensions, so an ANN index has the structure real embeddings give it; pure random unit vectors have no neighbours
to find). Only the index's own work is timed. Texts are 12 words from a 5,000-word vocabulary (the BM25 part is
built and written like any other). Each (N, code) runs in its own processes: one builds, one measures, so the RSS
numbers are the measuring process's alone. Usage:
  python benchmarks/index_scale.py --sizes 10000 100000 1000000 --out benchmarks/results/index_scale.json
  python benchmarks/index_scale.py --sizes 10000 --baseline-commit 7a6b3d0   # also today's path, from that commit
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DIM, CLUSTERS, WORDS, K = 384, 1024, 5000, 512
QUERIES, SEED = 60, 0


# -- the stub encoder and corpus (deterministic per document number) -----------------------------------------
@functools.lru_cache(maxsize=1)
def cluster_centres() -> np.ndarray:
    """Two levels, as topics in real embeddings: 32 broad topics, each with 32 subtopics near it."""
    rng = np.random.default_rng(SEED)
    broad = rng.standard_normal((CLUSTERS // 32, DIM), dtype=np.float32)
    broad /= np.linalg.norm(broad, axis=1, keepdims=True)
    sub = np.repeat(broad, 32, axis=0) + 0.05 * rng.standard_normal((CLUSTERS, DIM), dtype=np.float32)
    return sub / np.linalg.norm(sub, axis=1, keepdims=True)


def vectors_for(rows: np.ndarray) -> np.ndarray:
    """(len(rows), DIM) unit vectors: cluster centre of row % CLUSTERS plus per-row noise, seeded by the row."""
    centres = cluster_centres()
    out = np.empty((len(rows), DIM), dtype=np.float32)
    for start in range(0, len(rows), 65536):
        block = rows[start:start + 65536]
        noise = np.random.default_rng([SEED, int(block[0]), len(block)]).standard_normal((len(block), DIM),
                                                                                           dtype=np.float32)
        x = centres[block % CLUSTERS] + 0.06 * noise
        out[start:start + len(block)] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


class StubEncoder:
    name, weights_hash, dim, max_length = "stub-clustered", "0" * 64, DIM, 128

    def encode_documents(self, texts, progress=True):
        return vectors_for(np.array([int(t.rsplit(" ", 1)[1][1:]) for t in texts], dtype=np.int64))

    def encode_queries(self, texts):
        return self.encode_documents(texts)


def documents(first: int, count: int):
    from sieve.index import Document

    rng = np.random.default_rng([SEED, first, count])
    words = rng.integers(0, WORDS, (count, 12))
    return [Document(f"d{first + i}", "", " ".join(f"w{w}" for w in words[i]) + f" #{first + i}")
            for i in range(count)]


def query_vectors(n: int) -> np.ndarray:
    rng = np.random.default_rng(SEED + 1)
    x = vectors_for(rng.integers(0, n, QUERIES)) + 0.03 * rng.standard_normal((QUERIES, DIM), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# -- measuring ------------------------------------------------------------------------------------------------
def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_split_mb() -> dict:
    """RSS as anonymous memory (this process's own) and file-backed pages (memory-mapped index files: page cache,
    shared with every process mapping the same files, dropped by the kernel under pressure)."""
    fields = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0]) / 1024
    return {"rss_anon_mb_steady": round(fields["Anonymous"], 1),
            "rss_file_mb_steady": round(fields["Rss"] - fields["Anonymous"], 1)}


class PeakRss:
    """Samples this process's RSS every 2 ms while the block runs."""

    def __enter__(self):
        self.peak, self.running = rss_mb(), True
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()
        return self

    def sample(self):
        while self.running:
            self.peak = max(self.peak, rss_mb())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, rss_mb())


def du_mb(path: Path) -> float:
    seen, total = set(), 0
    for p in path.rglob("*"):
        if p.is_file():
            st = p.stat()
            if st.st_ino not in seen:  # hard links count once
                seen.add(st.st_ino)
                total += st.st_blocks * 512
    return total / 2**20


def build(n: int, path: Path, segmented: bool) -> dict:
    from sieve.index import build_index

    docs = documents(0, n)
    started = time.perf_counter()
    build_index(docs, StubEncoder(), path, progress=False, **({} if segmented else {"faiss_kind": "flat"}))
    build_s = time.perf_counter() - started
    q = query_vectors(n)
    import faiss

    _, exact = faiss.knn(q, vectors_for(np.arange(n)), K, metric=faiss.METRIC_INNER_PRODUCT)
    np.save(path.parent / "exact.npy", exact)  # doc numbers = rows of the fresh build
    return {"build_s": round(build_s, 2)}


def p50(values: list[float]) -> float:
    return round(float(np.median(values)) * 1000, 2)


def search_quality(index, n: int, path: Path) -> tuple[list[float], list[float]]:
    """Per query (one at a time, as /search does): seconds, and recall of the exact top 512."""
    q, exact = query_vectors(n), np.load(path.parent / "exact.npy")
    search_s, recalls = [], []
    for i in range(len(q)):
        started = time.perf_counter()
        _, rows = index.search(q[i:i + 1], K)
        search_s.append(time.perf_counter() - started)
        recalls.append(len(set(rows[0].tolist()) & set(exact[i].tolist())) / K)
    return search_s, recalls


def nprobe_sweep(n: int, path: Path) -> list[dict]:
    from sieve.index import SearchIndex

    out = []
    for nprobe in (4, 8, 16, 32, 64):
        with SearchIndex.load(path, nprobe=nprobe) as index:
            search_s, recalls = search_quality(index, n, path)
        out.append({"nprobe": nprobe, "search_top512_ms_p50": p50(search_s),
                    "recall_at_512_vs_exact": round(float(np.mean(recalls)), 4),
                    "recall_min": round(float(np.min(recalls)), 4)})
    return out


def measure(n: int, path: Path, segmented: bool, writes: int, nprobe: int) -> dict:
    from sieve.index import SearchIndex, apply_changes

    with SearchIndex.load(path) as index:
        ann = index.manifest.segments[0]["ann"] if segmented else "flat"
    sweep = nprobe_sweep(n, path) if ann == "ivf" else None
    index = SearchIndex.load(path, nprobe=nprobe)
    search_s, recalls = search_quality(index, n, path)
    out = {"faiss": index.manifest.faiss_kind if not segmented else
           "+".join(s["ann"] for s in index.manifest.segments) + f" (nprobe {nprobe})",
           "search_top512_ms_p50": p50(search_s), "recall_at_512_vs_exact": round(float(np.mean(recalls)), 4)}
    steady, split = rss_mb(), rss_split_mb()
    encoder, next_id = StubEncoder(), n
    timings: dict[str, list[float]] = {"write_1_doc": [], "write_100_docs": [], "delete_1_doc": []}
    swap_s, peak = [], steady
    plan = [("write_1_doc", 1)] * writes + [("write_100_docs", 100)] * max(3, writes // 3) + \
           [("delete_1_doc", 0)] * max(3, writes // 2)
    for i, (kind, count) in enumerate(plan):
        ups = documents(next_id, count) if count else []
        gone = [f"d{7 * i + 1}"] if kind == "delete_1_doc" else []
        next_id += count
        with PeakRss() as rss:
            started = time.perf_counter()
            apply_changes(path, ups, gone, {"primary": encoder})
            timings[kind].append(time.perf_counter() - started)
            started = time.perf_counter()
            fresh = SearchIndex.load(path, nprobe=nprobe)  # the swap the service does
            old, index = index, fresh
            old.close()
            swap_s.append(time.perf_counter() - started)
            if segmented:  # the service's merger thread, after the write
                from sieve.index import merge_if_due

                while merge_if_due(path) is not None:
                    index.close()
                    index = SearchIndex.load(path, nprobe=nprobe)
        peak = max(peak, rss.peak)
    out.update({f"{k}_ms_p50": p50(v) for k, v in timings.items()})
    if sweep:
        out["nprobe_sweep"] = sweep
    out.update(split)
    out.update({"swap_ms_p50": p50(swap_s), "rss_mb_steady": round(steady, 1),
                "rss_mb_peak_during_write": round(peak, 1), "disk_mb": round(du_mb(path), 1),
                "segments_after_writes": len(index.manifest.segments) if segmented else 1,
                "writes_timed": {k: len(v) for k, v in timings.items()}})
    index.close()
    if segmented:
        from sieve.index import compact

        started = time.perf_counter()
        compact(path)
        out["compact_s"] = round(time.perf_counter() - started, 2)
        out["disk_mb_after_compact"] = round(du_mb(path), 1)
    out["data_mb"] = round(n * DIM * 4 / 2**20 + du_mb_docs(path), 1)
    return out


def du_mb_docs(path: Path) -> float:
    """The documents' own bytes (docs.sqlite of the live version's segments): vectors + documents = the data."""
    return sum(p.stat().st_size for p in path.rglob("docs.sqlite")) / 2**20


# -- driver ---------------------------------------------------------------------------------------------------
def worker(args) -> None:
    path, segmented = Path(args.path), args.code == "segmented"
    out = build(args.n, path, segmented) if args.phase == "build" else measure(args.n, path, segmented,
                                                                                 args.writes, args.nprobe)
    print(json.dumps(out))


def run_one(n: int, code: str, pythonpath: str, writes: int, nprobe: int, workdir: Path) -> dict:
    path = workdir / f"{code}-{n}" / "idx"
    path.parent.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": pythonpath}
    row = {"n": n, "code": code}
    for phase in ("build", "measure"):
        cmd = [sys.executable, __file__, "--worker", phase, "--n", str(n), "--path", str(path), "--code", code,
               "--writes", str(writes), "--nprobe", str(nprobe)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=ROOT)
        row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"  {code} n={n} {phase}: done", file=sys.stderr, flush=True)
    shutil.rmtree(path.parent, ignore_errors=True)
    return row


def table(rows: list[dict]) -> str:
    cols = ["n", "code", "faiss", "build_s", "write_1_doc_ms_p50", "write_100_docs_ms_p50", "delete_1_doc_ms_p50",
            "search_top512_ms_p50", "recall_at_512_vs_exact", "rss_mb_steady", "rss_mb_peak_during_write",
            "disk_mb", "disk_mb_after_compact", "data_mb"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def baseline_tree(commit: str, workdir: Path) -> Path:
    """The index package as it was at `commit` (git archive: nothing is checked out)."""
    dest = workdir / f"base-{commit}"
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "sieve/__init__.py", "sieve/index"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--baseline-commit", help="also measure the index package of this commit (today's path)")
    parser.add_argument("--baseline-max-n", type=int, default=100_000, help="largest N for the baseline")
    parser.add_argument("--writes", type=int, default=15, help="one-document writes per N (100-doc: a third)")
    parser.add_argument("--nprobe", type=int, default=16, help="IVF lists probed (SIEVE_NPROBE)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/index_scale.json")
    parser.add_argument("--worker", choices=["build", "measure"], dest="phase")
    parser.add_argument("--n", type=int)
    parser.add_argument("--path")
    parser.add_argument("--code", default="segmented")
    args = parser.parse_args()
    if args.phase:
        return worker(args)
    sys.path.insert(0, str(ROOT))
    from benchmarks.cmc_latency import machine

    record = {"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv),
              "encoder": "stub: fixed clustered unit vectors (1,024 clusters, dim 384), not a model; only the "
                         "index's own work is timed",
              "note": "run on a 2-core machine shared with other engineers' work (tests, builds) at the same time: "
                      "timings carry that noise", "rows": []}
    with tempfile.TemporaryDirectory(dir=os.environ.get("SIEVE_BENCH_TMP")) as tmp:
        workdir = Path(tmp)
        base = baseline_tree(args.baseline_commit, workdir) if args.baseline_commit else None
        for n in args.sizes:
            record["rows"].append(run_one(n, "segmented", str(ROOT), args.writes, args.nprobe, workdir))
            if base is not None and n <= args.baseline_max_n:
                row = run_one(n, f"before ({args.baseline_commit})", str(base), max(3, args.writes // 3),
                              args.nprobe, workdir)
                record["rows"].append(row)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(table(record["rows"]))


if __name__ == "__main__":
    main()
