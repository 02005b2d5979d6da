"""Training CMC (CMC paper, section 3.2 and appendix C): on labelled BEIR data, or distilled from a cross-encoder.

Labelled: each (training query, judged-relevant document) pair is one example with K candidates mined from the
bi-encoder (gold first, a fraction p of the negatives fixed as its top-ranked, the rest sampled by exp(score)),
re-mined every epoch from a seeded generator. Loss: lambda_ce * CE(gold) + lambda_kl * KL(p_CMC || r_bi-encoder).
Dev: CMC reranking of the bi-encoder's top-k (nDCG@10, MRR@10) next to the bi-encoder's own ranking.
Distillation (no labels): the candidates are the bi-encoder's top-K, the target the cross-encoder's scores.

Regimes (what is trained):
  layers    the attention layers only; the towers stay the bi-encoder, so query vectors are computed once
  shared    query tower + layers; candidates are the bi-encoder's fixed document vectors (CMC mode "shared")
  separate  both towers + layers end to end; K documents per query go through the candidate tower every step

Defaults, and why: k = 64 and p = 0.5 as in the paper's mixed negatives. r = softmax(20 * cosine): 20 is the
scale all-MiniLM-L6-v2 was trained with, so r is the bi-encoder's own distribution (a softmax of raw cosines is
nearly uniform over 64 candidates and would turn the KL term into an entropy bonus). lambda_ce = lambda_kl = 1:
the KL term is the paper's regulariser towards a retriever that is already good, and SciFact has only ~730
training queries. On the SciFact hold-out (81 queries, layers regime) lambda_kl = 0.1 / 1 / 3 gave nDCG@10
0.738 / 0.742 / 0.717 (bi-encoder 0.635); on the 29 dev queries whose relevant documents never appear in
training, 0.560 / 0.610 / 0.633 (bi-encoder 0.652): the gain comes from documents seen as positives in training,
and a larger lambda_kl costs less on unseen ones. lr 1e-3 for the layers, 2e-5 for towers: the layers start as
the identity (gates 0) and must move in a few hundred steps; the towers are pre-trained and move little (the
paper's code uses 1e-5 for its towers).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from sieve.evaluation.metrics import mean_metric, mrr_at_k, ndcg_at_k
from sieve.index import Document, read_beir_corpus, read_qrels, read_queries
from sieve.models.cmc_checkpoint import CMCBundle, save_cmc, untrained_cmc
from sieve.models.cross_encoder import CrossEncoder
from sieve.models.text_encoder import TextEncoder
from sieve.training.checkpointing import (FitResult, LoopConfig, TrainLog, check_can_start, fit, git_commit, seed_all,
                                    warmup_linear_schedule)
from sieve.training.choices import OBJECTIVES, REGIMES
from sieve.training.data import Split, corpus_vectors, hold_out, load_split
from sieve.training.losses import cmc_listwise_loss, cmc_loss, listwise_kl
from sieve.training.negatives import MiningConfig, mine_candidates, mine_listwise, top_k_rows

METRICS = {"ndcg@10": ndcg_at_k, "mrr@10": mrr_at_k}


@dataclass(frozen=True)
class CMCTrainConfig:
    regime: str = "layers"
    objective: str = "gold"  # gold: one example per relevant document; listwise: one per query, graded targets
    k: int = 64  # candidates per query in training (distillation: 32, CE cost)
    hard_fraction: float = 0.5  # p: share of negatives fixed as the bi-encoder's top-ranked
    pool: int = 1024  # candidates are mined from the bi-encoder's top `pool`
    sample_temperature: float = 1.0  # sampled candidates drawn in proportion to exp(cosine / T)
    dev_k: int = 512  # dev: CMC reranks the bi-encoder's top dev_k, as serving does (retrieve_k)
    lambda_ce: float = 1.0
    lambda_kl: float = 1.0
    retriever_scale: float = 20.0  # r = softmax(scale * bi-encoder cosine)
    temperature: float = 1.0  # distillation: KL between softmax(teacher / T) and softmax(student / T)
    lr: float = 1e-3  # CMC attention layers
    tower_lr: float = 2e-5  # query / candidate towers (shared, separate)
    weight_decay: float = 0.01
    batch_size: int = 32
    epochs: int = 10
    warmup: float = 0.1
    eval_every: int = 0  # optimizer steps between dev evaluations; 0 = once per epoch
    patience: int = 3  # evaluations without improvement before stopping
    metric: str = "ndcg@10"
    seed: int = 0
    max_steps: int | None = None
    dev_fraction: float = 0.1  # held-out share of train when a dataset has no dev split (SciFact)
    log_every: int = 10

    def __post_init__(self):
        if self.regime not in REGIMES:
            raise ValueError(f"regime {self.regime!r} is not one of {REGIMES}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective {self.objective!r} is not one of {OBJECTIVES}")
        if self.metric not in METRICS:
            raise ValueError(f"metric {self.metric!r} is not one of {tuple(METRICS)}")
        if self.k < 2 or self.batch_size < 1 or self.epochs < 1 or not 0 <= self.hard_fraction <= 1:
            raise ValueError(f"need k >= 2, batch_size >= 1, epochs >= 1, 0 <= hard_fraction <= 1: {self}")

    @property
    def cmc_mode(self) -> str:
        return "separate" if self.regime == "separate" else "shared"


# ---------------------------------------------------------------- data


@dataclass
class Corpus:
    name: str
    docs: list[Document]
    vectors: np.ndarray  # (N, d) bi-encoder document vectors

    @cached_property
    def row(self) -> dict[str, int]:
        return {doc.id: r for r, doc in enumerate(self.docs)}


@dataclass
class Queries:
    corpus: Corpus
    ids: list[str]
    texts: list[str]
    vectors: np.ndarray  # (Q, d) bi-encoder query vectors
    qrels: dict[str, dict[str, int]]


def encode_queries(biencoder: TextEncoder, texts: list[str]) -> np.ndarray:
    return biencoder.encode(texts, biencoder.lengths.query_max_length)


def as_queries(corpus: Corpus, split: Split, biencoder: TextEncoder) -> Queries:
    vectors = encode_queries(biencoder, split.query_texts)
    return Queries(corpus, split.query_ids, split.query_texts, vectors, split.qrels)


def load_labelled(data_dir: Path, biencoder: TextEncoder, cfg: CMCTrainConfig,
                  cache_dir: Path | None) -> tuple[Queries, Queries]:
    """(train, dev) of one BEIR folder: its dev split when it has one (NFCorpus), else a seeded hold-out."""
    data_dir = Path(data_dir)
    train = load_split(data_dir, "train")
    if (data_dir / "qrels" / "dev.tsv").is_file():
        dev = load_split(data_dir, "dev", corpus=train.corpus)
    else:
        train, dev = hold_out(train, cfg.dev_fraction, cfg.seed)
    corpus = Corpus(data_dir.name, train.corpus, corpus_vectors(train, biencoder, cache_dir))
    return as_queries(corpus, train, biencoder), as_queries(corpus, dev, biencoder)


@dataclass
class Batch:
    query_texts: list[str]
    query_vectors: torch.Tensor  # (B, d) bi-encoder query vectors
    candidates: torch.Tensor  # (B, K, d) bi-encoder document vectors, zeros in padding
    candidate_texts: list[list[str]]  # the real candidates of each row, in column order
    mask: torch.Tensor  # (B, K) True for real candidates (padding only at the end of a row)
    be_scores: torch.Tensor  # (B, K) bi-encoder cosine, 0 in padding
    target: torch.Tensor | None = None  # (B, K) teacher scores (distillation)
    relevance: torch.Tensor | None = None  # (B, K) graded labels, 0 for non-relevant and padding (listwise)


def make_batch(picks: list[tuple[Queries, int]], rows: np.ndarray, device: torch.device,
               target: np.ndarray | None = None, relevance: np.ndarray | None = None) -> Batch:
    """rows (B, K) corpus rows, -1 for padding; each pick is (query set, query index)."""
    mask = rows >= 0
    cands = np.zeros(rows.shape + (picks[0][0].vectors.shape[1],), dtype=np.float32)  # (B, K, d)
    for b, (queries, _) in enumerate(picks):
        cands[b, mask[b]] = queries.corpus.vectors[rows[b, mask[b]]]
    qv = np.stack([queries.vectors[i] for queries, i in picks])  # (B, d)
    texts = [[q.corpus.docs[r].full_text for r in rows[b, mask[b]]] for b, (q, _) in enumerate(picks)]
    to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    return Batch([q.texts[i] for q, i in picks], to(qv), to(cands), texts, to(mask),
                 to(np.einsum("bd,bkd->bk", qv, cands)), None if target is None else to(target.astype(np.float32)),
                 None if relevance is None else to(relevance.astype(np.float32)))


def pad_rows(lists: list[np.ndarray], k: int) -> np.ndarray:
    out = np.full((len(lists), k), -1, dtype=np.int64)
    for i, rows in enumerate(lists):
        out[i, :len(rows)] = rows[:k]
    return out


# ---------------------------------------------------------------- model


class Trainee(nn.Module):
    """The trained parts of a CMC bundle for one regime, and how a batch becomes CMC scores."""

    def __init__(self, bundle: CMCBundle, regime: str):
        super().__init__()
        self.bundle = bundle
        self.cmc = bundle.model
        self.query_tower = bundle.query_tower.module if regime != "layers" else None
        self.candidate_tower = bundle.candidate_tower.module if regime == "separate" else None
        if regime == "layers":  # frozen: the query tower is an untouched copy of the bi-encoder
            bundle.query_tower.module.requires_grad_(False)

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.cmc(self.query_vectors(batch), self.candidate_vectors(batch), batch.mask)  # (B, K)

    def query_vectors(self, batch: Batch) -> torch.Tensor:
        if self.query_tower is None:
            return batch.query_vectors  # what the frozen query tower computes: it is the bi-encoder
        tower = self.bundle.query_tower
        return self.query_tower(**tower.tokenize(batch.query_texts, tower.lengths.query_max_length))

    def candidate_vectors(self, batch: Batch) -> torch.Tensor:
        if self.candidate_tower is None:
            return batch.candidates
        tower = self.bundle.candidate_tower
        flat = [t for texts in batch.candidate_texts for t in texts]
        if torch.is_grad_enabled():
            vectors = self.candidate_tower(**tower.tokenize(flat, tower.lengths.doc_max_length))
        else:  # evaluation: length-sorted mini-batches instead of B * K documents at once
            vectors = torch.from_numpy(tower.encode(flat, tower.lengths.doc_max_length)).to(batch.candidates.device)
        out = batch.candidates.new_zeros(batch.candidates.shape)
        out[batch.mask] = vectors.to(out.dtype)  # row-major order = the order of `flat`
        return out

    def param_groups(self, cfg: CMCTrainConfig) -> list[dict]:
        """Two learning rates (layers, towers); no weight decay on biases, LayerNorms and gates."""
        towers = [m for m in (self.query_tower, self.candidate_tower) if m is not None]
        groups = []
        tower_params = [p for m in towers for p in m.parameters()]
        for params, lr in ((list(self.cmc.parameters()), cfg.lr), (tower_params, cfg.tower_lr)):
            groups.append({"params": [p for p in params if p.dim() >= 2], "lr": lr, "weight_decay": cfg.weight_decay})
            groups.append({"params": [p for p in params if p.dim() < 2], "lr": lr, "weight_decay": 0.0})
        return [g for g in groups if g["params"]]


def rerank_scores(trainee: Trainee, queries: Queries, rows: np.ndarray, device: torch.device,
                  chunk: int = 64) -> np.ndarray:
    """(Q, K) CMC scores of the candidate rows of every query (-inf in padding)."""
    out = []
    with torch.no_grad():
        for start in range(0, len(queries.ids), chunk):
            picks = [(queries, i) for i in range(start, min(start + chunk, len(queries.ids)))]
            out.append(trainee(make_batch(picks, rows[start:start + chunk], device)).float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, rows.shape[1]), dtype=np.float32)


# ---------------------------------------------------------------- labelled training


class LabelledTask:
    """Mined candidates, CE + KL loss, dev = CMC reranking of the bi-encoder top-k."""

    def __init__(self, trainee: Trainee, train: list[Queries], dev: list[Queries], cfg: CMCTrainConfig,
                 device: torch.device):
        self.trainee, self.train, self.dev, self.cfg, self.device = trainee, train, dev, cfg, device
        self.examples = [(s, i, gold) for s, qs in enumerate(train) for i in range(len(qs.ids))
                         for gold in positives(qs, i)]
        if not self.examples:
            raise ValueError("no training examples: no training query has a judged-relevant document in its corpus")
        self.steps_per_epoch = math.ceil(len(self.examples) / cfg.batch_size)
        self.mining = MiningConfig(k=cfg.k, hard_fraction=cfg.hard_fraction, temperature=cfg.sample_temperature,
                                   pool=cfg.pool)
        # (Q, N) bi-encoder scores of every training query, once: one matrix product instead of one per example
        self.scores = [qs.vectors @ qs.corpus.vectors.T for qs in train]
        self._plan: tuple[int, np.ndarray, np.ndarray] | None = None

    def plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(example order, candidate rows) of an epoch: a pure function of (seed, epoch), so resumable."""
        if self._plan is None or self._plan[0] != epoch:
            rng = np.random.default_rng([self.cfg.seed, epoch])
            mined = [mine_candidates(self.scores[s][i], gold, set(positives(self.train[s], i)), self.mining, rng)
                     for s, i, gold in self.examples]
            self._plan = (epoch, rng.permutation(len(self.examples)), pad_rows(mined, self.cfg.k))
        return self._plan[1], self._plan[2]

    def batch(self, epoch: int, index: int) -> Batch:
        order, rows = self.plan(epoch)
        picks = order[index * self.cfg.batch_size:(index + 1) * self.cfg.batch_size]
        queries = [(self.train[self.examples[e][0]], self.examples[e][1]) for e in picks]
        return make_batch(queries, rows[picks], self.device)

    def loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        parts = cmc_loss(self.trainee(batch), batch.be_scores * self.cfg.retriever_scale, batch.mask,
                         self.cfg.lambda_ce, self.cfg.lambda_kl)
        return parts.total, {"ce": float(parts.ce.detach()), "kl": float(parts.kl.detach())}

    def evaluate(self) -> dict[str, float]:
        return dev_metrics(self.trainee, self.dev, self.cfg.dev_k, self.device)


