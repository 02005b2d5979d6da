"""One `sieve adapt` run on an opened index (a local one or a Qdrant collection): pseudo-queries of its documents,
their mined candidate lists, training, the guard, and publishing the model into the index's adapted store
(index/adapted.py). The command line, the lock and the clean-up around a run are in training/adapt_cli.py.
"""
from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sieve.training.adapt import AdaptConfig

MIN_DOCUMENTS = 40
MIN_TRAIN, MIN_HELD = 16, 5  # lists whose source is among the candidates: to train on, held out for selection
EXIT_REFUSED, EXIT_NOT_INSTALLED = 2, 3


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def config_of(args) -> "AdaptConfig":
    from sieve.training.adapt import AdaptConfig

    return AdaptConfig(generator=args.generator, per_doc=args.per_doc, max_queries=args.max_queries, k=args.retrieve_k,
                       train_k=args.train_k, n_layers=args.layers, steps=args.steps, batch_queries=args.batch,
                       lr=args.lr, evidence_lr=args.evidence_lr, start=args.start, teacher=args.teacher,
                       seed=args.seed)


def cannot_adapt(index) -> str | None:
    """Why this index cannot be adapted at all (None: it can); read before anything is written."""
    if index.size < MIN_DOCUMENTS:
        return (f"the index holds {index.size} documents; `sieve adapt` needs at least {MIN_DOCUMENTS} (some are held "
                "out to check the model)")
    if not index.has_lexical:
        return "the index has no BM25 part (the served first stage is hybrid); rebuild it without --no-lexical"
    return None


def shortfall(cfg, documents: int, made: int, sources: int, found: int, train: int, held: int, k: int,
              short_words: float | None) -> str | None:
    """Why there are too few lists to train on and to select with, naming the step that lost them and what to try
    (None: enough). `sources`: documents that gave a pseudo-query; `short_words`: the median length in words of
    those that gave none."""
    if train >= MIN_TRAIN and held >= MIN_HELD:
        return None
    counts = (f"{train} pseudo-queries to train on (needs {MIN_TRAIN}) and {held} held out (needs {MIN_HELD})")
    if sources < 0.5 * documents:
        why = (f"the {cfg.generator} generator made {made} pseudo-queries from {documents} documents: "
               f"{documents - sources} gave none" + (f" (median length {short_words:.0f} words; {cfg.generator} needs a text of at least 8 "
                               "words, cut into sentences or word windows)" if short_words is not None else ""))
        tries = ("try --generator terms (3 salient terms make a query) or span, or --per-doc 2 on a small index; "
                 "documents need text beyond a title")
    elif found < 0.5 * made:
        why = (f"{made} pseudo-queries were made from {sources} of {documents} documents, but only {found} find their "
               f"source document among the top {k} candidates of the first stage")
        tries = ("check that the bi-encoder and the BM25 analyzer (SIEVE_LEXICAL_LANGUAGE) suit this text; try "
                 "--generator terms or span")
    else:
        why = (f"{made} pseudo-queries from {sources} of {documents} documents, {found} find their source among the "
               f"top {k} candidates: the index is too small for a held-out check")
        tries = f"try --per-doc 2 or 3, or adapt a larger index (more than {MIN_DOCUMENTS} documents)"
    return f"{counts}: {why}. What to try: {tries}"


def plan_work(work: Path, plan: dict, fresh: bool) -> None:
    """Starts `work` afresh unless it holds an interrupted run of the same plan (corpus and mining settings)."""
    if fresh or not (work / "plan.json").is_file() or json.loads((work / "plan.json").read_text()) != plan:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        (work / "plan.json").write_text(json.dumps(plan, indent=2))
    else:
        log(f"resuming the interrupted run in {work}")


def pseudo_queries(cfg, settings, index, corpus):
    """(queries, held-out positions, term stats, query shape, documents that gave none: median words or None)."""
    import numpy as np

    from sieve.index.lexical import Analyzer
    from sieve.training.pseudo_queries import TermStats, generate, query_stats

    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(len(corpus.docs))
    n_held = min(cfg.heldout_max, max(10, int(round(cfg.heldout * len(corpus.docs)))))
    analyzer = index.analyzer() if hasattr(index, "every_point") else Analyzer(settings.lexical_config())
    stats = TermStats(analyzer, corpus.docs)
    queries = generate(cfg.generator, corpus.docs, order.tolist(), stats, cfg.per_doc, cfg.seed)[:cfg.max_queries]
    shape = query_stats([q.text for q in queries], [[q.source] for q in queries], stats, [q.rest for q in queries])
    gave = {q.source for q in queries}
    silent = [len(d.text.split()) for i, d in enumerate(corpus.docs) if i not in gave]
    return queries, set(order[:n_held].tolist()), stats, shape, (float(np.median(silent)) if silent else None)


MINING = ("generator", "per_doc", "max_queries", "heldout", "heldout_max", "k", "seed")  # what the lists depend on


