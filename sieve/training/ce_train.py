"""Cross-encoder fine-tuning: LCE groups (Gao et al. 2021) or a point-wise BCE baseline, both drawn from the
bi-encoder's top-k; dev nDCG@10 of CE(BE top-k_dev) picks the checkpoint; resumable; fp16 Hugging Face output.

Seeding, the warm-up schedule and the run log come from training/checkpointing.py. Its `fit` loop is not used: this trainer
needs a wall-clock budget (a CPU epoch of SciFact takes longer than a session has), gradient accumulation and
pairs/s accounting, so the loop and its state (a flat step/epoch/batch record) are kept here.
"""
from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from sieve.evaluation.metrics import mean_metric, ndcg_at_k
from sieve.models.ce_heads import load_classifier, load_head, new_head, read_head, record_lengths
from sieve.models.cross_encoder import CrossEncoder, PairLengths
from sieve.models.weights import default_model_path, offline
from sieve.training.checkpointing import TrainLog, seed_all, warmup_linear_schedule
from sieve.training.data import Split, corpus_vectors, hold_out, load_split
from sieve.training.negatives import top_k_rows


@dataclass(frozen=True)
class CETrainConfig:
    data_dirs: tuple[Path, ...]
    out_dir: Path
    loss: str = "lce"  # "lce": softmax over each group; "bce": every pair labelled 1/0 on its own
    negatives: int = 7  # hard negatives per group (group size 1 + negatives)
    neg_pool: int = 100  # negatives are drawn from the bi-encoder's top neg_pool, judged-relevant docs removed
    batch_groups: int = 4  # groups per forward pass: 4 x 8 = 32 pairs
    grad_accum: int = 1  # forward passes per optimizer step
    lr: float = 2e-5
    weight_decay: float = 0.01
    warmup_fraction: float = 0.1
    epochs: int = 1
    max_steps: int | None = None  # optimizer steps; caps the epochs
    time_budget_min: float | None = None  # this invocation's wall time; training stops and saves when spent
    # Pairs cut to 256 tokens while training: a step's cost grows with length (attention quadratically) and the
    # shared 2-core CPU trains only ~2 pairs/s at 256; 256 holds the query and most of a SciFact/NFCorpus abstract.
    # Recorded in the checkpoint's sieve_head.json: serving uses it unless SIEVE_CE_MAX_LENGTH says otherwise.
    max_length: int = 256
    query_max_length: int = 64
    dev_queries: int = 100  # per dataset, a seeded sample
    k_dev: int = 20  # CE reranks the bi-encoder's top k_dev on dev (20 x 81 SciFact queries: ~2 min on CPU)
    eval_every: int = 0  # optimizer steps between dev passes; 0 = at each epoch end and when training stops
    log_every: int = 10
    seed: int = 0
    resume: bool = False
    init: Path | None = None  # a sequence-classification checkpoint; None = packaged MiniLM + a fresh head
    command: str = ""  # recorded in the model card
    head: str = "cls"  # models/ce_heads.py HEADS: "cls", "cls+late", "emb", "cls+cos", "gated", "gated+late"
    late_dim: int | None = 128  # cls+late, gated+late: token projection size; None = unprojected hidden vectors
    head_lr: float = 1e-3  # a head's own new parameters (models/ce_heads.py head_parameters(); gated: its gates)


@dataclass
class Dataset:
    """One BEIR folder made ready: train/dev splits and the bi-encoder's rankings for both."""

    name: str
    train: Split
    dev: Split
    pools: np.ndarray  # (Q_train, neg_pool) corpus rows, best first
    dev_rows: np.ndarray  # (Q_dev, k_dev) corpus rows, best first


@dataclass
class Progress:
    """Everything besides weights/optimizer that a resumed run needs to continue where the last one stopped."""

    step: int = 0  # optimizer steps done
    epoch: int = 0
    batch: int = 0  # forward passes done within the epoch
    pairs: int = 0
    train_s: float = 0.0  # time in forward/backward, for pairs/s
    wall_s: float = 0.0  # all invocations together
    best: float = -math.inf
    best_step: int = -1
    last_eval_step: int = -1
    log_offset: int = 0  # train_log.jsonl size at the save: a resumed run drops lines logged after it
    history: list = field(default_factory=list)  # dev results, one dict per pass