class ListwiseTask(LabelledTask):
    """One example per query: candidates mined as serving sees them (the bi-encoder's top `pool`), every relevant
    document among them labelled with its grade, loss = graded listwise CE + KL to the retriever."""

    def __init__(self, trainee: Trainee, train: list[Queries], dev: list[Queries], cfg: CMCTrainConfig,
                 device: torch.device):
        super().__init__(trainee, train, dev, cfg, device)
        self.examples = [(s, i, -1) for s, qs in enumerate(train) for i in range(len(qs.ids)) if positives(qs, i)]
        self.steps_per_epoch = math.ceil(len(self.examples) / cfg.batch_size)

    def plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Queries whose relevant documents all lie outside the pool are dropped from the epoch."""
        if self._plan is None or self._plan[0] != epoch:
            rng = np.random.default_rng([self.cfg.seed, epoch])
            mined = [mine_listwise(self.scores[s][i], set(positives(self.train[s], i)), self.mining, rng)
                     for s, i, _ in self.examples]
            keep = np.array([e for e, rows in enumerate(mined) if rows is not None], dtype=np.int64)
            rows = pad_rows([rows if rows is not None else np.zeros(0, np.int64) for rows in mined], self.cfg.k)
            self._plan = (epoch, keep[rng.permutation(len(keep))], rows)
        return self._plan[1], self._plan[2]

    def batch(self, epoch: int, index: int) -> Batch:
        order, rows = self.plan(epoch)
        picks = order[index * self.cfg.batch_size:(index + 1) * self.cfg.batch_size]
        if len(picks) == 0:  # queries dropped this epoch leave the last steps empty: repeat the epoch's first
            picks = order[:self.cfg.batch_size]
        queries = [(self.train[self.examples[e][0]], self.examples[e][1]) for e in picks]
        grades = np.array([[grade_of(q, i, r) for r in rows[e]] for (q, i), e in zip(queries, picks)])
        return make_batch(queries, rows[picks], self.device, relevance=grades)

    def loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        parts = cmc_listwise_loss(self.trainee(batch), batch.be_scores * self.cfg.retriever_scale, batch.relevance,
                                  batch.mask, self.cfg.lambda_ce, self.cfg.lambda_kl)
        return parts.total, {"ce": float(parts.ce.detach()), "kl": float(parts.kl.detach())}


def grade_of(queries: Queries, i: int, row: int) -> float:
    """The judged grade of corpus row `row` for query i (0 when unjudged, not relevant, or padding)."""
    if row < 0:
        return 0.0
    return float(max(queries.qrels[queries.ids[i]].get(queries.corpus.docs[row].id, 0), 0))


def positives(queries: Queries, i: int) -> list[int]:
    rows = queries.corpus.row
    judged = queries.qrels[queries.ids[i]]
    return [rows[d] for d, grade in judged.items() if grade > 0 and d in rows]


def dev_metrics(trainee: Trainee, dev: list[Queries], k: int, device: torch.device) -> dict[str, float]:
    """CMC over the bi-encoder top-k, and the bi-encoder's own ranking ("be_" keys), per dev set ("<name>/" keys)
    and their macro average (unprefixed keys: every dataset weighs the same, whatever its number of queries)."""
    out: dict[str, float] = {}
    for queries in dev:
        _, rows = top_k_rows(queries.vectors, queries.corpus.vectors, k)  # (Q, k) in bi-encoder order
        order = np.argsort(-rerank_scores(trainee, queries, rows, device), axis=1, kind="stable")
        cmc, be = {}, {}
        for i, qid in enumerate(queries.ids):
            ids = [queries.corpus.docs[r].id for r in rows[i]]
            cmc[qid], be[qid] = [ids[j] for j in order[i]], ids
        qrels = {qid: queries.qrels[qid] for qid in queries.ids}
        for name, fn in METRICS.items():
            out[f"{queries.corpus.name}/{name}"] = mean_metric(fn, cmc, qrels, 10)
            out[f"{queries.corpus.name}/be_{name}"] = mean_metric(fn, be, qrels, 10)
    for name in METRICS:
        for prefix in ("", "be_"):
            out[prefix + name] = float(np.mean([out[f"{q.corpus.name}/{prefix}{name}"] for q in dev]))
    return out


# ---------------------------------------------------------------- distillation


class DistillTask:
    """Fixed bi-encoder top-K candidates, listwise KL to the teacher's scores; dev = KL on held-out queries."""

    def __init__(self, trainee: Trainee, train: tuple[Queries, np.ndarray, np.ndarray],
                 dev: tuple[Queries, np.ndarray, np.ndarray], cfg: CMCTrainConfig, device: torch.device):
        self.trainee, self.train, self.dev, self.cfg, self.device = trainee, train, dev, cfg, device
        self.steps_per_epoch = math.ceil(len(train[0].ids) / cfg.batch_size)

    def batch(self, epoch: int, index: int) -> Batch:
        queries, rows, teacher = self.train
        order = np.random.default_rng([self.cfg.seed, epoch]).permutation(len(queries.ids))
        picks = order[index * self.cfg.batch_size:(index + 1) * self.cfg.batch_size]
        return make_batch([(queries, i) for i in picks], rows[picks], self.device, teacher[picks])

    def loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        return listwise_kl(self.trainee(batch), batch.target, batch.mask, self.cfg.temperature), {}

    def evaluate(self) -> dict[str, float]:
        queries, rows, teacher = self.dev
        mask = torch.from_numpy(rows >= 0)
        student = torch.from_numpy(rerank_scores(self.trainee, queries, rows, self.device))
        be = torch.from_numpy(np.einsum("qd,qkd->qk", queries.vectors, queries.corpus.vectors[rows]))
        teacher_t = torch.from_numpy(teacher.astype(np.float32))
        out = {}
        for prefix, scores in (("", student), ("be_", be)):
            out[f"{prefix}kl"] = float(listwise_kl(scores, teacher_t, mask, self.cfg.temperature))
            top1 = scores.masked_fill(~mask, -math.inf).argmax(1) == teacher_t.argmax(1)
            out[f"{prefix}top1_agreement"] = float(top1.float().mean())
        return out


