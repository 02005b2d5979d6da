"""MixEncoder training: which candidates enter each query's softmax, a few steps lower the loss and move the body,
the gates and the [CTX] embeddings, and `sieve train mix` writes a checkpoint that loads and resumes."""
from __future__ import annotations

import json
import torch

from sieve.research.mix.runtime import MixRuntime
from tests.training.test_ce_train import tiny_beir, tiny_config, tiny_dataset  # noqa: F401 (fixtures)
from sieve.research.mix.train import MixTrainConfig, MixTrainer, excluded


def mix_config(data, out, **overrides) -> MixTrainConfig:
    base = tiny_config(data, out)
    return MixTrainConfig(**{**{f: getattr(base, f) for f in base.__dataclass_fields__}, "lr": 1e-4, **overrides})


def test_relevant_documents_and_other_groups_are_left_out_of_the_softmax():
    batch = [("q1", ["p1", "n1", "p1b"]), ("q2", ["p2", "p1", "n2"])]
    relevant = {"q1": {"p1", "p1b"}, "q2": {"p2"}}
    got = excluded(batch, relevant, in_batch=True)
    # q1: its target is column 0; p1b (column 2) and the p1 in q2's group (column 4) are relevant to it
    assert got.tolist() == [[False, False, True, False, True, False], [False] * 6]
    own_only = excluded(batch, relevant, in_batch=False)
    assert own_only.tolist() == [[False, False, True, True, True, True], [True, True, True, False, False, False]]


def test_steps_lower_the_loss_and_train_body_gates_and_context_tokens(tiny_beir, tiny_dataset, tmp_path):  # noqa: F811
    trainer = MixTrainer(mix_config(tiny_beir, tmp_path, interaction_layers=2), [tiny_dataset])
    assert isinstance(trainer.ce, MixRuntime)
    batch = trainer.epoch_data()[0]
    module = trainer.ce.module
    before = {k: v.detach().clone() for k, v in module.state_dict().items()}
    module.eval()
    with torch.no_grad():
        loss_before = trainer.batch_loss(batch).item()
    for _ in range(4):
        trainer.train_step([batch])
    module.eval()
    with torch.no_grad():
        loss_after = trainer.batch_loss(batch).item()
    assert loss_after < loss_before - 0.05, (loss_before, loss_after)
    changed = {k for k, v in module.state_dict().items() if not torch.equal(v, before[k])}
    assert {"gates.0.weight", "gates.1.weight", "compress.1.weight"} <= changed
    assert any(k.startswith("encoder.encoder.layer.0.") for k in changed)
    ctx = trainer.ce.context_ids[0]
    assert not torch.equal(module.encoder.get_input_embeddings().weight[ctx],
                           before["encoder.embeddings.word_embeddings.weight"][ctx])
    assert trainer.progress.pairs == 32  # 4 steps of 2 groups of 1 + 3 candidates


def test_sieve_train_mix_writes_a_loadable_checkpoint_and_resumes(tiny_beir, cache_dir, tmp_path, monkeypatch):  # noqa: F811
    from sieve.cli import main

    monkeypatch.setenv("SIEVE_CACHE_DIR", str(cache_dir))
    out = tmp_path / "mix"
    args = ["train", "mix", "--data", str(tiny_beir), "--out", str(out), "--negatives", "3", "--neg-pool", "10",
            "--batch-groups", "2", "--max-length", "64", "--k-dev", "5", "--log-every", "1", "--contexts", "2"]
    main(args + ["--max-steps", "1"])
    card = (out / "model_card.md").read_text()
    assert "bi-encoder | MixEncoder" in card and "sieve train mix --data" in card and "--contexts 2" in card
    loaded = MixRuntime.from_pretrained(out)
    assert loaded.module.cfg.contexts == 2
    assert loaded.score("what is a lava volcano", ["lava and magma", "bread"]).shape == (2,)
    main(args + ["--max-steps", "2", "--resume"])
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["event"] == "train"] == [1, 2]
    assert all(0.0 <= r["dev_ndcg@10"]["mean"] <= 1.0 for r in log if r["event"] == "eval")