def lce_loss(logits: torch.Tensor) -> torch.Tensor:
    """(G, 1+n) logits, positive in column 0 -> mean cross-entropy of the positive against its own group."""
    assert logits.dim() == 2 and logits.shape[1] >= 2, logits.shape
    return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device))


def bce_loss(logits: torch.Tensor) -> torch.Tensor:
    """(G, 1+n) logits, positive in column 0 -> mean binary cross-entropy over all pairs (1 / 0 labels)."""
    assert logits.dim() == 2, logits.shape
    labels = torch.zeros_like(logits)
    labels[:, 0] = 1.0
    return F.binary_cross_entropy_with_logits(logits, labels)


LOSSES = {"lce": lce_loss, "bce": bce_loss}


def build_groups(split: Split, pools: np.ndarray, n_neg: int, rng: np.random.Generator) -> list[tuple[int, np.ndarray]]:
    """One group per query: (query index, (1+n,) corpus rows) with a random judged positive first, then n negatives
    drawn uniformly from the bi-encoder's top-k after every judged-relevant document is removed (those are never
    negatives, whatever their rank; a pool smaller than n is drawn with replacement, an empty one skips the query)."""
    groups = []
    for i in range(len(split.query_ids)):
        positives = split.positives(i)
        if not positives:
            continue
        pool = pools[i][~np.isin(pools[i], positives)]
        if len(pool) == 0:
            continue
        negatives = rng.choice(pool, size=n_neg, replace=len(pool) < n_neg)
        groups.append((i, np.concatenate([[rng.choice(positives)], negatives]).astype(np.int64)))
    return groups


def epoch_batches(datasets: list[Dataset], cfg: CETrainConfig, epoch: int) -> list[list[tuple[str, list[str]]]]:
    """Groups of every dataset mixed and cut into forward passes; a function of (seed, epoch) alone, so a resumed
    run rebuilds exactly the batches it was part-way through."""
    rng = np.random.default_rng([cfg.seed, epoch])
    items = []
    for ds in datasets:
        for i, rows in build_groups(ds.train, ds.pools, cfg.negatives, rng):
            items.append((ds.train.query_texts[i], [ds.train.corpus[r].full_text for r in rows]))
    order = rng.permutation(len(items))
    return [[items[j] for j in order[s:s + cfg.batch_groups]] for s in range(0, len(order), cfg.batch_groups)]


def query_vectors(encoder, texts: list[str], chunk: int = 256) -> np.ndarray:
    return np.concatenate([encoder.encode_queries(texts[s:s + chunk]).float().cpu().numpy()
                           for s in range(0, len(texts), chunk)])


def load_dataset(data_dir: Path, encoder, cfg: CETrainConfig, cache_dir: Path | None) -> Dataset:
    """Dev is the dataset's own dev split when it has one (NFCorpus), else 10% of train held out (SciFact).
    The test split is never read."""
    train = load_split(data_dir, "train")
    try:
        dev = load_split(data_dir, "dev", corpus=train.corpus)
    except FileNotFoundError:
        train, dev = hold_out(train, 0.1, cfg.seed)
    picks = np.random.default_rng(cfg.seed).permutation(len(dev.query_ids))[:cfg.dev_queries]
    dev = dev.subset(sorted(picks.tolist()))
    docs = corpus_vectors(train, encoder, cache_dir)
    _, pools = top_k_rows(query_vectors(encoder, train.query_texts), docs, cfg.neg_pool)
    _, dev_rows = top_k_rows(query_vectors(encoder, dev.query_texts), docs, cfg.k_dev)
    return Dataset(Path(data_dir).name, train, dev, pools, dev_rows)