def load_unlabelled(queries_path: Path, corpus_path: Path, biencoder: TextEncoder, cfg: CMCTrainConfig,
                    cache_dir: Path | None, split: str | None, max_queries: int | None) -> tuple[Queries, Queries]:
    """(train, dev) queries without labels: a seeded shuffle, optionally cut to max_queries, then a hold-out."""
    docs = read_beir_corpus(corpus_path)
    texts = read_queries(queries_path)
    ids = list(texts)
    if split:  # BEIR layout: keep the queries of one split, e.g. train (only ids are read, never the judgements)
        ids = [q for q in ids if q in read_qrels(Path(queries_path).parent / "qrels" / f"{split}.tsv")]
    ids = [ids[i] for i in np.random.default_rng(cfg.seed).permutation(len(ids))][:max_queries]
    if len(ids) < 2:
        raise ValueError(f"{queries_path}: need at least 2 queries (one for dev), found {len(ids)}")
    everything = Split(docs, ids, [texts[q] for q in ids], {})
    train, dev = hold_out(everything, cfg.dev_fraction, cfg.seed)
    corpus = Corpus(Path(corpus_path).parent.name, docs, corpus_vectors(everything, biencoder, cache_dir))
    return as_queries(corpus, train, biencoder), as_queries(corpus, dev, biencoder)


