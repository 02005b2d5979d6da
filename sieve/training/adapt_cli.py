"""`sieve adapt --index DIR` (or, with SIEVE_INDEX_BACKEND=qdrant / qdrant-edge, the collection SIEVE_QDRANT_*
names): a CMC trained on the index's documents alone (training/adapt.py, training/adapt_run.py), published into the
index's adapted store (index/adapted.py: inside the index directory, or inside the Qdrant collection) where the
server picks it up. Reads only the index: never a queries or qrels file.

Resumable: pseudo-queries, mined lists and training state live in a work directory (DIR/adapted/.work; for a
Qdrant collection SIEVE_CACHE_DIR/adapted/<collection key>/.work) until the run ends; the same command after Ctrl-C
or a kill goes on from there (a changed corpus or configuration starts afresh). A run that ends, installed or not,
removes its work directory and lock, and a directory it had to create: a refused run leaves the index as it was
(`--keep-lists` keeps the mined lists for another run with other training settings).
Exit status 0: installed; 3: trained but not installed (training/adapt.py `verdict`: below the first stage or
the shipped default on the held-out documents' pseudo-queries, or no step improved on the start; the report is
printed on stdout); 2: cannot adapt this index (too small, no BM25 part, too few pseudo-queries: the message names
the step that lost them and what to try).
"""
from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path


def register(sub) -> None:
    from sieve.training.adapt_config import AdaptConfig
    from sieve.training.choices import GENERATORS, STARTS

    d = AdaptConfig()
    p = sub.add_parser("adapt", help="train CMC on an index's own documents (pseudo-queries; no queries or labels)")
    p.add_argument("--index", type=Path, help="index directory (SIEVE_INDEX_DIR); with --backend qdrant or "
                                               "qdrant-edge, the collection instead")
    p.add_argument("--backend", choices=["local", "qdrant", "qdrant-edge"],
                   help="where the index lives (SIEVE_INDEX_BACKEND)")
    p.add_argument("--qdrant-url", help="Qdrant server URL or local-mode directory (SIEVE_QDRANT_URL)")
    p.add_argument("--qdrant-edge-path", type=Path, help="qdrant-edge shards' directory (SIEVE_QDRANT_EDGE_PATH)")
    p.add_argument("--collection", help="Qdrant collection (SIEVE_QDRANT_COLLECTION)")
    p.add_argument("--minutes", type=float, default=20.0, help="time budget for mining and training (default 20)")
    p.add_argument("--generator", choices=GENERATORS, default=d.generator, help=f"pseudo-queries (default {d.generator})")
    p.add_argument("--per-doc", type=int, default=d.per_doc, help="pseudo-queries per document")
    p.add_argument("--max-queries", type=int, default=d.max_queries, help="at most this many pseudo-queries")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--layers", type=int, default=d.n_layers, help="CMC attention layers")
    p.add_argument("--batch", type=int, default=d.batch_queries, help="pseudo-queries per step")
    p.add_argument("--lr", type=float, default=d.lr, help="attention layers and evidence embedding")
    p.add_argument("--evidence-lr", type=float, default=d.evidence_lr,
                   help="the fusion weights it starts from (0: kept as shipped, only the attention learns)")
    p.add_argument("--start", choices=STARTS, default=d.start, help="fusion: the shipped default's weights; first-stage: ranks as hybrid")
    p.add_argument("--teacher", type=float, default=d.teacher,
                   help=f"weight of the shipped default's ranking of each list as a soft target (default {d.teacher}; 0: the source only)")
    p.add_argument("--retrieve-k", type=int, default=d.k, help="candidates per list (the served retrieve_k)")
    p.add_argument("--train-k", type=int, default=d.train_k, help="candidates per list in training (top of the list)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--fresh", action="store_true", help="discard an interrupted run's work and start again")
    p.add_argument("--keep-lists", action="store_true",
                   help="keep the mined lists after publishing: another run with other training settings reuses them")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_adapt)


def cmd_adapt(args: argparse.Namespace, settings) -> None:
    code = run(args, settings)
    if code:
        sys.exit(code)


def run(args, settings) -> int:
    """Opens the index, checks it can be adapted, then runs in the store's work directory under its lock."""
    if not settings.on_qdrant and not (Path(settings.index_dir) / "CURRENT").is_file():  # before seconds of imports
        raise SystemExit(f"no index at {settings.index_dir} (no CURRENT file); build one with `sieve index build` "
                         "first, or give --backend qdrant / qdrant-edge for a Qdrant collection")
    import torch

    from sieve.index.adapted import store_for
    from sieve.models.device import pick_device
    from sieve.service.components import load_biencoder
    from sieve.service.runtime import load_index
    from sieve.training.adapt_run import EXIT_REFUSED, adapt, cannot_adapt, log

    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    biencoder = load_biencoder(settings, pick_device(settings.device))
    index = load_index(settings, biencoder, torch.device("cpu"))
    try:
        try:
            index.check_ready()
        except ConnectionError as exc:  # IndexUnavailableError: Qdrant down, no such collection, or held
            raise SystemExit(f"sieve adapt: {exc}. A local-mode folder or qdrant-edge directory is held by the "
                             "process serving it: stop that server, adapt, start it again") from None
        if (why := cannot_adapt(index)) is not None:
            log(f"cannot adapt: {why}")
            return EXIT_REFUSED
        store = store_for(index, settings.index_dir, settings.cache_dir)
        with workspace(store.root) as root:
            code = adapt(args, settings, biencoder, index, store, root / ".work")
            clean_up(root / ".work", code, args.keep_lists)
            return code
    finally:
        index.close()


def clean_up(work: Path, code: int, keep_lists: bool) -> None:
    """After a run that ended (installed or not): nothing is left to resume. --keep-lists keeps the mined lists
    (and the plan they were mined for) for another run with other training settings."""
    if not keep_lists:
        shutil.rmtree(work, ignore_errors=True)
        return
    for done in work.glob("train-*"):
        shutil.rmtree(done, ignore_errors=True)


@contextmanager
def workspace(root: Path):
    """`root` locked against a second `sieve adapt` on the same index; on the way out the lock file goes, and
    `root` too when this run created it and left it empty (a refused run leaves the index as it was)."""
    created = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    try:
        with held_lock(root / ".lock"):
            yield root
    finally:
        if created and root.is_dir() and not any(root.iterdir()):
            root.rmdir()


@contextmanager
def held_lock(path: Path):
    """An exclusive flock on `path`, removed when released. A lock taken on a file another run unlinked meanwhile
    is not held (its inode left the directory): take the new one instead."""
    while True:
        handle = open(path, "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise SystemExit(f"another `sieve adapt` is running on this index (it holds {path})") from None
        try:
            same = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        handle.close()
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # before unlocking: a waiter that opened it sees an unlinked inode and retries
        handle.close()
