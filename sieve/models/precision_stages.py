"""The stages that run in lower precision (models/precision.py), each with its guard probe: fixed inputs from the
packaged demo corpus, scored by the fp32 and the lowered module.

Each function returns (module to serve, Choice); the caller puts the module in place. The bi-encoder's document
tower has a setting of its own (SIEVE_DOC_PRECISION): an index and its live writes are encoded by whatever the
process that encodes them picked, and a lowered vector is within 1e-4 in cosine of its fp32 one (SciFact abstracts in
bf16 on an AMD Zen 5 host: at least 0.99992; benchmarks/results/doc_encode_*.json), so an index built in one
precision and written to in another keeps one ranking.
"""
from __future__ import annotations

import json
import logging
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

from sieve.models import attention, openvino_scorer
from sieve.models.cmc_checkpoint import CMCBundle
from sieve.models.cross_encoder import CrossEncoder
from sieve.models.precision import Choice, Probe, best_dtype, guarded, lower
from sieve.models.text_encoder import TextEncoder

DEMO_CORPUS = Path(__file__).resolve().parents[1] / "demo_corpus.jsonl"
N_QUERIES, N_DOCS = 8, 32  # probe rankings, items per ranking
N_PROBE_DOCS = 16  # the document tower's probe: each is encoded at the document length, slow in fp32 on a CPU
RUNTIMES = ("auto", "torch", "openvino")  # the cross-encoder's (SIEVE_CE_RUNTIME)
log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def probe_texts() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Queries (titles of every 7th document) and documents (the first N_DOCS texts) of the demo corpus."""
    docs = [json.loads(line) for line in DEMO_CORPUS.read_text().splitlines() if line.strip()]
    return tuple(d["title"] for d in docs[::7][:N_QUERIES]), tuple(d["text"] for d in docs[:N_DOCS])


def doc_vectors(encoder: TextEncoder) -> torch.Tensor:
    return torch.from_numpy(encoder.encode(list(probe_texts()[1]), encoder.lengths.doc_max_length))  # (N, d) fp32


def query_probe(encoder: TextEncoder) -> Probe:
    """Inner products of the probe queries, encoded by the module, with fp32 probe document vectors."""
    docs = doc_vectors(encoder).to(encoder.device)
    inputs = encoder.tokenize(list(probe_texts()[0]), encoder.lengths.query_max_length)

    def probe(module: nn.Module) -> np.ndarray:
        with torch.inference_mode():
            return (module(**inputs).float() @ docs.T).cpu().numpy()  # (P, N)

    return probe


def cmc_probe(bundle: CMCBundle, biencoder: TextEncoder) -> Probe:
    """A CMC module scoring each probe query (fp32 vector) against all probe documents."""
    device = bundle.query_tower.device
    cands = doc_vectors(biencoder).to(device)  # (N, d)
    queries = torch.from_numpy(biencoder.encode(list(probe_texts()[0]), biencoder.lengths.query_max_length)).to(device)
    P, (N, d) = len(queries), cands.shape
    features = None
    if bundle.config.evidence:  # feature 0 is the first-stage prior (-log1p(rank)); the rest seeded noise
        gen = torch.Generator().manual_seed(0)
        features = torch.randn(P, N, bundle.config.evidence, generator=gen)  # (P, N, F)
        features[..., 0] = -torch.log1p(torch.arange(N, dtype=torch.float32))
        features = features.to(device)

    def probe(module: nn.Module) -> np.ndarray:
        with torch.inference_mode():
            return module(queries, cands.expand(P, N, d), None, features).float().cpu().numpy()  # (P, N)

    return probe


def ce_probe(ce: CrossEncoder, n_queries: int = 4, n_docs: int = N_DOCS) -> Probe:
    """A pair scorer on n_queries probe queries x n_docs probe documents."""
    queries, docs = probe_texts()
    batches = [ce.tokenize_pairs(q, list(docs[:n_docs])) for q in queries[:n_queries]]

    def probe(module: nn.Module) -> np.ndarray:
        with torch.inference_mode():
            return np.stack([module(**batch).float().cpu().numpy() for batch in batches])  # (n_queries, n_docs)

    return probe


def lower_query_tower(encoder: TextEncoder, mode: str) -> tuple[nn.Module, Choice]:
    """The module to encode queries with (documents stay with encoder.module, fp32). Queries are short (at most
    query_max_length tokens, 64 by default): torch's attention kernel is as fast there, and the chunked-attention
    mode would cost more than it saves (models/attention.py)."""
    return lower(encoder.module, encoder.device, mode, query_probe(encoder), int8=False,
                 chunked_attention=None if encoder.lengths.query_max_length >= attention.MIN_KEYS else False)


def document_probe(encoder: TextEncoder) -> Probe:
    """Inner products of fp32 probe query vectors with the probe documents, encoded by the module (at the encoder's
    document length and batch size, as an index build encodes them). The query vectors are encoded on the first
    call: with SIEVE_PRECISION=fp32 there is none."""
    docs = list(probe_texts()[1][:N_PROBE_DOCS])

    @lru_cache(maxsize=1)
    def queries() -> np.ndarray:
        return encoder.encode(list(probe_texts()[0]), encoder.lengths.query_max_length)  # (P, d) fp32

    def probe(module: nn.Module) -> np.ndarray:
        return queries() @ encoder.encode(docs, encoder.lengths.doc_max_length, module=module).T  # (P, N)

    return probe


def lower_document_tower(encoder: TextEncoder, mode: str) -> tuple[nn.Module, Choice]:
    """The module to encode documents with (index build, live writes): the bi-encoder in the precision
    best_dtype picks (fp16 on CUDA, bf16 on a CPU with native bf16; never int8), kept only where it keeps the
    probe documents' rankings for the probe queries (and, on a CPU, is not pathologically slower); else fp32."""
    return lower(encoder.module, encoder.device, mode, document_probe(encoder), int8=False)