def read_teacher_cache(path: Path, teacher_hash: str) -> dict[tuple[str, tuple[str, ...]], list[float]]:
    """{(query text, candidate ids): scores} from earlier runs with the same teacher; a torn last line is skipped."""
    found = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("teacher") == teacher_hash:
                found[(rec["query"], tuple(rec["doc_ids"]))] = rec["scores"]
    return found


def teacher_scores(teacher: CrossEncoder, queries: Queries, rows: np.ndarray, cache_path: Path) -> np.ndarray:
    """(Q, K) cross-encoder scores of each query's candidates (0 in padding). Every scored query is appended to
    the cache at once, so an interrupted run, or a rerun, scores only what is missing (~45 pairs/s on a CPU)."""
    cached = read_teacher_cache(cache_path, teacher.weights_hash)
    out = np.zeros(rows.shape, dtype=np.float32)
    todo = []
    for i, text in enumerate(queries.texts):
        ids = tuple(queries.corpus.docs[r].id for r in rows[i] if r >= 0)
        if (text, ids) in cached:
            out[i, :len(ids)] = cached[(text, ids)]
        else:
            todo.append(i)
    with open(cache_path, "a", encoding="utf-8") as f:
        for i in tqdm(todo, desc="teacher scores", unit="query", disable=not todo):
            docs = [queries.corpus.docs[r] for r in rows[i] if r >= 0]
            scores = teacher.score(queries.texts[i], [d.full_text for d in docs]).numpy()
            out[i, :len(docs)] = scores
            f.write(json.dumps({"teacher": teacher.weights_hash, "query_id": queries.ids[i], "query": queries.texts[i],
                                "doc_ids": [d.id for d in docs], "scores": scores.tolist()}) + "\n")
            f.flush()
    return out


