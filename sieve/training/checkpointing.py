"""Resumable training, shared by the trainers: seeds, the warm-up schedule, training state on disk, the run log,
and `fit`, the loop that evaluates on dev, keeps the best weights, stops early and saves state at each evaluation.

State layout (`<out>/state/`): one folder per saved step, `step-00000120/` holding
  weights.safetensors  the trained module's current weights
  best.safetensors     the weights of the best dev evaluation so far
  trainer.pt           optimizer, scheduler, RNG states and the TrainState fields (tensors and plain values only)
and LATEST, a one-line pointer to the complete folder. A folder is written under a temporary name and renamed,
then LATEST is replaced atomically, so a crash at any moment leaves the previous state readable. trainer.pt is
read with torch.load(weights_only=True): nothing is ever unpickled beyond tensors and plain containers.
"""
from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

LATEST = "LATEST"


def seed_all(seed: int) -> None:
    """Python, NumPy and torch (CPU and every CUDA device) from one seed."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def warmup_linear_schedule(optimizer: torch.optim.Optimizer, total_steps: int,
                           warmup_fraction: float = 0.1) -> LambdaLR:
    """Linear warm-up over the first `warmup_fraction` of the steps, then linear decay towards zero.

    The factor for step s (0-based) is (s + 1) / warmup during warm-up, so the very first update already moves
    the weights, and (total - s) / (total - warmup) after it, which stays above zero up to the last step.
    """
    assert total_steps > 0 and 0.0 <= warmup_fraction < 1.0, (total_steps, warmup_fraction)
    warmup = int(round(warmup_fraction * total_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return LambdaLR(optimizer, factor)


@dataclass
class TrainState:
    """Where a run stands; saved with every evaluation."""

    step: int = 0  # optimizer updates done
    best_metric: float | None = None
    best_step: int = -1
    bad_evals: int = 0  # evaluations since the last improvement (early stopping)
    stopped: bool = False  # early-stopped or finished: a resumed run has nothing left to do
    log_offset: int = 0  # bytes of the run log at save time; a resumed run cuts the log back to here
    train_s: float = 0.0  # seconds spent in fit() over all invocations, up to this save
    fingerprint: dict = field(default_factory=dict)  # the settings that must not change across a resume


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy_state = np.random.get_state(legacy=False)
    numpy_state["state"] = {"key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
                            "pos": int(numpy_state["state"]["pos"])}
    state["numpy"] = numpy_state
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    numpy_state = dict(state["numpy"])
    numpy_state["state"] = {"key": state["numpy"]["state"]["key"].numpy().astype(np.uint32),
                            "pos": state["numpy"]["state"]["pos"]}
    np.random.set_state(numpy_state)
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def tensors_to_save(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").clone().contiguous() for k, v in weights.items()}


def save_state(state_dir: str | Path, state: TrainState, weights: dict[str, torch.Tensor],
               best: dict[str, torch.Tensor] | None, optimizer: torch.optim.Optimizer, scheduler: LambdaLR) -> Path:
    """Write a complete step folder, then switch LATEST to it and remove the older folders."""
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    final = state_dir / f"step-{state.step:08d}"
    tmp = state_dir / f".tmp-{final.name}-{secrets.token_hex(4)}"
    tmp.mkdir()
    save_file(tensors_to_save(weights), str(tmp / "weights.safetensors"))
    if best is not None:
        save_file(tensors_to_save(best), str(tmp / "best.safetensors"))
    trainer = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state(),
               "state": asdict(state)}
    torch.save(trainer, tmp / "trainer.pt")
    shutil.rmtree(final, ignore_errors=True)  # a step saved twice (re-run after a crash): the new one wins
    os.replace(tmp, final)
    write_atomic(state_dir / LATEST, final.name + "\n")
    for old in state_dir.iterdir():
        if old.is_dir() and old.name != final.name:
            shutil.rmtree(old, ignore_errors=True)
    return final


@dataclass
class SavedState:
    state: TrainState
    weights: dict[str, torch.Tensor]
    best: dict[str, torch.Tensor] | None
    optimizer: dict
    scheduler: dict
    rng: dict


def load_state(state_dir: str | Path) -> SavedState | None:
    """The state LATEST points to, or None when nothing was saved yet."""
    pointer = Path(state_dir) / LATEST
    if not pointer.is_file():
        return None
    folder = Path(state_dir) / pointer.read_text().strip()
    trainer = torch.load(folder / "trainer.pt", map_location="cpu", weights_only=True)
    best_file = folder / "best.safetensors"
    best = load_file(str(best_file)) if best_file.is_file() else None
    return SavedState(TrainState(**trainer["state"]), load_file(str(folder / "weights.safetensors")), best,
                      trainer["optimizer"], trainer["scheduler"], trainer["rng"])


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class TrainLog:
    """train_log.jsonl: one JSON object per line, flushed at once so a crash loses nothing already logged."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def offset(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def truncate(self, offset: int) -> None:
        """Drop what a crashed run logged after its last saved state: the resumed run logs those steps again."""
        if self.path.exists():
            with open(self.path, "r+b") as f:
                f.truncate(offset)

    def records(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]


def git_commit(repo: str | Path | None = None) -> str:
    """`git rev-parse HEAD` of the code that trained a model (for its model card), marked when the packages had
    uncommitted changes at the time (then the commit alone does not reproduce the run); 'unknown' outside git."""
    repo = Path(repo) if repo else Path(__file__).resolve().parents[1]
    head, status = git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain", "--", *CODE_DIRS)
    if head is None:
        return "unknown"
    return f"{head} (uncommitted changes)" if status else head


