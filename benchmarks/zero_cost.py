"""A `sieve serve` whose model forwards cost ~nothing: the serving ceiling a fast accelerator leaves, measured on
any machine (benchmarks/overhead.py starts it).

The stand-ins are installed in THIS process (and in each worker process it spawns), never in the product's code
path: they wrap `sieve.service.components.lower_precision`, the step of start-up that puts the served query towers
and the CMC module in place, and replace exactly those modules. Everything else runs as shipped: HTTP, request
validation, tokenization, the batchers, FAISS, BM25, fusion and evidence features, metrics, the response.

- query tower: (input_ids, attention_mask) -> (B, d) unit vectors looked up from a fixed random table by the first
  word piece (the query still picks different documents), one gather, ~µs;
- CMC: (query, candidates, mask, evidence) -> (B, K) = -position, i.e. the first-stage order kept, ~µs;
- the in-process cross-encoder's forward: (input_ids, attention_mask, ...) -> (B,) = -tokens of each pair, ~µs
  (its tokenizer and pair layout run as shipped).

    PYTHONPATH=TREE python benchmarks/zero_cost.py [--workers N]   # serves SIEVE_INDEX_DIR on SIEVE_PORT

TREE is the checkout whose `sieve` is served (this commit, or a checkout of main as the baseline).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch


class QueryTowerStandIn(torch.nn.Module):
    """(B, L) token ids -> (B, d) unit vectors, a function of the first word piece only."""

    def __init__(self, dim: int, vocab: int = 32768, seed: int = 0):
        super().__init__()
        table = torch.randn(vocab, dim, generator=torch.Generator().manual_seed(seed))
        self.table = table / table.norm(dim=1, keepdim=True)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        first = input_ids[:, min(1, input_ids.shape[1] - 1)] % self.table.shape[0]  # after [CLS]
        return self.table[first]  # (B, d)


class CMCStandIn(torch.nn.Module):
    """Scores that keep the candidates' first-stage order: -position, shape (B, K). Reads the candidates' vectors
    where the model it stands in for does (models/cmc.py reads_candidates: the shipped fusion MLP does not), so the
    stage gathers and pads what it would for the real one."""

    def __init__(self, reads_candidates: bool = True):
        super().__init__()
        self.reads = reads_candidates

    def reads_candidates(self) -> bool:
        return self.reads

    def forward(self, query, candidates, mask=None, evidence=None) -> torch.Tensor:
        shaped = mask if candidates is None else candidates
        batch, k = shaped.shape[0], shaped.shape[1]
        return -torch.arange(k, dtype=torch.float32, device=shaped.device).expand(batch, k)  # (B, K)


class CrossEncoderStandIn(torch.nn.Module):
    """A pair's score from its token count alone; keeps the head's own pair layout (pair_inputs), so the requests'
    pairs are tokenized and laid out as with the real head."""

    def __init__(self, head: torch.nn.Module):
        super().__init__()
        if hasattr(head, "pair_inputs"):
            self.pair_inputs = head.pair_inputs

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        return -attention_mask.sum(dim=1).float()  # (B,)


def install() -> None:
    """Replace the served forwards once start-up has put them in place (a no-op when called again)."""
    from sieve.service import components

    if getattr(components.lower_precision, "zero_cost", False):
        return
    original = components.lower_precision

    def lower_then_stand_in(settings, biencoder, models):
        record = original(settings, biencoder, models)
        biencoder.query_module = QueryTowerStandIn(biencoder.dim)
        cmc = models.get("cmc")
        if cmc is not None:
            cmc.model = CMCStandIn(getattr(cmc.model, "reads_candidates", lambda: True)())
            if cmc.query_tower is not biencoder:
                cmc.query_tower.query_module = QueryTowerStandIn(cmc.query_tower.dim, seed=1)
        ce = models.get("ce")
        if hasattr(ce, "scorer") and hasattr(ce, "tokenizer"):  # in process (a remote one is left alone)
            ce.scorer = CrossEncoderStandIn(ce.scorer)
        return {stage: {**rec, "reason": f"zero-cost stand-in (benchmarks/zero_cost.py); {rec['reason']}"}
                for stage, rec in record.items()}

    lower_then_stand_in.zero_cost = True
    components.lower_precision = lower_then_stand_in
    if os.environ.get("SIEVE_BENCH_NO_WATCH"):  # a benchmark side pinned as before the watch existed (overhead.py)
        from sieve.service import app

        app.watch_interpreter = lambda: None


def worker_app():
    """The app of one worker process (uvicorn factory): the stand-ins, then the product's own worker app."""
    install()
    from sieve.service.app import worker_app as product_worker_app

    return product_worker_app()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes (more than 1: a tree with sieve/service/supervisor.py)")
    args = parser.parse_args()
    install()
    from sieve.service.config import Settings

    settings = Settings()
    if args.workers == 1:
        from sieve.cli import run_server

        # the single-process path, as `sieve serve` runs it: asked for explicitly, since the automatic count may be
        # more than 1 (2 from 2 cores), and workers that run_server starts would load the real forwards
        run_server(settings.model_copy(update={"workers": 1}))
        return
    from sieve.service import supervisor

    module = "zero_cost" if __name__ == "__main__" else __name__  # run as a script: its folder is on sys.path
    supervisor.serve(settings.model_copy(update={"workers": args.workers}), factory=f"{module}:worker_app")


if __name__ == "__main__":
    sys.exit(main())