# ---------------------------------------------------------------- runs


@dataclass
class TrainResult:
    out_dir: Path
    bundle: CMCBundle  # the best weights (float32 in memory; the checkpoint on disk is float16)
    metrics: dict[str, float]  # dev metrics of the best evaluation
    best_step: int
    steps: int
    wall_s: float  # this invocation only (a resumed run counts from its restart)


def train_cmc(cfg: CMCTrainConfig, data_dirs: list[Path], biencoder: TextEncoder, out_dir: Path, *,
              cache_dir: Path | None = None, resume: bool = False, command: str = "") -> TrainResult:
    """Train on the train split of each BEIR folder, select on dev, write the best checkpoint to out_dir."""
    started, out_dir = time.perf_counter(), Path(out_dir)
    check_can_start(out_dir / "state", resume)
    seed_all(cfg.seed)
    sources = [load_labelled(Path(d), biencoder, cfg, cache_dir) for d in data_dirs]
    trainee = Trainee(untrained_cmc(biencoder, cfg.cmc_mode, seed=cfg.seed), cfg.regime)
    task_type = ListwiseTask if cfg.objective == "listwise" else LabelledTask
    task = task_type(trainee, [t for t, _ in sources], [d for _, d in sources], cfg, biencoder.device)
    data = [describe_source(Path(d), train, dev, cfg) for d, (train, dev) in zip(data_dirs, sources)]
    unit = "query" if cfg.objective == "listwise" else "(query, relevant document)"
    data.append(f"{len(task.examples)} {unit} training examples per epoch, candidates re-mined each epoch")
    fingerprint = {"kind": "cmc", "config": asdict(cfg), "data": [str(Path(d).resolve()) for d in data_dirs],
                   "biencoder": biencoder.weights_hash}
    result = run_fit(trainee, task, cfg, out_dir, resume, fingerprint, cfg.metric, maximize=True)
    about = {"trainer": "sieve train cmc", "data": data, "command": command}
    return export(trainee, result, cfg, out_dir, about, started)


