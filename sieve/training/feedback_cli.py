"""`sieve feedback learn` and `sieve feedback import` (training/feedback_learn.py, sieve/feedback).

learn: reads the impressions and events a server with SIEVE_FEEDBACK_ENABLED logged (SIEVE_FEEDBACK_DIR, else
INDEX/feedback), estimates position bias (randomised swaps in the logs, else (1/rank)^eta), trains CMC from the
served model and publishes it into the index's adapted store only when the guard passes; a server on the index swaps
it in as it does a `sieve adapt` model (POST /admin/index/reload or its next SIEVE_INDEX_POLL_S poll).
With --learn both (the default) or memory, it also counts a click memory (sieve/feedback/memory.py: per query and
per document debiased click-through rates, added to /search scores) over the ranking served next, chooses its weights
on validation answers and publishes it into INDEX/clicks when its own guard passes (training/memory_learn.py).
Exit status 0: something published (or --dry-run); 2: too little feedback to learn from; 3: refused by the guard.

import: a log exported from elsewhere, JSON lines {"query": str, "shown": [ids in the order shown], "clicked":
[ids]}: each query runs through the index's first stage (for the candidates and evidence the learner needs) and is
appended as an impression with its clicks.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_TOO_LITTLE, EXIT_REFUSED = 2, 3
MIN_TRAIN = 20


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cosine_or_off(text: str) -> float | None:
    """--doc-gate: a cosine in [-1, 1], or off."""
    if text.strip().lower() in ("off", "none"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a cosine nor 'off'") from None
    if not -1.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not a cosine (between -1 and 1)")
    return value


def select_cosine_or_off(text: str) -> str | float:
    """--doc-related: select, off, or a cosine."""
    word = text.strip().lower()
    if word in ("select", "off", "none"):
        return "off" if word == "none" else word
    try:
        return cosine_or_off(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} (nor 'select')") from None


def register(sub) -> None:
    from sieve.training.feedback_config import LearnConfig

    d = LearnConfig()
    p = sub.add_parser("feedback", help="learn CMC from users' clicks (sieve feedback learn | import)")
    commands = p.add_subparsers(dest="feedback_command", required=True)
    learn = commands.add_parser("learn", help="train CMC from logged clicks; publish it when the guard passes")
    learn.add_argument("--index", type=Path, help="index directory (SIEVE_INDEX_DIR)")
    learn.add_argument("--feedback-dir", type=Path, help="the logs (SIEVE_FEEDBACK_DIR, else INDEX/feedback)")
    learn.add_argument("--depth", type=int, default=d.depth,
                       help="candidates per list the learner ranks among (at most SIEVE_FEEDBACK_LOG_CANDIDATES)")
    learn.add_argument("--steps", type=int, default=d.steps)
    learn.add_argument("--batch", type=int, default=d.batch)
    learn.add_argument("--lr", type=float, default=d.lr)
    learn.add_argument("--teacher", type=float, default=d.teacher, help="weight of KL(served || model)")
    learn.add_argument("--layers", type=int, default=d.n_layers, help="attention layers added to a served CMC without any")
    learn.add_argument("--eta", type=float, default=1.0, help="the default propensity (1/rank)^eta, without swaps in the logs")
    learn.add_argument("--clip", type=float, default=None,
                       help="largest inverse-propensity weight (default 100: sieve/feedback/dataset.py CLIP)")
    learn.add_argument("--propensities", choices=["position", "policy"], default=d.propensities,
                       help="the click weights the click memory's weights are selected on: 1 / its document's "
                            "exposure over its query's answers (policy: a document exploration showed in few answers "
                            "counts as if all had shown it), or 1 / p(the rank it was shown at); the guard and the "
                            "CMC weigh by position")
    learn.add_argument("--support", choices=["shown", "all"], default=d.support,
                       help="the candidates the click memory's selection estimate ranks: those some logged answer of "
                            "the query showed (a document none showed neither costs nor earns when promoted), or all")
    learn.add_argument("--guard-support", choices=["both", "shown", "all"], default=d.guard_support,
                       help="the same for the click memory's held-out guard; both: judged on the shown support and "
                            "refused all the same where the estimate over all candidates is clearly below the "
                            "served ranking (its 95%% interval wholly under 0)")
    learn.add_argument("--doc-gate", type=cosine_or_off, default=d.doc_gate, metavar="COSINE|off",
                       help="the click memory's per-document term only for queries it knows: remembered, or with a "
                            "remembered query at this cosine or more (spares queries about topics no user clicked on); "
                            f"off: for every query (default: {'off' if d.doc_gate is None else d.doc_gate})")
    learn.add_argument("--noise", choices=["estimated", "off"], default=d.noise,
                       help="the click memory's selection and guard estimates without the credit clicks on "
                            "non-relevant results give every shown document (the noise click rate, estimated from the "
                            "logs: sieve/feedback/noise.py), or as counted (off)")
    learn.add_argument("--estimate", choices=["ips", "dr"], default=d.estimate,
                       help="the click memory's selection estimate (and its guard's over every candidate): IPS, or "
                            "doubly robust (dr: a promoted document no answer of its query showed is credited with "
                            "what the documents like it, by the memory's evidence and their served rank, were "
                            "clicked for where users saw them, instead of nothing)")
    learn.add_argument("--doc-related", type=select_cosine_or_off, default=d.doc_related, metavar="select|COSINE|off",
                       help="the click memory's per-document term for a document only where a remembered query whose "
                            "users clicked it is at this cosine or more with the query (select: a cosine or none, "
                            f"chosen on validation clicks; off: never gated; default: {d.doc_related})")
    learn.add_argument("--memory-guard", choices=["auto", "heldout", "crossfit"], default=d.memory_guard,
                       help="the click memory's guard: judged on the held-out queries (heldout), or, split by query, "
                            "on every query in turn with the memory made the same way from the other queries' "
                            f"answers, pooled (crossfit: an interval about half as wide, the selection run "
                            f"{int(round(1 / d.heldout))} times); auto: crossfit up to "
                            f"{d.crossfit_max_answers:,} clicked answers, else heldout (default: {d.memory_guard})")
    learn.add_argument("--memory-publish", choices=["refit", "fold"], default=d.memory_publish,
                       help="with the cross-fitted guard, the click memory published: the procedure it judged applied "
                            "to every answer (refit: the held-out share's clicks counted too; the pooled interval "
                            "decides) or the memory made without the first share, which must also not be below the "
                            f"served ranking on that share (fold; default: {d.memory_publish})")
    learn.add_argument("--heldout", type=float, default=d.heldout, help="share of queries held out for the guard")
    learn.add_argument("--split", choices=["query", "time"], default=d.split,
                       help="hold out whole queries (default) or the latest answers (a log whose queries repeat)")
    learn.add_argument("--min-heldout", type=int, default=d.min_heldout, help="held-out answers with clicks the guard needs")
    learn.add_argument("--seed", type=int, default=d.seed)
    learn.add_argument("--dry-run", action="store_true", help="train and judge, never publish")
    learn.add_argument("--out", type=Path, help="also save the trained model here (a CMC checkpoint), published or not")
    learn.add_argument("--learn", choices=["both", "cmc", "memory"], default="both",
                       help="what to learn: the CMC, the click memory (per query and per document click-through "
                            "rates added to /search scores), or both (each published when its own guard passes)")
    learn.set_defaults(func=cmd_learn)
    imp = commands.add_parser("import", help="append an exported click log (JSON lines: query, shown, clicked)")
    imp.add_argument("file", type=Path)
    imp.add_argument("--index", type=Path, help="index directory (SIEVE_INDEX_DIR)")
    imp.add_argument("--feedback-dir", type=Path, help="where to append (SIEVE_FEEDBACK_DIR, else INDEX/feedback)")
    imp.set_defaults(func=cmd_import)


def opened(settings):
    """(bi-encoder, index, adapted store, served CMC bundle) of a local index, on the CPU."""
    if not (Path(settings.index_dir) / "CURRENT").is_file():
        raise SystemExit(f"no index at {settings.index_dir} (no CURRENT file)")
    import torch

    from sieve.index.adapted import store_for
    from sieve.service.components import load_biencoder
    from sieve.service.runtime import load_index
    from sieve.stages.cmc import load_first

    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    biencoder = load_biencoder(settings, torch.device("cpu"))
    index = load_index(settings, biencoder, torch.device("cpu"))
    store = store_for(index, settings.index_dir, settings.cache_dir)
    served = load_first(settings.cmc_choices(store.current()), biencoder, index)
    return biencoder, index, store, served


def cmd_learn(args: argparse.Namespace, settings) -> None:
    code = learn(args, settings)
    if code:
        sys.exit(code)


def clip_of(args) -> float:
    """`--clip`, or the default weight clip (sieve/feedback/dataset.py: imported here, not at --help)."""
    from sieve.feedback.dataset import CLIP

    return CLIP if args.clip is None else args.clip


def learn(args, settings) -> int:
    from sieve.feedback import propensity
    from sieve.feedback.dataset import Logs, build
    from sieve.training.adapt_cli import workspace
    from sieve.training.feedback_config import LearnConfig

    cfg = LearnConfig(depth=min(args.depth, settings.feedback_log_candidates), n_layers=args.layers, steps=args.steps,
                      batch=args.batch, lr=args.lr, teacher=args.teacher, heldout=args.heldout, split=args.split,
                      min_heldout=args.min_heldout, seed=args.seed, propensities=args.propensities,
                      support=args.support, guard_support=args.guard_support, doc_gate=args.doc_gate,
                      noise=args.noise, doc_related=args.doc_related, memory_guard=args.memory_guard,
                      memory_publish=args.memory_publish,
                      estimate=args.estimate)
    if cfg.estimate == "dr" and cfg.support == "shown":
        raise SystemExit("--support shown leaves out the candidates no answer of their query showed, which the "
                         "doubly-robust estimate (--estimate dr, the default) credits: add --estimate ips")
    what = getattr(args, "learn", "both")
    biencoder, index, store, served = opened(settings)
    try:
        root = args.feedback_dir or settings.feedback_path()
        logs = Logs.read(root)
        props = propensity.estimate(logs.for_propensity(), settings.feedback_swap_depth, fallback_eta=args.eta)
        log(f"{len(logs.impressions)} impressions, {len(logs.events)} events in {root}; propensity: {props.source}")
        about = {"feedback_dir": str(root), "propensity": {"source": props.source, "eta": props.eta,
                                                           "top10": [round(props.of(r), 4) for r in range(1, 11)]}}
        codes, summary, model = [], {"installed": None, **about}, served.model.float().cpu().eval()
        if what in ("both", "cmc"):
            entries, joined = logs.entries(props, clip_of(args), "position")
            lists, stats = build(entries, index, cfg.depth)
            with workspace(store.root):
                code, summary, published = learn_lists(cfg, lists, index, store, biencoder, served, args,
                                                       {**about, "answers": joined, "lists": stats})
            codes.append(code)
            model = published if published is not None else model  # the memory is added to what is served next
        if what in ("both", "memory"):
            code, summary["memory"] = learn_memory_into(cfg, logs, props, index, model, settings, args)
            codes.append(code)
        print(json.dumps(summary, indent=2))
        return 0 if 0 in codes else max(codes)
    finally:
        index.close()


def learn_memory_into(cfg, logs, props, index, model, settings, args) -> tuple[int, dict]:
    """The click memory (training/memory_learn.py) over the ranking `model` serves: published into the index's
    click store (SIEVE_INDEX_DIR/clicks) when its guard passes."""
    import numpy as np

    from sieve.feedback.memory import ClickMemory
    from sieve.feedback.memory_store import MemoryStore
    from sieve.training.feedback_learn import Vectors, scores_of
    from sieve.training.memory_learn import learn_memory

    mstore = MemoryStore(settings.index_dir)
    current = mstore.current()
    served_memory = ClickMemory.load(current) if current is not None else None

    def served_scores(lists):
        return scores_of(model, lists, Vectors(index, lists)) if len(lists) else np.zeros((0, cfg.depth))

    memory, report = learn_memory(cfg, logs, props, index, served_scores, served_memory, clip_of(args))
    report.update({"served_memory": current.name if current else None, "installed": None})
    if memory is None or args.dry_run:
        reason = report.get("not_installed") or "dry run"
        log(f"click memory NOT PUBLISHED: {reason}")
        report["not_installed"] = reason
        if memory is None:
            return (EXIT_TOO_LITTLE if reason == "too little feedback" else EXIT_REFUSED), report
        return 0, report
    work = mstore.new_work_dir()
    memory.save(work)
    (work / "report.json").write_text(json.dumps(report, indent=2))
    path = mstore.publish(work)
    report["installed"] = str(path)
    gate = "" if memory.doc_gate is None else f" at cosine >= {memory.doc_gate:g}"
    related = "" if memory.doc_related is None else f", where a clicker is at cosine >= {memory.doc_related:g}"
    log(f"click memory published {path} (w_query {memory.w_query:.4g}, w_doc {memory.w_doc:.4g}{gate}{related}, "
        f"w_near {memory.w_near:.4g}, pseudo {memory.pseudo:g}); a server on this index loads it on reload or its next "
        "poll")
    return 0, report


def learn_lists(cfg, lists, index, store, biencoder, served, args, about: dict):
    """Split, train, judge, publish (shared by the click learner and the benchmark's full-information ceiling):
    (exit status, report, the model published or None)."""
    from sieve.training.feedback_learn import Vectors, config_dict, guard, split, train, verdict

    if served.config.mode == "separate":
        raise SystemExit("the served CMC reads a candidate store of its own (separate mode); feedback learning "
                         "supports the shared-mode CMCs (the shipped ones, `sieve adapt`'s)")
    rest, held = split(lists, cfg.heldout, cfg.seed, cfg.split)
    fit, validation = split(rest, cfg.validation, cfg.seed + 1, cfg.split)
    summary = {"command": getattr(args, "command_line", None), "index_version": index.version,
               "served": {"name": served.name, "path": str(served.path) if served.path else None}, **about,
               "split": {"train": len(fit), "validation": len(validation), "heldout": len(held)},
               "config": config_dict(cfg)}
    if len(fit) < MIN_TRAIN or not len(validation):
        log(f"too little feedback: {len(fit)} answers with clicks to train on (needs {MIN_TRAIN}) and "
            f"{len(validation)} to validate on; nothing trained")
        return EXIT_TOO_LITTLE, {"installed": None, "not_installed": "too little feedback", **summary}, None
    vectors = Vectors(index, lists)
    base = served.model.float().cpu().eval()
    model, record = train(cfg, fit, validation, base, vectors, log)
    report = guard(model, base, held, vectors, cfg)
    summary.update({"guard": report, "best_step": record["best_step"], "history": record["history"],
                    "train_s": record["train_s"]})
    if getattr(args, "out", None):
        save(model, biencoder, args.out, summary, lists, index)
    refused = verdict(report, record["best_step"], cfg)
    if refused or args.dry_run:
        log(f"NOT PUBLISHED: {refused or '--dry-run'}; the server keeps the CMC it serves")
        return (EXIT_REFUSED if refused else 0), {"installed": None, "not_installed": refused or "dry run",
                                                  **summary}, None
    path = store.publish(save(model, biencoder, store.new_work_dir(), summary, lists, index))
    log(f"published {path}; a server on this index swaps it in on POST /admin/index/reload or its next poll")
    return 0, {"installed": str(path), **summary}, model


def save(model, biencoder, out: Path, summary: dict, lists, index) -> Path:
    """A CMC checkpoint with its report, model card and the ids of the documents its lists held."""
    from datetime import datetime, timezone

    import numpy as np

    from sieve.index.adapted import DOCUMENTS
    from sieve.models.cmc_checkpoint import CMCBundle, save_cmc

    rows = np.unique(lists.rows[lists.rows >= 0])
    ids = index.ids(rows) if len(rows) else []
    adapted = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "documents": len(ids),
               "index_version": summary["index_version"], "trainer": "sieve feedback learn"}
    bundle = CMCBundle(model.cfg, model, biencoder, None, "cmc-feedback", biencoder.weights_hash)
    save_cmc(bundle, out, towers_from_base=True, metadata={"trainer": "sieve feedback learn", "adapted": adapted,
                                                          "command": summary["command"], "guard": summary["guard"]})
    (out / DOCUMENTS).write_text("".join(f"{i}\n" for i in ids), encoding="utf-8")
    (out / "feedback.json").write_text(json.dumps(summary, indent=2))
    (out / "model_card.md").write_text(
        f"# cmc-feedback\n\nCMC trained by `sieve feedback learn` from {summary['split']['train']} answers with clicks "
        f"(inverse-propensity weighted; propensity {summary.get('propensity', {}).get('source', 'n/a')}), started "
        f"from {summary['served']['name']}. Guard on {summary['guard']['heldout_answers']} held-out answers: IPS-DCG "
        f"difference {summary['guard']['delta']}, 95% interval {summary['guard']['interval']}.\n", encoding="utf-8")
    return out


IMPORT_CHUNK = 1000  # lines per append (one fsync each for impressions and events)
IMPORT_MEMO = 10_000  # first stages of recent queries kept (a query's candidates and vector: a few KB each)


def cmd_import(args: argparse.Namespace, settings) -> None:
    import hashlib
    import time

    from tqdm.auto import tqdm

    from sieve.feedback.log import AppendLog
    from sieve.feedback.records import first_stage, query_key
    from sieve.pipeline.searcher import Searcher, SearchParams
    from sieve.service.runtime import searcher_options

    lines = args.file.read_text(encoding="utf-8").splitlines()
    biencoder, index, _, _ = opened(settings)
    root = args.feedback_dir or settings.feedback_path()
    impressions = AppendLog(root, "impressions", int(settings.feedback_retention_mb * 1024 * 1024))
    events = AppendLog(root, "events", int(settings.feedback_retention_mb * 1024 * 1024))
    searcher = Searcher(biencoder, index, **searcher_options(settings))
    depth = min(settings.feedback_log_candidates, index.size)
    from collections import OrderedDict

    candidates: OrderedDict[str, dict] = OrderedDict()  # query -> its first stage: a log repeats its queries
    count = clicks = 0
    pending_impressions: list[dict] = []
    pending_events: list[dict] = []

    def flush() -> None:
        impressions.append(pending_impressions)  # the impressions first: an event never refers to nothing on disk
        events.append(pending_events)
        pending_impressions.clear()
        pending_events.clear()

    try:
        for number, line in enumerate(tqdm(lines, desc="import", unit="answer"), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row.get("query"), str) or not isinstance(row.get("shown"), list):
                raise SystemExit(f"{args.file}:{number}: each line needs a query (string) and shown (list of ids)")
            query = searcher.normalise(row["query"])
            rid = "import-" + hashlib.sha256(f"{args.file}:{number}:{line}".encode()).hexdigest()[:24]
            if query not in candidates:
                outcome = searcher.search(SearchParams(query, top_k=1, retrieve_k=depth, rerank="none",
                                                       retriever="hybrid" if index.has_lexical else "be", cmc_k=1))
                candidates[query] = first_stage(outcome, settings.feedback_log_candidates)
                if len(candidates) > IMPORT_MEMO:
                    candidates.popitem(last=False)
            record = {"request_id": rid, "t": round(time.time(), 3), "endpoint": "/search", "imported": True,
                      "query_key": query_key(query), "shown": [str(i) for i in row["shown"]], "swap": None,
                      **candidates[query]}
            if settings.feedback_log_query_text:
                record["query"] = row["query"]
            clicked = [str(i) for i in row.get("clicked", []) if str(i) in record["shown"]]
            pending_impressions.append(record)
            pending_events.extend({"request_id": rid, "doc_id": doc, "type": "click", "received": record["t"]}
                                  for doc in clicked)
            count, clicks = count + 1, clicks + len(clicked)
            if len(pending_impressions) >= IMPORT_CHUNK:
                flush()
        flush()
    finally:
        searcher.close()
        index.close()
        impressions.close()
        events.close()
    log(f"imported {count} answers with {clicks} clicks into {root}")
