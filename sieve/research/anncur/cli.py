"""`sieve index anncur`: build an annCUR index (item embeddings from a cross-encoder's own scores) over a main index.

The cost is R_anc, k_q anchor queries x every document, scored by the cross-encoder: on a 2-core CPU about
20 pairs/s at 128 tokens and 8 at 256, so k_q = 100 over SciFact's 5,183 documents is ~7 h at 128 tokens.
It is computed in chunks under --work-dir (default OUT/r_anc): an interrupted build resumes where it stopped,
and a rebuild with another k_i or anchor method reuses it without a single cross-encoder call.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(index_commands) -> None:
    p = index_commands.add_parser("anncur", help="annCUR index: k-NN search with the cross-encoder itself",
                                  description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", required=True, type=Path, help="main index whose documents (and rows) it covers")
    p.add_argument("--cross-encoder", required=True, type=Path, help="cross-encoder checkpoint ([CLS] or [emb])")
    p.add_argument("--queries", required=True, type=Path, help="anchor query pool: BEIR queries.jsonl or a query log")
    p.add_argument("--qrels", type=Path, help="keep only queries judged here (e.g. qrels/train.tsv): no test query "
                                              "becomes an anchor")
    p.add_argument("--out", required=True, type=Path, help="annCUR index directory (serve with SIEVE_ANNCUR_DIR)")
    p.add_argument("--k-q", type=int, default=100, help="anchor queries, a seeded sample (default 100)")
    p.add_argument("--k-i", type=int, default=50, help="anchor items = cross-encoder calls per query (default 50)")
    p.add_argument("--anchors", choices=["random", "top"], default="random",
                   help="anchor items: seeded uniform sample, or the anchor queries' best-scored items (default random)")
    p.add_argument("--seed", type=int, default=0, help="seed of the query and item samples (default 0)")
    p.add_argument("--work-dir", type=Path, help="where R_anc chunks go (default OUT/r_anc)")
    p.add_argument("--max-length", type=int, default=256, help="pair tokens; serving uses the same (default 256)")
    p.add_argument("--query-max-length", type=int, default=64, help="query tokens in a pair (default 64)")
    p.add_argument("--batch-size", type=int, default=32, help="pairs per cross-encoder forward pass (default 32)")
    p.add_argument("--faiss", choices=["flat", "ivf", "hnsw"], default="flat", help="index over the item embeddings")
    p.set_defaults(func=cmd_anncur)


def cmd_anncur(args: argparse.Namespace, settings) -> None:
    import torch

    from sieve.index import read_qrels, read_queries
    from sieve.research.anncur.index import AnnCURConfig, build_anncur_index, pick_anchor_queries
    from sieve.models.cross_encoder import CrossEncoder, PairLengths
    from sieve.models.device import pick_device

    for name in ("k_q", "k_i", "max_length", "query_max_length", "batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    only = list(read_qrels(args.qrels)) if args.qrels else None
    anchors = pick_anchor_queries(read_queries(args.queries), args.k_q, args.seed, only)
    ce = CrossEncoder.from_pretrained(args.cross_encoder, lengths=PairLengths(args.query_max_length, args.max_length),
                                      device=pick_device(settings.device), batch_size=args.batch_size)
    print(f"annCUR: {len(anchors)} anchor queries x the documents of {args.index}, cross-encoder {ce.name}",
          file=sys.stderr)
    cfg = AnnCURConfig(k_i=args.k_i, anchor_method=args.anchors, seed=args.seed, faiss_kind=args.faiss)
    manifest, record = build_anncur_index(args.index, ce, anchors, args.out, cfg, work_dir=args.work_dir)
    print(json.dumps({"index": str(args.out), "count": manifest.count, "version": manifest.version,
                      "k_q": record["k_q"], "k_i": record["k_i"], "r_anc_seconds": round(record["r_anc"]["seconds"], 1),
                      "anchor_query_fit_error": round(record["anchor_query_fit_error"], 6)}))
