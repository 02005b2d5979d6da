"""Training the cls+late cross-encoder: both heads get their own LCE loss (added), a few steps lower both and move
the projection and the body, and `sieve train ce --head cls+late` writes a checkpoint the registry loads."""
from __future__ import annotations

import pytest
import torch

from sieve.models.cross_encoder import CrossEncoder
from sieve.research.heads.late_interaction import LateInteractionScorer
from tests.training.test_ce_train import tiny_beir, tiny_config, tiny_dataset  # noqa: F401 (fixtures)
from sieve.training.ce_train import CETrainer, group_parts, lce_loss


def test_both_heads_are_trained_and_their_losses_fall(tiny_beir, tiny_dataset, tmp_path):  # noqa: F811
    trainer = CETrainer(tiny_config(tiny_beir, tmp_path, head="cls+late", late_dim=32), [tiny_dataset])
    assert isinstance(trainer.ce.scorer, LateInteractionScorer)
    batch = trainer.epoch_data()[0]
    before_proj = trainer.ce.scorer.proj.weight.detach().clone()
    trainer.ce.scorer.eval()
    with torch.no_grad():
        s_cls, s_late = group_parts(trainer.ce, batch)
        before = [lce_loss(s_cls).item(), lce_loss(s_late).item()]
        assert trainer.batch_loss(batch).item() == pytest.approx(sum(before), rel=1e-5)  # losses added
    for _ in range(4):
        trainer.train_step([batch])
    trainer.ce.scorer.eval()
    with torch.no_grad():
        after = [lce_loss(part).item() for part in group_parts(trainer.ce, batch)]
    # the late head learns this toy batch fastest (token overlap); the [CLS] head moves too
    assert after[0] < before[0] - 0.01 and after[1] < before[1] - 0.05, (before, after)
    assert not torch.equal(trainer.ce.scorer.proj.weight, before_proj)


def test_sieve_train_ce_head_cls_late_writes_a_loadable_checkpoint(tiny_beir, cache_dir, tmp_path, monkeypatch):  # noqa: F811
    from sieve.cli import main

    monkeypatch.setenv("SIEVE_CACHE_DIR", str(cache_dir))
    out = tmp_path / "late"
    main(["train", "ce", "--data", str(tiny_beir), "--out", str(out), "--negatives", "3", "--neg-pool", "10",
          "--batch-groups", "2", "--max-length", "64", "--k-dev", "5", "--max-steps", "1", "--head", "cls+late",
          "--late-dim", "16"])
    assert "head `cls+late (late-interaction projection: 16)`" in (out / "model_card.md").read_text()
    loaded = CrossEncoder.from_pretrained(out)
    assert isinstance(loaded.scorer, LateInteractionScorer) and loaded.scorer.proj.weight.shape == (16, 384)
    assert loaded.score("what is a lava volcano", ["lava and magma", "bread"]).shape == (2,)
    with pytest.raises(SystemExit, match="late-dim"):
        main(["train", "ce", "--data", str(tiny_beir), "--out", str(tmp_path / "x"), "--late-dim", "-1"])
