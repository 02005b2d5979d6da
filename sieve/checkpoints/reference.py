"""Reference scores of the shipped checkpoints on fixed inputs (the bundled demo corpus), written beside each
checkpoint as reference.json when it is shipped; tests/test_shipped_checkpoints.py recomputes them from the files,
so a damaged or replaced binary, or a change in how it is loaded or run, shows as a failing test.

    python -m checkpoints.reference    # rewrite reference.json for every shipped checkpoint
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

QUERIES = ("how do volcanoes erupt", "baking bread with yeast", "why do stars swell into red giants")
DEMO_CORPUS = Path(__file__).resolve().parents[1] / "demo_corpus.jsonl"
CE_EVERY = 4  # the cross-encoder scores every 4th demo document (15 pairs per query): a few seconds on a CPU


def demo_documents() -> tuple[list[str], list[str]]:
    docs = [json.loads(line) for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [d["_id"] for d in docs], [f"{d['title']} {d['text']}".strip() for d in docs]


def demo_bm25(texts: list[str], queries) -> np.ndarray:
    """(Q, N) BM25 scores of the demo documents, with the index's own lexical part (default analyzer)."""
    import tempfile

    from sieve.index.corpus import Document
    from sieve.index.lexical import LexicalConfig, LexicalIndex, write_lexical

    with tempfile.TemporaryDirectory() as tmp:
        write_lexical(Path(tmp), [Document(str(i), "", t) for i, t in enumerate(texts)], LexicalConfig())
        lexical = LexicalIndex(Path(tmp), LexicalConfig(), len(texts))
        return np.stack([lexical.scores(q) for q in queries])


def cmc_reference(biencoder, bundle) -> dict:
    """CMC scores of each query against all demo documents at once (in corpus order; an evidence CMC gets the
    features of that list, BM25 from the default analyzer)."""
    from sieve.pipeline.evidence import features

    ids, texts = demo_documents()
    docs = torch.from_numpy(biencoder.encode_documents(texts, progress=False))  # (N, d)
    queries = bundle.query_tower.encode_queries(list(QUERIES)).float().cpu()  # (Q, d)
    evidence = None
    if bundle.config.evidence:
        bm25 = demo_bm25(texts, QUERIES)
        evidence = torch.stack([torch.from_numpy(features((docs @ q).numpy(), bm25[i], bundle.config.evidence))
                                for i, q in enumerate(queries)])
    with torch.inference_mode():
        scores = bundle.model(queries, docs.unsqueeze(0).expand(len(QUERIES), -1, -1).contiguous(), None,
                              evidence)  # (Q, N)
    return {"queries": list(QUERIES), "doc_ids": ids, "scores": scores.tolist()}


def ce_reference(cross_encoder) -> dict:
    """Cross-encoder scores of each query against every CE_EVERY-th demo document."""
    ids, texts = demo_documents()
    picks = list(range(0, len(ids), CE_EVERY))
    return {"queries": list(QUERIES), "doc_ids": [ids[i] for i in picks],
            "scores": [cross_encoder.score(q, [texts[i] for i in picks]).tolist() for q in QUERIES]}


def load_shipped_cross_encoder():
    """checkpoints/cross-encoder as the service loads it with no settings: at the pair lengths it was trained with."""
    from sieve import checkpoints
    from sieve.models.ce_heads import trained_lengths
    from sieve.models.cross_encoder import CrossEncoder

    return CrossEncoder.from_pretrained(checkpoints.CROSS_ENCODER, lengths=trained_lengths(checkpoints.CROSS_ENCODER))


def max_abs_diff(a: dict, b: dict) -> float:
    assert a["queries"] == b["queries"] and a["doc_ids"] == b["doc_ids"], "reference inputs differ"
    return float(np.abs(np.asarray(a["scores"]) - np.asarray(b["scores"])).max())


def main() -> None:
    from sieve import checkpoints
    from sieve.models.cmc_checkpoint import load_cmc
    from sieve.models.text_encoder import EncoderLengths, TextEncoder
    from sieve.models.weights import default_model_path

    biencoder = TextEncoder.from_pretrained(default_model_path(), name="all-MiniLM-L6-v2", lengths=EncoderLengths())
    for path in (checkpoints.CMC, checkpoints.CMC_LISTWISE):
        if checkpoints.shipped(path):
            ref = cmc_reference(biencoder, load_cmc(path, biencoder))
            (path / "reference.json").write_text(json.dumps(ref) + "\n", encoding="utf-8")
    if checkpoints.shipped(checkpoints.CROSS_ENCODER):
        ref = ce_reference(load_shipped_cross_encoder())
        (checkpoints.CROSS_ENCODER / "reference.json").write_text(json.dumps(ref) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