def describe_source(data_dir: Path, train: Queries, dev: Queries, cfg: CMCTrainConfig) -> str:
    has_dev = (data_dir / "qrels" / "dev.tsv").is_file()
    dev_from = "dev split" if has_dev else f"{cfg.dev_fraction:.0%} held out of train"
    return f"{data_dir.resolve()}: train {len(train.ids)} queries, dev {len(dev.ids)} queries ({dev_from})"


def train_distill(cfg: CMCTrainConfig, queries_path: Path, corpus_path: Path, teacher: CrossEncoder,
                  biencoder: TextEncoder, out_dir: Path, *, split: str | None = None, max_queries: int | None = None,
                  cache_dir: Path | None = None, resume: bool = False, command: str = "") -> TrainResult:
    """Distil the cross-encoder's scores over the bi-encoder top-K into CMC; no relevance labels are read."""
    started, out_dir = time.perf_counter(), Path(out_dir)
    check_can_start(out_dir / "state", resume)
    seed_all(cfg.seed)
    train, dev = load_unlabelled(Path(queries_path), Path(corpus_path), biencoder, cfg, cache_dir, split, max_queries)
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    for queries in (train, dev):
        _, rows = top_k_rows(queries.vectors, queries.corpus.vectors, cfg.k)
        parts.append((queries, rows, teacher_scores(teacher, queries, rows, out_dir / "teacher_scores.jsonl")))
    trainee = Trainee(untrained_cmc(biencoder, cfg.cmc_mode, seed=cfg.seed), cfg.regime)
    task = DistillTask(trainee, parts[0], parts[1], cfg, biencoder.device)
    fingerprint = {"kind": "cmc-distill", "config": asdict(cfg), "queries": str(Path(queries_path).resolve()),
                   "corpus": str(Path(corpus_path).resolve()), "split": split, "max_queries": max_queries,
                   "teacher": teacher.weights_hash, "biencoder": biencoder.weights_hash}
    data = [f"queries {Path(queries_path).resolve()}{f' (split {split})' if split else ''}: train {len(train.ids)}, "
            f"dev {len(dev.ids)} held out",
            f"corpus {Path(corpus_path).resolve()} ({len(train.corpus.docs)} documents)",
            f"teacher: cross-encoder {teacher.name} (sha256 {teacher.weights_hash[:12]}), bi-encoder top-{cfg.k}"]
    result = run_fit(trainee, task, cfg, out_dir, resume, fingerprint, "kl", maximize=False)
    about = {"trainer": "sieve train cmc-distill", "data": data, "command": command}
    return export(trainee, result, cfg, out_dir, about, started)


