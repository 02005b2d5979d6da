"""`sieve adapt --index DIR`: a CMC trained on the index's documents alone (training/adapt.py), published next to
the index (index/adapted.py) where the server picks it up. Reads only the index: never a queries or qrels file.

Resumable: pseudo-queries, mined lists and training state live in DIR/adapted/.work until the model is published;
the same command after Ctrl-C or a kill goes on from there (a changed corpus or configuration starts afresh).
Exit status 0: installed; 3: trained but not installed (training/adapt.py `verdict`: below the first stage or
the shipped default on the held-out documents' pseudo-queries, or no step improved on the start); 2: cannot adapt
this index (too small, no BM25 part, too few pseudo-queries that find their source).
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import shlex
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

MIN_DOCUMENTS = 40
EXIT_NOT_INSTALLED = 3


def register(sub) -> None:
    from sieve.training.adapt_config import AdaptConfig
    from sieve.training.choices import GENERATORS, STARTS

    d = AdaptConfig()
    p = sub.add_parser("adapt", help="train CMC on an index's own documents (pseudo-queries; no queries or labels)")
    p.add_argument("--index", required=True, type=Path, help="index directory (as SIEVE_INDEX_DIR)")
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


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def config_of(args) -> "AdaptConfig":
    from sieve.training.adapt_config import AdaptConfig

    return AdaptConfig(generator=args.generator, per_doc=args.per_doc, max_queries=args.max_queries, k=args.retrieve_k, train_k=args.train_k,
                       n_layers=args.layers, steps=args.steps, batch_queries=args.batch, lr=args.lr, evidence_lr=args.evidence_lr, start=args.start,
                       teacher=args.teacher,
                       seed=args.seed)


def cmd_adapt(args: argparse.Namespace, settings) -> None:
    from sieve.index.adapted import adapted_dir

    root = adapted_dir(args.index)
    if not (Path(args.index) / "CURRENT").is_file():
        raise SystemExit(f"no index at {args.index} (no CURRENT file); build one with `sieve index build` first")
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(f"another `sieve adapt` is running on {args.index}") from None
        code = adapt(args, settings.model_copy(update={"index_dir": Path(args.index)}))
    if code:
        sys.exit(code)


def adapt(args, settings) -> int:
    import numpy as np
    import torch

    from sieve import checkpoints
    from sieve.index.adapted import adapted_dir
    from sieve.index.lexical import Analyzer
    from sieve.models.cmc_checkpoint import load_cmc
    from sieve.models.device import pick_device
    from sieve.pipeline.searcher import Searcher
    from sieve.service.components import load_biencoder
    from sieve.index import SearchIndex
    from sieve.service.runtime import searcher_options
    from sieve.training.adapt import evaluate, train, verdict
    from sieve.training.adapt_data import mine
    from sieve.training.pseudo_queries import TermStats, generate, query_stats

    began = time.monotonic()
    deadline = began + args.minutes * 60
    cfg = config_of(args)
    biencoder = load_biencoder(settings, pick_device(settings.device))
    index = SearchIndex.load(settings.index_dir, model_name=settings.model_name, model_hash=biencoder.weights_hash,
                             dim=biencoder.dim)  # the local index it publishes next to, whatever the backend served
    if index.size < MIN_DOCUMENTS:
        log(f"cannot adapt: the index holds {index.size} documents; `sieve adapt` needs at least {MIN_DOCUMENTS} "
            "(some are held out to check the model)")
        return 2
    if not index.has_lexical:
        log("cannot adapt: the index has no BM25 part (the served first stage is hybrid); rebuild it without --no-lexical")
        return 2
    rows = np.arange(index.size)
    docs, ids = index.documents(rows), index.ids(rows)
    work = adapted_dir(settings.index_dir) / ".work"
    mining = ("generator", "per_doc", "max_queries", "heldout", "heldout_max", "k", "seed")
    corpus = hashlib.sha256("\n".join(ids).encode()).hexdigest()
    plan = {"corpus": corpus, "version": index.version,
            "mining": {k: getattr(cfg, k) for k in mining}}  # training settings have their own state below
    if args.fresh or not (work / "plan.json").is_file() or json.loads((work / "plan.json").read_text()) != plan:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        (work / "plan.json").write_text(json.dumps(plan, indent=2))
    else:
        log(f"resuming the interrupted run in {work}")

    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(index.size)
    n_held = min(cfg.heldout_max, max(10, int(round(cfg.heldout * index.size))))
    held = set(order[:n_held].tolist())
    stats = TermStats(Analyzer(settings.lexical_config()), docs)
    queries = generate(cfg.generator, docs, order.tolist(), stats, cfg.per_doc, cfg.seed)[:cfg.max_queries]
    shape = query_stats([q.text for q in queries], [[q.source] for q in queries], stats, [q.rest for q in queries])
    log(f"{len(queries)} pseudo-queries ({cfg.generator}) from {index.size} documents, {n_held} documents held out; "
        f"{shape}")
    searcher = Searcher(biencoder, index, **searcher_options(settings))
    try:
        lists = mine(searcher, queries, min(cfg.k, index.size), work, began + 0.5 * args.minutes * 60,
                     not args.no_progress, stats)
    finally:
        searcher.close()
    found = lists.select(np.flatnonzero(lists.positive >= 0))
    is_held = np.isin(found.sources, list(held))
    train_lists, held_lists = found.select(np.flatnonzero(~is_held)), found.select(np.flatnonzero(is_held))
    log(f"{len(found)} of {len(lists)} pseudo-queries have their source among the candidates: "
        f"{len(train_lists)} to train on, {len(held_lists)} held out")
    if len(train_lists) < 16 or len(held_lists) < 5:
        log("cannot adapt: too few pseudo-queries find their source document among the candidates")
        return 2
    vectors = torch.from_numpy(index.embeddings(rows))
    fusion = load_cmc(checkpoints.CMC, biencoder).model.cpu()
    training = {k: v for k, v in asdict(cfg).items() if k not in plan["mining"] and k != "steps"}
    state_dir = work / f"train-{hashlib.sha256(json.dumps(training, sort_keys=True).encode()).hexdigest()[:12]}"
    state_dir.mkdir(exist_ok=True)
    model, record = train(cfg, train_lists, held_lists, vectors, torch.device("cpu"), fusion, state_dir, deadline,
                          log, not args.no_progress)
    seen = train_lists.select(np.arange(min(len(train_lists), len(held_lists))))
    metrics = {name: {"first_stage": evaluate(None, part, vectors, "cpu"),
                      "shipped_default": evaluate(fusion, part, vectors, "cpu"),
                      "adapted": evaluate(model, part, vectors, "cpu")}
               for name, part in (("heldout_documents", held_lists), ("training_documents", seen))}
    held_m = metrics["heldout_documents"]
    log(json.dumps(metrics))
    summary = {"command": getattr(args, "command_line", None) or shlex.join(["sieve", *sys.argv[1:]]), "index_version": index.version,
               "documents": index.size, "heldout_documents": n_held, "pseudo_queries": len(queries),
               "lists": {"train": len(train_lists), "heldout": len(held_lists)},
               "query_stats": shape,
               "metrics": metrics, "best_step": record["best_step"], "steps": record["step"],
               "history": record["history"], "config": record["config"],
               "wall_s": round(time.monotonic() - began, 1)}
    refused = verdict(held_m, record["best_step"])
    if refused:
        log(f"NOT INSTALLED: {refused}; the server keeps the CMC it serves now (report: {work / 'report.json'})")
        (work / "report.json").write_text(json.dumps({**summary, "not_installed": refused}, indent=2))
        return EXIT_NOT_INSTALLED
    path = install(settings.index_dir, model, biencoder, ids, corpus, summary, cfg)
    for done in ([work] if not args.keep_lists else list(work.glob("train-*"))):
        shutil.rmtree(done, ignore_errors=True)
    print(json.dumps({"installed": str(path), "heldout_mrr@10": held_m, "wall_s": summary["wall_s"],
                      "serving": "a server on this index swaps it in on POST /admin/index/reload or its next "
                                 "SIEVE_INDEX_POLL_S poll; a server started later loads it (unless SIEVE_CMC_PATH is set)"},
                     indent=2))
    return 0


def install(index_dir: Path, model, biencoder, ids: list[str], corpus_hash: str, summary: dict, cfg) -> Path:
    """Writes the checkpoint, its documents list, report and model card, then makes it the index's live CMC."""
    from datetime import datetime, timezone

    from sieve.index.adapted import DOCUMENTS, new_work_dir, publish
    from sieve.models.cmc_checkpoint import CMCBundle, save_cmc
    from sieve.training.adapt_card import model_card

    out = new_work_dir(index_dir)
    adapted = {"corpus_hash": corpus_hash, "documents": len(ids),
               "generator": cfg.generator, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "index_version": summary["index_version"]}
    bundle = CMCBundle(model.cfg, model, biencoder, None, f"cmc-adapted-{cfg.generator}", biencoder.weights_hash)
    save_cmc(bundle, out, towers_from_base=True, metadata={"trainer": "sieve adapt", "adapted": adapted,
                                                          "command": summary["command"],
                                                          "metrics": summary["metrics"]})
    (out / DOCUMENTS).write_text("".join(f"{i}\n" for i in ids), encoding="utf-8")
    (out / "adapt.json").write_text(json.dumps(summary, indent=2))
    (out / "model_card.md").write_text(model_card(summary, adapted), encoding="utf-8")
    return publish(index_dir, out)