def init_cross_encoder(cfg: CETrainConfig, device: torch.device) -> CrossEncoder:
    """From --init, else the packaged MiniLM with a new head (seeded by the caller's seed_all). An --init checkpoint
    that holds the same head continues with that head's trained weights (gates, scale, projection) too."""
    offline()
    path = str(cfg.init or default_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if cfg.init is not None and read_head(cfg.init)["head"] == cfg.head:
        scorer = load_head(cfg.init, tokenizer)
    else:
        scorer = new_head(cfg.head, load_classifier(path), tokenizer, head_options(cfg))
    return CrossEncoder(scorer, tokenizer, name=Path(cfg.out_dir).name, weights_hash="unsaved",
                        lengths=PairLengths(cfg.query_max_length, cfg.max_length), device=device)


def head_options(cfg: CETrainConfig) -> dict:
    """The variant's own fields for models/ce_heads.py new_head()."""
    return {"dim": cfg.late_dim} if cfg.head.endswith("+late") else {}


def group_logits(ce: CrossEncoder, batch: list[tuple[str, list[str]]]) -> torch.Tensor:
    queries = [q for q, docs in batch for _ in docs]
    docs = [d for _, group in batch for d in group]
    return ce.scorer(**ce.tokenize_pairs(queries, docs)).view(len(batch), -1)  # (G, 1+n)


def group_parts(ce: CrossEncoder, batch: list[tuple[str, list[str]]]) -> list[torch.Tensor]:
    """(G, 1+n) logits of each separately trained score: the head's parts() when it has them (cls+late: s_cls and
    s_late, one loss each, losses added), else its single score."""
    if not hasattr(ce.scorer, "parts"):
        return [group_logits(ce, batch)]
    queries = [q for q, docs in batch for _ in docs]
    docs = [d for _, group in batch for d in group]
    return [part.view(len(batch), -1) for part in ce.scorer.parts(**ce.tokenize_pairs(queries, docs))]


def dev_rankings(ce: CrossEncoder | None, ds: Dataset) -> dict[str, list[str]]:
    """query id -> doc ids: the bi-encoder's top k_dev order (ce None) or that list reranked by the CE."""
    out = {}
    for qid, text, rows in zip(ds.dev.query_ids, ds.dev.query_texts, ds.dev_rows):
        ids = [ds.dev.corpus[r].id for r in rows]
        if ce is not None:
            scores = ce.score(text, [ds.dev.corpus[r].full_text for r in rows])
            ids = [ids[j] for j in torch.argsort(scores, descending=True, stable=True).tolist()]
        out[qid] = ids
    return out


def dev_ndcg(ce: CrossEncoder | None, datasets: list[Dataset]) -> dict[str, float]:
    """nDCG@10 per dataset and their mean (the model-selection number)."""
    scores = {}
    for ds in datasets:
        qrels = {q: ds.dev.qrels[q] for q in ds.dev.query_ids}
        scores[ds.name] = mean_metric(ndcg_at_k, dev_rankings(ce, ds), qrels, 10)
    scores["mean"] = sum(scores.values()) / len(datasets)
    return scores


def make_optimizer(model: torch.nn.Module, cfg: CETrainConfig, total_steps: int):
    """AdamW without decay on biases and LayerNorm; linear warm-up over warmup_fraction, then linear decay to 0."""
    own = list(model.head_parameters()) if hasattr(model, "head_parameters") else []
    decay, plain = [], []
    for p in model.parameters():
        if not any(p is q for q in own):
            (plain if p.dim() < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": plain, "weight_decay": 0.0}]
    if own:  # a head's new parameters (gated: gates, scale) start far from where they end; lr moves them in time
        groups.append({"params": own, "weight_decay": 0.0, "lr": cfg.head_lr})
    # fused: one kernel over all tensors, ~3x faster than the per-tensor default on CPU (0.2 s vs 0.7 s a step)
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, fused=True)
    return optimizer, warmup_linear_schedule(optimizer, total_steps, cfg.warmup_fraction)


def save_state(state_dir: Path, model: torch.nn.Module, optimizer, scheduler, progress: Progress) -> None:
    """Weights as safetensors, the rest through torch.save; written beside and swapped in, so a crash mid-save
    leaves the previous state whole."""
    tmp, old = state_dir.with_name("state.tmp"), state_dir.with_name("state.old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
    # Only torch's generator is saved: dropout draws from it; batches come from (seed, epoch)-seeded generators.
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "progress": asdict(progress), "torch_rng": torch.get_rng_state()}, tmp / "trainer.pt")
    if state_dir.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(state_dir, old)
    os.replace(tmp, state_dir)
    shutil.rmtree(old, ignore_errors=True)