def run_fit(trainee: Trainee, task, cfg: CMCTrainConfig, out_dir: Path, resume: bool, fingerprint: dict,
            metric: str, maximize: bool) -> FitResult:
    total = task.steps_per_epoch * cfg.epochs
    total = min(total, cfg.max_steps) if cfg.max_steps else total
    optimizer = torch.optim.AdamW(trainee.param_groups(cfg))
    scheduler = warmup_linear_schedule(optimizer, total, cfg.warmup)
    loop = LoopConfig(total, cfg.eval_every or task.steps_per_epoch, cfg.patience, metric, maximize,
                      grad_clip=1.0, log_every=cfg.log_every)
    return fit(trainee, optimizer, scheduler, task, loop, out_dir / "state", TrainLog(out_dir / "train_log.jsonl"),
               resume=resume, fingerprint=fingerprint)


def export(trainee: Trainee, result: FitResult, cfg: CMCTrainConfig, out_dir: Path, about: dict,
           started: float) -> TrainResult:
    """Load the best weights, save them as a float16 CMC checkpoint with a model card."""
    if result.best is not None:
        trainee.load_state_dict(result.best)
    trainee.eval()
    bundle = trainee.bundle
    bundle.name = out_dir.name
    wall = time.perf_counter() - started
    meta = {**about, "regime": cfg.regime, "config": asdict(cfg), "dev": result.metrics,
            "best_step": result.state.best_step, "steps": result.state.step,
            "early_stopped": result.state.bad_evals >= cfg.patience,
            "git_commit": git_commit(), "wall_s": round(wall, 1), "train_s": round(result.state.train_s, 1)}
    # layers regime: the towers are the bi-encoder, untouched; the checkpoint stores the layers and shares it
    save_cmc(bundle, out_dir, metadata=meta, towers_from_base=cfg.regime == "layers")
    (out_dir / "model_card.md").write_text(model_card(bundle.name, meta), encoding="utf-8")
    return TrainResult(out_dir, bundle, result.metrics, result.state.best_step, result.state.step, wall)


