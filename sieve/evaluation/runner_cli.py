"""`sieve eval`: ranking quality, per-stage latency and cross-encoder cost of each pipeline on a BEIR split.

In-process by default (the service's own components over an index of the dataset's corpus, built once and
cached); with --server the same requests go to a running server's POST /search, the path users hit.
"""
from __future__ import annotations

import argparse
import logging
import shlex
import sys
from contextlib import ExitStack, closing
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from sieve.evaluation.defaults import DEFAULT_PIPELINES

if TYPE_CHECKING:
    from sieve.evaluation.runner import EvalConfig

FLAGS = ("data", "split", "pipelines", "server", "index", "retrieve_k", "cmc_k", "ce_k", "max_queries", "seed",
         "out_dir", "name", "table2", "transfer", "tag", "merge")
TRANSFER_PIPELINES = "be,bm25,hybrid,be+cmc,hybrid+cmc,be+cmc+ce,hybrid+cmc+ce"


def pipelines_arg(text: str) -> list[str]:
    import sieve.stages  # noqa: F401 (registers the core stages: only once --pipelines is given)
    from sieve.evaluation.runner import parse_pipelines
    from sieve.pipeline import registry

    registry.load_plugins()  # the research stages' pipelines (annCUR, MixEncoder, late interaction)
    try:
        return parse_pipelines(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate pipelines on a BEIR split (metrics, latency, CE cost)",
                       description=__doc__)
    p.add_argument("--data", required=True, type=Path, help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv")
    p.add_argument("--split", default="test", help="qrels file to score against (default: test)")
    p.add_argument("--pipelines", type=pipelines_arg, default=list(DEFAULT_PIPELINES),
                   help=f"comma-separated, from {','.join(DEFAULT_PIPELINES)} (default: all)")
    p.add_argument("--server", help="base URL of a running server; default: run in this process")
    p.add_argument("--index", type=Path,
                   help="in-process index directory; default: build or reuse <cache_dir>/eval-indexes/<name>-*")
    p.add_argument("--retrieve-k", type=int, default=512, help="bi-encoder candidates, what CMC reranks (default 512)")
    p.add_argument("--cmc-k", type=int, default=16, help="K': CMC candidates passed to the CE in be+cmc+ce (default 16)")
    p.add_argument("--ce-k", type=int, default=64, help="bi-encoder candidates passed to the CE in be+ce (default 64)")
    p.add_argument("--max-queries", type=int, help="evaluate a seeded sample of this many queries")
    p.add_argument("--seed", type=int, default=0, help="seed of the --max-queries sample (default 0)")
    p.add_argument("--out-dir", type=Path, default=Path("benchmarks/results"), help="where eval_<name>.json and PNGs go")
    p.add_argument("--name", help="dataset name in file names and the JSON (default: the --data folder's name)")
    p.add_argument("--table2", action="store_true",
                   help="also the CMC paper's Table 2 (CE nDCG@10 over K' from BE vs BE+CMC; in-process)")
    p.add_argument("--transfer", action="store_true",
                   help="the transfer report: --data is the folder holding scifact/, nfcorpus/ and arguana/; each "
                        "pipeline on each test split (SciFact also by seen / unseen documents), macro-average, and the "
                        f"default pipeline chosen from it; writes transfer.json + transfer.png (pipelines default "
                        f"{TRANSFER_PIPELINES}; in-process)")
    p.add_argument("--tag", help="--transfer: name this run's pipelines <name>[TAG] (e.g. the CMC checkpoint served)")
    p.add_argument("--merge", type=Path, help="--transfer: add this run's rows to that transfer.json (macro and default "
                                              "recomputed over all rows) instead of starting a new one")
    p.set_defaults(func=cmd_eval)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def command_line(args: argparse.Namespace) -> str:
    words = ["sieve", "eval"]
    for dest in FLAGS:
        value = getattr(args, dest, None)
        if value is None or value is False:
            continue
        words.append("--" + dest.replace("_", "-"))
        if value is not True:
            words.append(",".join(value) if isinstance(value, list) else str(value))
    return shlex.join(words)


def cmd_eval(args: argparse.Namespace, settings) -> None:
    from sieve.evaluation.dataset import load_split
    from sieve.evaluation.runner import EvalConfig

    cfg = EvalConfig(retrieve_k=args.retrieve_k, cmc_k=args.cmc_k, ce_k=args.ce_k)
    if args.max_queries is not None and args.max_queries < 1:
        raise ValueError(f"--max-queries must be >= 1, got {args.max_queries}")
    if args.transfer:
        return cmd_transfer(args, settings, cfg)
    data = load_split(args.data, args.split, name=args.name, max_queries=args.max_queries, seed=args.seed)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per /search request would bury the output
    log(f"{data.name} {data.split}: {len(data.queries)} judged queries")
    doc = evaluate(args, settings, data, cfg)
    print(render_and_write(doc, args.out_dir))


def cmd_transfer(args: argparse.Namespace, settings, cfg: EvalConfig) -> None:
    import json

    from sieve.evaluation.backends import InProcessBackend
    from sieve.evaluation.local import load_local
    from sieve.evaluation.runner import parse_pipelines
    from sieve.evaluation.transfer import render, transfer_report

    if args.server:
        raise ValueError("--transfer runs in-process (one index per dataset); drop --server")
    pipelines = args.pipelines if args.pipelines != list(DEFAULT_PIPELINES) else parse_pipelines(TRANSFER_PIPELINES)
    with ExitStack() as stack:
        def backend(data):
            components = stack.enter_context(closing(load_local(settings, data.name, data.corpus_path)))
            return InProcessBackend(components.searcher, components.precision)

        doc = transfer_report(backend, args.data, pipelines, cfg, args.max_queries, args.seed, log)
    doc["command"] = command_line(args)
    if args.merge or args.tag:
        from sieve.evaluation.transfer import merge

        base = json.loads(args.merge.read_text()) if args.merge else {**doc, "rows": [], "pipelines": [], "runs": []}
        doc = merge(base, doc, args.tag)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / "transfer.json"
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    written = [path]
    try:
        from sieve.evaluation.plots import write_transfer_plot

        written.append(write_transfer_plot(doc, args.out_dir / "transfer.png"))
    except ImportError:
        log("matplotlib is not installed (pip install -e '.[bench]'): no plot written")
    log("wrote " + ", ".join(str(p) for p in written))
    print(render(doc))


def evaluate(args: argparse.Namespace, settings, data, cfg: EvalConfig) -> dict:
    """Runs the pipelines (and Table 2); in-process components are loaded only when something needs them."""
    from sieve.evaluation.backends import HttpBackend, InProcessBackend
    from sieve.evaluation.local import load_local
    from sieve.evaluation.report import eval_document
    from sieve.evaluation.runner import run_pipelines
    from sieve.evaluation.table2 import run_table2

    with ExitStack() as stack:
        local = None
        if not args.server or args.table2:  # Table 2 always runs on local components
            local = stack.enter_context(closing(load_local(settings, data.name, data.corpus_path, args.index)))
        if args.server:
            backend = stack.enter_context(closing(HttpBackend(args.server)))
        else:
            backend = InProcessBackend(local.searcher, local.precision)
        ce_log: dict = {}  # CE scores the pipelines compute, reused by Table 2 (same model, same pairs)
        pipelines = run_pipelines(backend, data, args.pipelines, cfg, log=log, ce_log=ce_log)
        reuse = ce_log if not args.server else None  # a server may run another cross-encoder
        table2 = run_table2(local.searcher, data, log=log, known=reuse) if args.table2 else None
    if not pipelines and table2 is None:
        raise SystemExit("sieve eval: nothing could run with the stages configured (see the messages above)")
    return eval_document(data, pipelines, settings_record(settings, cfg, args, backend), command_line(args), table2)


def settings_record(settings, cfg: EvalConfig, args: argparse.Namespace, backend) -> dict:
    """The eval's own knobs, what answered (index, models), and the service settings when in-process."""
    served = backend.describe()
    service = None if args.server else {**settings.model_dump(mode="json"), "index_dir": served["index_dir"]}
    return {"eval": {**asdict(cfg), "max_queries": args.max_queries, "seed": args.seed}, "backend": served,
            "service": service}


def render_and_write(doc: dict, out_dir: Path) -> str:
    from sieve.evaluation.report import render, write_json

    written = [write_json(doc, out_dir)]
    if doc["pipelines"]:
        try:
            from sieve.evaluation.plots import write_plots

            written += write_plots(doc, out_dir)
        except ImportError:
            log("matplotlib is not installed (pip install -e '.[bench]'): no plots written")
    log("wrote " + ", ".join(str(p) for p in written))
    return render(doc)