CODE_DIRS = ("models", "training", "index", "evaluation", "pipeline", "service")


def git(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


class Task(Protocol):
    """What `fit` needs from a trainer: reproducible batches, a loss, and a dev evaluation."""

    steps_per_epoch: int

    def batch(self, epoch: int, index: int) -> Any:
        """Batch `index` of `epoch`, the same on every call (a resumed run rebuilds the epoch it stopped in)."""

    def loss(self, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """(loss to back-propagate, numbers to log)."""

    def evaluate(self) -> dict[str, float]:
        """Dev metrics, called with the module in eval mode and gradients off."""


@dataclass(frozen=True)
class LoopConfig:
    total_steps: int
    eval_every: int  # optimizer steps between dev evaluations (and state saves)
    patience: int  # stop after this many evaluations without improvement
    metric: str  # key of Task.evaluate()'s result that selects the best weights
    maximize: bool = True
    grad_clip: float | None = 1.0
    log_every: int = 10


@dataclass
class FitResult:
    state: TrainState
    best: dict[str, torch.Tensor] | None  # weights of the best evaluation; None if no evaluation ran
    metrics: dict[str, float]  # the best evaluation's metrics


def fit(module: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LambdaLR, task: Task, loop: LoopConfig,
        state_dir: Path, log: TrainLog, *, resume: bool, fingerprint: dict) -> FitResult:
    """Train with periodic dev evaluation, keep the best weights, save resumable state at every evaluation."""
    state, best = start(module, optimizer, scheduler, state_dir, log, resume=resume, fingerprint=fingerprint)
    window: list[dict[str, float]] = []
    clock = time.perf_counter()
    while not state.stopped and state.step < loop.total_steps:
        window.append(train_step(module, optimizer, scheduler, task, loop, state.step))
        state.step += 1
        if state.step % loop.log_every == 0 or state.step == loop.total_steps:
            log.write({"step": state.step, **{k: float(np.mean([w[k] for w in window])) for k in window[0]}})
            window = []
        if state.step % loop.eval_every == 0 or state.step == loop.total_steps:
            best = evaluate_and_save(module, optimizer, scheduler, task, loop, state, best, state_dir, log, clock)
            clock = time.perf_counter()
    metrics = next((r["dev"] for r in reversed(log.records()) if "dev" in r and r["step"] == state.best_step), {})
    return FitResult(state, best, metrics)


def train_step(module: nn.Module, optimizer, scheduler, task: Task, loop: LoopConfig, step: int) -> dict[str, float]:
    epoch, index = divmod(step, task.steps_per_epoch)
    module.train()
    loss, parts = task.loss(task.batch(epoch, index))
    lr = optimizer.param_groups[0]["lr"]  # the rate this update uses (the scheduler moves it afterwards)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if loop.grad_clip:
        torch.nn.utils.clip_grad_norm_(module.parameters(), loop.grad_clip)
    optimizer.step()
    scheduler.step()
    return {"loss": float(loss.detach()), "lr": lr, **parts}


def evaluate_and_save(module, optimizer, scheduler, task: Task, loop: LoopConfig, state: TrainState,
                      best: dict | None, state_dir: Path, log: TrainLog, clock: float) -> dict | None:
    module.eval()
    with torch.no_grad():
        metrics = task.evaluate()
    value = metrics[loop.metric]
    improved = state.best_metric is None or (value > state.best_metric if loop.maximize else value < state.best_metric)
    if improved:
        best = tensors_to_save(module.state_dict())
        state.best_metric, state.best_step, state.bad_evals = value, state.step, 0
    else:
        state.bad_evals += 1
    state.stopped = state.bad_evals >= loop.patience or state.step >= loop.total_steps
    log.write({"step": state.step, "dev": metrics, "best": improved, "best_step": state.best_step})
    state.log_offset = log.offset()
    state.train_s += time.perf_counter() - clock
    save_state(state_dir, state, module.state_dict(), best, optimizer, scheduler)
    return best


def start(module: nn.Module, optimizer, scheduler, state_dir: Path, log: TrainLog, *, resume: bool,
          fingerprint: dict) -> tuple[TrainState, dict | None]:
    """A fresh state, or the saved one restored into module, optimizer, scheduler and the RNGs."""
    check_can_start(state_dir, resume)
    saved = load_state(state_dir) if resume else None
    if saved is None:
        log.truncate(0)
        return TrainState(fingerprint=json.loads(json.dumps(fingerprint))), None
    if json.dumps(saved.state.fingerprint, sort_keys=True) != json.dumps(fingerprint, sort_keys=True):
        changed = sorted(k for k in set(fingerprint) | set(saved.state.fingerprint)
                         if json.dumps(fingerprint.get(k)) != json.dumps(saved.state.fingerprint.get(k)))
        raise ValueError(f"cannot resume {state_dir}: settings changed since it was saved ({', '.join(changed)})")
    module.load_state_dict(saved.weights)
    optimizer.load_state_dict(saved.optimizer)
    scheduler.load_state_dict(saved.scheduler)
    restore_rng(saved.rng)
    log.truncate(saved.state.log_offset)
    return saved.state, saved.best


def check_can_start(state_dir: Path, resume: bool) -> None:
    """A fresh run never overwrites an earlier run's state (ValueError: the CLI reports it as a usage error)."""
    if not resume and (Path(state_dir) / LATEST).is_file():
        raise ValueError(f"{state_dir} holds the state of an earlier run; resume it (--resume) or pick another --out")
