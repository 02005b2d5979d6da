"""annCUR (k-NN search with the cross-encoder itself) against bi-encoder retrieve-and-rerank at equal cross-encoder
budgets, the shape of Yadav et al. 2022, Figure 3; plus the singular-value decay of each cross-encoder's score
matrix ([CLS] vs [emb]) and downstream nDCG@10.

Reduced scale, by necessity: a 2-core CPU scores ~20 pairs/s at 128 tokens, so exact scores of every test query
against a whole corpus (the ground truth) would take days. The scale, every size a flag:
- `--test-queries` judged test queries, a seeded sample;
- a corpus subset: every document judged for those queries plus `--random-docs` others, seeded;
- `--anchor-queries` (k_q) anchor queries, a seeded sample of the `--anchor-split` (train) queries;
- pairs cut to `--max-length` tokens (query to `--query-max-length`).
Exact scores (test queries x subset and anchor queries x subset) are computed once per cross-encoder and cached
in resumable chunks (index/score_matrix.py) under `--work-dir`; the wall time is recorded in the JSON. annCUR
is evaluated with the same CUR code the index builder uses (index/cur.py), its MIPS exact (numpy).

    python benchmarks/anncur.py --data ../shared/data/scifact --ce cls=runs/ce --ce emb=runs/ce-emb --estimate-only
    python benchmarks/anncur.py --data ../shared/data/scifact --ce cls=runs/ce --ce emb=runs/ce-emb
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import anncur_eval  # noqa: E402
from sieve.index import read_beir_corpus, read_qrels, read_queries  # noqa: E402
from sieve.research.anncur.score_matrix import score_matrix, scorer_identity  # noqa: E402


def int_list(text: str) -> list[int]:
    return sorted({int(x) for x in text.split(",") if x.strip()})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", required=True, type=Path, help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
    p.add_argument("--ce", required=True, action="append", help="LABEL=PATH of a cross-encoder checkpoint; repeat")
    p.add_argument("--name", help="dataset name in file names (default: the --data folder's name)")
    p.add_argument("--split", default="test")
    p.add_argument("--anchor-split", default="train", help="qrels split whose queries may be anchor queries")
    p.add_argument("--test-queries", type=int, default=50)
    p.add_argument("--random-docs", type=int, default=400, help="unjudged documents added to the judged ones")
    p.add_argument("--anchor-queries", type=int, default=64, help="k_q")
    p.add_argument("--k-i", type=int_list, default=[8, 16, 32, 64], help="anchor items, comma-separated")
    p.add_argument("--budgets", type=int_list, default=[16, 32, 64, 100, 150, 200, 300], help="CE calls per query")
    p.add_argument("--anchor-method", choices=["random", "top"], default="random")
    p.add_argument("--seeds", type=int, default=3, help="anchor-item draws averaged per k_i")
    p.add_argument("--seed", type=int, default=0, help="query and corpus sampling")
    p.add_argument("--max-length", type=int, default=128, help="pair tokens")
    p.add_argument("--query-max-length", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32, help="pairs per cross-encoder forward")
    p.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "sieve" / "anncur-bench")
    p.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--parts", action="store_true",
                   help="also evaluate each part of a sum-of-parts cross-encoder (gated: LABEL:cls, the [CLS] logit, "
                        "and LABEL:cos, the contextualised-embedding score) as a cross-encoder of its own; one "
                        "scoring pass gives all of them")
    p.add_argument("--estimate-only", action="store_true", help="measure throughput, print the run time, stop")
    return p.parse_args(argv)


# -- the reduced world ----------------------------------------------------------------------------------------
def sample(ids: list[str], n: int, seed: int) -> list[str]:
    ids = sorted(ids)
    return ids if n >= len(ids) else sorted(np.random.default_rng(seed).choice(ids, n, replace=False).tolist())


def load_world(args) -> dict:
    """Test queries, anchor queries and the corpus subset (rows in corpus order), all seeded."""
    queries = read_queries(args.data / "queries.jsonl")
    test_qrels = read_qrels(args.data / "qrels" / f"{args.split}.tsv")
    judged = [q for q, g in test_qrels.items() if q in queries and any(v > 0 for v in g.values())]
    test = sample(judged, args.test_queries, args.seed)
    anchor_pool = [q for q in read_qrels(args.data / "qrels" / f"{args.anchor_split}.tsv") if q in queries]
    taken = set(test)
    anchors = sample([q for q in anchor_pool if q not in taken], args.anchor_queries, args.seed + 1)
    corpus = read_beir_corpus(args.data / "corpus.jsonl")
    wanted = {d for q in test for d in test_qrels[q]}
    kept = [i for i, d in enumerate(corpus) if d.id in wanted]
    others = [i for i, d in enumerate(corpus) if d.id not in wanted]
    extra = np.random.default_rng(args.seed + 2).choice(others, min(args.random_docs, len(others)), replace=False)
    rows = sorted(kept + extra.tolist())
    docs = [corpus[i] for i in rows]
    return {"test_ids": test, "test_texts": [queries[q] for q in test], "qrels": [test_qrels[q] for q in test],
            "anchor_ids": anchors, "anchor_texts": [queries[q] for q in anchors], "docs": docs,
            "doc_ids": [d.id for d in docs], "doc_texts": [d.full_text for d in docs],
            "judged_docs": len(kept), "corpus_size": len(corpus)}


def bi_encoder_scores(world: dict) -> np.ndarray:
    """(Q, N) inner products of the packaged bi-encoder (document vectors from the shared embedding cache)."""
    import torch

    from sieve.index.cache import encode_cached
    from sieve.service.components import load_biencoder
    from sieve.service.config import Settings

    settings = Settings()
    be = load_biencoder(settings, torch.device("cpu"))
    docs = encode_cached(be, world["doc_texts"], settings.cache_dir, progress=True)
    queries = be.encode_queries(world["test_texts"]).float().numpy()
    return queries @ docs.T


def load_ce(path: str, args):
    from sieve.models.cross_encoder import CrossEncoder, PairLengths

    return CrossEncoder.from_pretrained(path, lengths=PairLengths(args.query_max_length, args.max_length),
                                        batch_size=args.batch_size)


def pairs_per_second(ce, world: dict, n: int = 32) -> float:
    docs = world["doc_texts"][:n]
    ce.score(world["test_texts"][0], docs[:4])  # warm-up
    began = time.perf_counter()
    ce.score(world["test_texts"][0], docs)
    return len(docs) / (time.perf_counter() - began)


def work_dir(args, name: str, ce, part: str) -> Path:
    key = f"{ce.weights_hash[:12]}-q{args.query_max_length}-p{args.max_length}-s{args.seed}"
    return args.work_dir / name / key / part


# -- one cross-encoder ----------------------------------------------------------------------------------------
def exact_scores(label: str, path: str, args, name: str, world: dict) -> tuple[dict, dict]:
    """label -> (head, test x documents, anchor queries x documents) exact scores, and what every label's info
    shares (checkpoint, and the pairs and time the scores took). With --parts and a sum-of-parts head, its parts
    too (label:part), from the same scoring pass."""
    ce = load_ce(path, args)
    parts = args.parts and bool(ce.part_names)
    folder = "-parts" if parts else ""
    m_test, t_test = score_matrix(ce, world["test_texts"], world["doc_texts"],
                                  work_dir(args, name, ce, "test" + folder), parts=parts)
    r_anc, t_anc = score_matrix(ce, world["anchor_texts"], world["doc_texts"],
                                work_dir(args, name, ce, "anchor" + folder), parts=parts)
    head = scorer_identity(ce)["head"]  # the loaded head: cls, cls+cos, emb, gated, ...
    pairs, seconds = t_test["pairs"] + t_anc["pairs"], t_test["seconds"] + t_anc["seconds"]
    shared = {"path": str(path), "weights_hash": ce.weights_hash,
              "exact_scores": {"test_pairs": int(m_test.shape[0] * m_test.shape[1]),
                               "anchor_pairs": int(r_anc.shape[0] * r_anc.shape[1]), "pairs_scored": pairs,
                               "seconds": seconds, "pairs_per_s": pairs / seconds if seconds else None}}
    if not parts:
        return {label: (head, m_test, r_anc)}, shared
    out = {label: (head, m_test.sum(axis=-1), r_anc.sum(axis=-1))}
    for i, part in enumerate(ce.part_names):
        out[f"{label}:{part}"] = (f"{head} part {part}", m_test[..., i], r_anc[..., i])
    return out, shared


def evaluate_ce(label: str, path: str, args, name: str, world: dict, be: np.ndarray) -> tuple[dict, list[dict]]:
    """label -> info, and the rows of every score that one checkpoint gives (itself, and its parts with --parts)."""
    matrices, shared = exact_scores(label, path, args, name, world)
    infos, rows = {}, []
    for output, (head, m_test, r_anc) in matrices.items():
        info, output_rows = evaluate_matrix(output, head, m_test, r_anc, args, world, be)
        infos[output] = {"path": shared["path"], "head": head, "weights_hash": shared["weights_hash"],
                         "exact_scores": shared["exact_scores"], **info}
        rows += output_rows
    return infos, rows


def evaluate_matrix(label: str, head: str, m_test: np.ndarray, r_anc: np.ndarray, args, world: dict,
                    be: np.ndarray) -> tuple[dict, list[dict]]:
    k_is = [k for k in args.k_i if k <= min(len(world["anchor_texts"]), len(world["docs"]))]
    qrels = world["qrels"]
    rows = [anncur_eval.exhaustive_row(m_test, world["doc_ids"], qrels),
            *anncur_eval.be_rows(m_test, be, args.budgets, world["doc_ids"], qrels),
            *anncur_eval.anncur_rows(m_test, r_anc, k_is, args.budgets, list(range(args.seeds)), world["doc_ids"],
                                     qrels, args.anchor_method)]
    everything = np.vstack([r_anc, m_test])
    info = {"spectrum_test": anncur_eval.spectrum(m_test), "spectrum_all": anncur_eval.spectrum(everything),
            "spectrum_all_centered": anncur_eval.spectrum(everything, center_rows=True)}
    return info, [{"cross_encoder": label, **row} for row in rows]


def estimate(args, world: dict, specs: list[tuple[str, str]]) -> None:
    n_pairs = (len(world["test_texts"]) + len(world["anchor_texts"])) * len(world["docs"])
    for label, path in specs:
        rate = pairs_per_second(load_ce(path, args), world)
        print(f"{label}: {n_pairs} pairs at {rate:.1f} pairs/s measured now -> ~{n_pairs / rate / 60:.0f} min "
              f"(less whatever is already cached under {args.work_dir})")


def markdown(rows: list[dict]) -> str:
    keys = ["cross_encoder", "method", "k_i", "ce_calls", "topk_recall@1", "topk_recall@10", "topk_recall@100", "ndcg@10"]
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        out.append("| " + " | ".join("-" if r.get(k) is None else f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k])
                                     for k in keys) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    from sieve.evaluation.report import machine_info

    specs = [tuple(s.split("=", 1)) if "=" in s else (Path(s).name, s) for s in args.ce]
    name = args.name or args.data.name
    world = load_world(args)
    print(f"{name}: {len(world['test_texts'])} test queries, {len(world['anchor_texts'])} anchor queries, "
          f"{len(world['docs'])} documents ({world['judged_docs']} judged + random) of {world['corpus_size']}",
          file=sys.stderr)
    if args.estimate_only:
        estimate(args, world, specs)
        return None
    started, load = time.perf_counter(), list(os.getloadavg())
    be = bi_encoder_scores(world)
    doc = {"dataset": name, "split": args.split, "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "command": shlex.join(["python", "benchmarks/anncur.py", *(argv if argv is not None else sys.argv[1:])]),
           "machine": {**machine_info(), "load_avg_start": load},
           "scale": {"test_queries": len(world["test_texts"]), "anchor_queries_k_q": len(world["anchor_texts"]),
                     "documents": len(world["docs"]), "judged_documents": world["judged_docs"],
                     "corpus_documents": world["corpus_size"], "max_length": args.max_length,
                     "query_max_length": args.query_max_length, "anchor_split": args.anchor_split,
                     "anchor_method": args.anchor_method, "anchor_seeds": args.seeds, "seed": args.seed},
           "cross_encoders": {}, "rows": []}
    for label, path in specs:
        infos, rows = evaluate_ce(label, path, args, name, world, be)
        doc["cross_encoders"].update(infos)
        doc["rows"] += rows
    doc["wall_s"] = time.perf_counter() - started
    write(doc, args.out_dir)
    print(markdown(doc["rows"]))
    return doc


def write(doc: dict, out_dir: Path) -> None:
    from benchmarks.anncur_plots import figure3, spectrum_plot

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"anncur_{doc['dataset']}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    written = [path, figure3(doc, out_dir / f"anncur_{doc['dataset']}.png"),
               spectrum_plot(doc, out_dir / f"anncur_{doc['dataset']}_spectrum.png")]
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)


if __name__ == "__main__":
    main()