REGIME_TEXT = {
    "layers": "attention layers only; query tower = the bi-encoder, candidates = the bi-encoder's document vectors",
    "shared": "query tower + attention layers; candidates = the bi-encoder's document vectors (CMC mode shared)",
    "separate": "query tower, candidate tower and attention layers end to end (CMC mode separate: the index needs "
                "a 'cmc' store built with this checkpoint)",
}


def model_card(name: str, meta: dict) -> str:
    dev = meta["dev"]
    names = [k for k in dev if not k.rpartition("/")[2].startswith("be_")]  # "ndcg@10", "scifact/ndcg@10", ...
    be_key = lambda k: "{0}{1}be_{2}".format(*k.rpartition("/"))  # noqa: E731  "scifact/be_ndcg@10", "be_ndcg@10"
    cells = lambda keys: " | ".join(f"{dev.get(k, float('nan')):.4f}" for k in keys)  # noqa: E731
    rows = [f"| bi-encoder | {cells([be_key(k) for k in names])} |",
            f"| CMC (step {meta['best_step']}) | {cells(names)} |"]
    params = [f"| {k} | {v} |" for k, v in meta["config"].items()]
    return "\n".join([
        f"# CMC checkpoint `{name}`", "",
        "CMC reranker (Song et al. 2024, \"Comparing Multiple Candidates\") trained by `"
        f"{meta['trainer']}`. Serve it with `SIEVE_CMC_PATH=<this directory>`, or load it with "
        "`models.cmc_checkpoint.load_cmc`.", "",
        "## Data", "", *[f"- {line}" for line in meta["data"]], "",
        "## Command", "", "```", meta["command"] or "(called from Python)", "```", "",
        f"Code: git commit `{meta['git_commit']}`", "",
        "## Dev results", "", f"| model | {' | '.join(names)} |", "|---" * (len(names) + 1) + "|", *rows, "",
        f"Regime `{meta['regime']}`: {REGIME_TEXT[meta['regime']]}.", "",
        "## Training", "",
        f"- steps: {meta['steps']} (best at step {meta['best_step']}); early stopped: {meta['early_stopped']}",
        f"- time in the training loop (all invocations): {meta['train_s']} s; wall time of the last invocation, "
        f"data and model loading included: {meta['wall_s']} s", "",
        "## Hyper-parameters", "", "| field | value |", "|---|---|", *params, "",
    ])