def lower_cmc(bundle: CMCBundle, biencoder: TextEncoder, mode: str) -> tuple[nn.Module, Choice]:
    """The CMC module to serve; only its attention layers are lowered (the evidence weights stay fp32)."""
    return lower(bundle.model, bundle.query_tower.device, mode, cmc_probe(bundle, biencoder), only="layers")


def lower_cross_encoder(ce: CrossEncoder, mode: str, runtime: str = "auto") -> tuple[CrossEncoder, Choice]:
    """A CrossEncoder sharing tokenizer and settings with the scorer to serve: compiled by OpenVINO where `runtime`
    allows it (openvino_runtime), else torch in the best dtype (precision.lower); when OpenVINO was tried and not
    kept, the torch record says why."""
    probe, tried = ce_probe(ce), None
    if openvino_runtime(ce, mode, runtime):
        scorer, tried = compiled_cross_encoder(ce, mode, probe)
    if tried is not None and tried.runtime == "openvino":
        choice = tried
    else:
        scorer, choice = lower(ce.scorer, ce.device, mode, probe, int8=False)
        if tried is not None:
            choice = replace(choice, reason=f"{choice.reason}; {tried.reason}")
    if scorer is ce.scorer:
        return ce, choice
    return CrossEncoder(scorer, ce.tokenizer, name=ce.name, weights_hash=ce.weights_hash, lengths=ce.lengths,
                        device=ce.device, batch_size=ce.batch_size), choice


def openvino_runtime(ce: CrossEncoder, mode: str, runtime: str) -> bool:
    """Whether to try OpenVINO: runtime "openvino", or "auto" with precision auto on a CPU with native bf16 (where it
    was measured faster than torch, docs/performance.md)."""
    if runtime not in RUNTIMES:
        raise ValueError(f"cross-encoder runtime {runtime!r} is not one of {RUNTIMES}")
    if runtime == "torch" or ce.device.type != "cpu":
        return False
    if runtime == "openvino":
        if not openvino_scorer.available():
            raise RuntimeError("SIEVE_CE_RUNTIME=openvino but the openvino package is not installed")
        return True
    return openvino_scorer.available() and best_dtype(ce.device, mode, int8=False)[0] == "bf16"


def compiled_cross_encoder(ce: CrossEncoder, mode: str, probe: Probe) -> tuple[nn.Module, Choice]:
    """The OpenVINO-compiled scorer in the dtype precision.best_dtype picks (bf16 or fp32), guarded; the fp32 torch
    scorer and a record saying why when it fails to convert or moves rankings."""
    dtype, reason = best_dtype(ce.device, mode, int8=False)  # a CPU's: bf16 or fp32
    queries, docs = probe_texts()
    try:
        candidate = openvino_scorer.compile_scorer(ce.scorer, ce.tokenize_pairs(queries[0], list(docs[:4])), dtype)
    except Exception as exc:  # noqa: BLE001 - any conversion failure leaves the torch path, said in /readyz
        log.warning("OpenVINO could not compile the cross-encoder, torch serves it: %s", exc)
        return ce.scorer, Choice("fp32", f"OpenVINO failed to compile ({type(exc).__name__}: {' '.join(str(exc).split())})"[:400])
    choice = Choice(dtype, f"{reason}; OpenVINO {openvino_scorer.version()}", runtime="openvino")
    return guarded(ce.scorer, candidate, probe, choice)
