"""Training the gated cross-encoder: a few LCE steps lower the loss and open gates (at their own learning rate,
the body at the trainer's); `sieve train ce --head gated` writes a checkpoint that loads with its gates, and --init
from it continues with them instead of closing them again."""
from __future__ import annotations

import pytest
import torch

from sieve.models.ce_gated import GatedScorer
from sieve.models.cross_encoder import CrossEncoder
from tests.training.test_ce_train import tiny_beir, tiny_config, tiny_dataset  # noqa: F401 (fixtures)
from sieve.training.ce_train import CETrainer


def test_lce_steps_lower_the_loss_and_move_the_gates(tiny_beir, tiny_dataset, tmp_path):  # noqa: F811
    trainer = CETrainer(tiny_config(tiny_beir, tmp_path, head="gated", lr=1e-3, head_lr=1e-2), [tiny_dataset])
    scorer = trainer.ce.scorer
    assert isinstance(scorer, GatedScorer)
    lrs = {id(p): group["lr"] for group in trainer.optimizer.param_groups for p in group["params"]}
    assert lrs[id(scorer.gates)] == 1e-2 and lrs[id(scorer.classifier.bert.embeddings.word_embeddings.weight)] == 1e-3
    # labels the bi-encoder disagrees with (a negative marked as the positive), so the scores have to move
    batch = [(query, [docs[1], docs[0], *docs[2:]]) for query, docs in trainer.epoch_data()[0]]
    scorer.eval()
    with torch.no_grad():
        before = trainer.batch_loss(batch).item()
    for _ in range(4):
        trainer.train_step([batch])
    scorer.eval()
    with torch.no_grad():
        after = trainer.batch_loss(batch).item()
    assert after < before - 0.05, (before, after)
    assert scorer.gates.abs().max() > 1e-2  # 4 steps at lr 1e-2 move a gate by up to 0.04


def test_sieve_train_ce_head_gated_writes_a_checkpoint_that_init_continues(tiny_beir, cache_dir, tmp_path, monkeypatch):  # noqa: F811
    from sieve.cli import main

    monkeypatch.setenv("SIEVE_CACHE_DIR", str(cache_dir))
    args = ["train", "ce", "--data", str(tiny_beir), "--negatives", "3", "--neg-pool", "10", "--batch-groups", "2",
            "--max-length", "64", "--k-dev", "5", "--head", "gated"]
    main(args + ["--out", str(tmp_path / "first"), "--max-steps", "2", "--head-lr", "0.05"])
    first = CrossEncoder.from_pretrained(tmp_path / "first")
    assert isinstance(first.scorer, GatedScorer) and first.scorer.gates.abs().max() > 0.01
    assert "head `gated`" in (tmp_path / "first" / "model_card.md").read_text()
    main(args + ["--out", str(tmp_path / "again"), "--init", str(tmp_path / "first"), "--max-steps", "1",
                 "--head-lr", "1e-9"])
    again = CrossEncoder.from_pretrained(tmp_path / "again")
    torch.testing.assert_close(again.scorer.gates, first.scorer.gates, rtol=1e-2, atol=1e-3)
    with pytest.raises(SystemExit):
        main(["train", "ce", "--data", str(tiny_beir), "--out", str(tmp_path / "x"), "--head", "nope"])