def adapt(args, settings, biencoder, index, store, work: Path) -> int:
    """The run; 0 installed, 2 refused (`log` says why and what to try), 3 trained but not installed."""
    from sieve.training.adapt import verdict
    from sieve.training.adapt_data import read_corpus

    began = time.monotonic()
    cfg, corpus = config_of(args), read_corpus(index)
    digest = hashlib.sha256("\n".join(corpus.ids).encode()).hexdigest()
    plan = {"corpus": digest, "version": index.version, "mining": {k: getattr(cfg, k) for k in MINING}}
    queries, held, stats, shape, short_words = pseudo_queries(cfg, settings, index, corpus)
    log(f"{len(queries)} pseudo-queries ({cfg.generator}) from {len(corpus.docs)} documents, {len(held)} documents "
        f"held out; {shape}")
    plan_work(work, plan, args.fresh)
    k = min(cfg.k, len(corpus.docs))
    train_lists, held_lists, found = mined_lists(args, settings, biencoder, index, corpus, queries, held, stats, k,
                                                 work, began)
    short = shortfall(cfg, len(corpus.docs), len(queries), len({q.source for q in queries}), found,
                      len(train_lists), len(held_lists), k, short_words)
    if short:
        log(f"cannot adapt: {short}")
        return EXIT_REFUSED
    model, record, metrics = trained(args, cfg, biencoder, corpus, train_lists, held_lists, work, began)
    summary = {"command": getattr(args, "command_line", None) or shlex.join(["sieve", *sys.argv[1:]]),
               "index": store.where, "index_version": index.version, "documents": len(corpus.docs),
               "heldout_documents": len(held), "pseudo_queries": len(queries),
               "lists": {"train": len(train_lists), "heldout": len(held_lists)}, "query_stats": shape,
               "metrics": metrics, "best_step": record["best_step"], "steps": record["step"],
               "history": record["history"], "config": record["config"], "wall_s": round(time.monotonic() - began, 1)}
    refused = verdict(metrics["heldout_documents"], record["best_step"])
    if refused:
        log(f"NOT INSTALLED: {refused}; the server keeps the CMC it serves now (the report is on stdout)")
        print(json.dumps({"installed": None, "not_installed": refused, **summary}, indent=2))
        return EXIT_NOT_INSTALLED
    path = install(store, model, biencoder, corpus.ids, digest, summary, cfg)
    print(json.dumps({"installed": str(path), "index": store.where, "heldout_mrr@10": metrics["heldout_documents"],
                      "wall_s": summary["wall_s"], "serving": SERVING}, indent=2))
    return 0


SERVING = ("a server on this index swaps it in on POST /admin/index/reload or its next SIEVE_INDEX_POLL_S poll; a "
           "server started later loads it (unless SIEVE_CMC_PATH is set)")


def mined_lists(args, settings, biencoder, index, corpus, queries, held: set, stats, k: int, work: Path,
                began: float) -> tuple:
    """(lists to train on, held-out lists, how many found their source): the served hybrid candidates of every
    pseudo-query, mined within half the time budget."""
    import numpy as np

    from sieve.pipeline.searcher import Searcher
    from sieve.service.runtime import searcher_options
    from sieve.training.adapt_data import mine

    searcher = Searcher(biencoder, index, **searcher_options(settings))
    try:
        lists = mine(searcher, corpus, queries, k, work, began + 0.5 * args.minutes * 60, not args.no_progress, stats)
    finally:
        searcher.close()
    found = lists.select(np.flatnonzero(lists.positive >= 0))
    is_held = np.isin(found.sources, list(held))
    train_lists, held_lists = found.select(np.flatnonzero(~is_held)), found.select(np.flatnonzero(is_held))
    log(f"{len(found)} of {len(lists)} pseudo-queries have their source among the candidates: "
        f"{len(train_lists)} to train on, {len(held_lists)} held out")
    return train_lists, held_lists, len(found)


def trained(args, cfg, biencoder, corpus, train_lists, held_lists, work: Path, began: float) -> tuple:
    """(model, training record, metrics): trained from the shipped fusion CMC until the time budget, then first
    stage / shipped default / adapted on the held-out and on as many trained documents' pseudo-queries."""
    import numpy as np
    import torch

    from sieve import checkpoints
    from sieve.models.cmc_checkpoint import load_cmc
    from sieve.training.adapt import evaluate, train

    vectors = torch.from_numpy(corpus.vectors)
    fusion = load_cmc(checkpoints.CMC, biencoder).model.cpu()
    training = {k: v for k, v in asdict(cfg).items() if k not in MINING and k != "steps"}
    state_dir = work / f"train-{hashlib.sha256(json.dumps(training, sort_keys=True).encode()).hexdigest()[:12]}"
    state_dir.mkdir(exist_ok=True)
    model, record = train(cfg, train_lists, held_lists, vectors, torch.device("cpu"), fusion, state_dir,
                          began + args.minutes * 60, log, not args.no_progress)
    seen = train_lists.select(np.arange(min(len(train_lists), len(held_lists))))
    metrics = {name: {"first_stage": evaluate(None, part, vectors, "cpu"),
                      "shipped_default": evaluate(fusion, part, vectors, "cpu"),
                      "adapted": evaluate(model, part, vectors, "cpu")}
               for name, part in (("heldout_documents", held_lists), ("training_documents", seen))}
    log(json.dumps(metrics))
    return model, record, metrics


def install(store, model, biencoder, ids: list[str], corpus_hash: str, summary: dict, cfg) -> Path:
    """Writes the checkpoint, its documents list, report and model card, then makes it the index's live CMC
    (`store.publish`: the same call any other trainer of an index's CMC makes)."""
    from datetime import datetime, timezone

    from sieve.index.adapted import DOCUMENTS
    from sieve.models.cmc_checkpoint import CMCBundle, save_cmc
    from sieve.training.adapt_card import model_card

    out = store.new_work_dir()
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
    return store.publish(out)