def load_state(state_dir: Path, model: torch.nn.Module, optimizer, scheduler) -> Progress:
    if not (state_dir / "trainer.pt").is_file():
        raise FileNotFoundError(f"--resume: no training state in {state_dir}")
    model.load_state_dict(load_file(str(state_dir / "model.safetensors")))
    saved = torch.load(state_dir / "trainer.pt", weights_only=True)
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    torch.set_rng_state(saved["torch_rng"])
    return Progress(**saved["progress"])


def save_fp16(ce: CrossEncoder, out_dir: Path) -> None:
    """A Hugging Face directory (fp16 safetensors + tokenizer) that CrossEncoder.from_pretrained loads; written to a
    side folder first, then moved file by file, so a reader never sees half a weight file."""
    model = ce.scorer.classifier
    half = {k: v.detach().half().contiguous() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    tmp = out_dir / ".best.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, state_dict=half, safe_serialization=True)
    ce.tokenizer.save_pretrained(tmp)
    if hasattr(ce.scorer, "save_head"):  # a variant's sieve_head.json and head.safetensors (models/ce_heads.py)
        ce.scorer.save_head(tmp)
    record_lengths(tmp, ce.lengths)
    for file in tmp.iterdir():
        os.replace(file, out_dir / file.name)
    tmp.rmdir()


class CETrainer:
    """Owns the model, optimizer and progress; fit() runs optimizer steps until the plan, cap or budget ends."""

    def __init__(self, cfg: CETrainConfig, datasets: list[Dataset], device: torch.device = torch.device("cpu")):
        self.cfg, self.datasets = cfg, datasets
        seed_all(cfg.seed)  # before the head is created, so a fresh head is the same on every run
        self.ce = self.new_model(device)
        n_groups = sum(sum(1 for i in range(len(ds.train.query_ids)) if ds.train.positives(i)) for ds in datasets)
        self.steps_per_epoch = math.ceil(math.ceil(n_groups / cfg.batch_groups) / cfg.grad_accum)
        self.total_steps = min(self.steps_per_epoch * cfg.epochs, cfg.max_steps or math.inf)
        self.optimizer, self.scheduler = make_optimizer(self.ce.scorer, cfg, self.total_steps)
        self.loss_fn = LOSSES[cfg.loss]
        self.progress = Progress()
        self.train_log = TrainLog(Path(cfg.out_dir) / "train_log.jsonl")
        self._batches: tuple[int, list] = (-1, [])

    def new_model(self, device: torch.device):
        """The model trained here (a subclass may train another one through the same loop: training/mix_train.py)."""
        return init_cross_encoder(self.cfg, device)

    def save_best(self) -> None:
        save_fp16(self.ce, Path(self.cfg.out_dir))

    @property
    def state_dir(self) -> Path:
        return Path(self.cfg.out_dir) / "state"

    def resume(self) -> None:
        self.progress = load_state(self.state_dir, self.ce.scorer, self.optimizer, self.scheduler)
        self.train_log.truncate(self.progress.log_offset)  # steps after the save are trained (and logged) again

    def epoch_data(self) -> list:
        if self._batches[0] != self.progress.epoch:
            self._batches = (self.progress.epoch, epoch_batches(self.datasets, self.cfg, self.progress.epoch))
        return self._batches[1]

    def batch_loss(self, batch: list[tuple[str, list[str]]]) -> torch.Tensor:
        return sum(self.loss_fn(logits) for logits in group_parts(self.ce, batch))

    def train_step(self, passes: list[list]) -> float:
        """One optimizer step over `passes` forward passes (gradient accumulation); returns the mean loss."""
        self.ce.scorer.train()
        started, total = time.monotonic(), 0.0
        for batch in passes:
            loss = self.batch_loss(batch) / len(passes)
            loss.backward()
            total += loss.item()
            self.progress.pairs += sum(len(docs) for _, docs in batch)
        torch.nn.utils.clip_grad_norm_(self.ce.scorer.parameters(), 1.0)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.progress.train_s += time.monotonic() - started
        self.progress.step += 1
        return total

    def next_step(self) -> tuple[float, bool]:
        """Runs the next step of the plan; True when it finished an epoch."""
        p, batches = self.progress, self.epoch_data()
        passes = batches[p.batch:p.batch + self.cfg.grad_accum]
        loss = self.train_step(passes)
        p.batch += len(passes)
        if p.batch >= len(batches):
            p.epoch, p.batch = p.epoch + 1, 0
            return loss, True
        return loss, False

    def evaluate(self) -> dict:
        """Dev pass; a new best is written to out_dir at once as the fp16 checkpoint."""
        p = self.progress
        self.ce.scorer.eval()
        record = {"event": "eval", "step": p.step, "epoch": p.epoch, "dev_ndcg@10": dev_ndcg(self.ce, self.datasets)}
        p.history.append(record)
        p.last_eval_step = p.step
        if record["dev_ndcg@10"]["mean"] > p.best:
            p.best, p.best_step = record["dev_ndcg@10"]["mean"], p.step
            self.save_best()
        self.log(record)
        return record

    def log(self, record: dict) -> None:
        self.train_log.write(record)

    def fit(self, progress_bar: bool = True) -> str:
        """Trains to the end of the plan or the time budget; always ends evaluated, saved and resumable."""
        cfg, p = self.cfg, self.progress
        started, wall_before = time.monotonic(), p.wall_s
        deadline = started + 60 * cfg.time_budget_min if cfg.time_budget_min else math.inf
        stop, losses = "plan done", []
        with tqdm(total=self.total_steps, initial=p.step, unit="step", disable=not progress_bar) as bar:
            while p.step < self.total_steps:
                if time.monotonic() >= deadline:
                    stop = "time budget"
                    break
                loss, epoch_end = self.next_step()
                losses.append(loss)
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}", pairs_s=f"{p.pairs / max(p.train_s, 1e-9):.1f}")
                if p.step % cfg.log_every == 0:
                    self.log({"event": "train", "step": p.step, "epoch": p.epoch, "loss": float(np.mean(losses)),
                              "lr": self.scheduler.get_last_lr()[0], "pairs_per_s": p.pairs / p.train_s})
                    losses = []
                if epoch_end or (cfg.eval_every and p.step % cfg.eval_every == 0):
                    self.evaluate()
                    if p.step < self.total_steps:  # the last state is saved below in any case
                        self.checkpoint(started, wall_before)
        if p.last_eval_step != p.step:
            self.evaluate()
        self.checkpoint(started, wall_before)
        return stop

    def checkpoint(self, started: float, wall_before: float) -> None:
        self.progress.wall_s = wall_before + time.monotonic() - started
        self.progress.log_offset = self.train_log.offset()
        save_state(self.state_dir, self.ce.scorer, self.optimizer, self.scheduler, self.progress)


def train_cross_encoder(cfg: CETrainConfig, biencoder, cache_dir: Path | None = None,
                        device: torch.device = torch.device("cpu"), progress_bar: bool = True,
                        trainer_cls: type = CETrainer) -> dict:
    """Prepare data, train (or resume), write the best checkpoint and its model card; returns a summary.
    trainer_cls: CETrainer or a subclass training another reranker on the same groups (MixTrainer)."""
    out = Path(cfg.out_dir)
    if not cfg.resume and (out / "state").exists():
        raise ValueError(f"{out} already holds a training run; pass --resume to continue it or pick another --out")
    out.mkdir(parents=True, exist_ok=True)
    datasets = [load_dataset(Path(d), biencoder, cfg, cache_dir) for d in cfg.data_dirs]
    baseline = dev_ndcg(None, datasets)
    trainer = trainer_cls(cfg, datasets, device)
    if cfg.resume:
        trainer.resume()
    trainer.log({"event": "start", "step": trainer.progress.step, "be_ndcg@10": baseline, "command": cfg.command})
    stop = trainer.fit(progress_bar)
    p = trainer.progress
    data = [{"name": ds.name, "path": str(path), "train_queries": len(ds.train.query_ids),
             "dev_queries": len(ds.dev.query_ids), "documents": len(ds.train.corpus)}
            for ds, path in zip(datasets, cfg.data_dirs)]
    return {"out": str(out), "stop": stop, "steps": p.step, "pairs": p.pairs,
            "pairs_per_s": p.pairs / max(p.train_s, 1e-9), "wall_s": p.wall_s, "best_step": p.best_step,
            "dev_ndcg@10": next(r["dev_ndcg@10"] for r in p.history if r["step"] == p.best_step),
            "be_ndcg@10": baseline, "data": data}
