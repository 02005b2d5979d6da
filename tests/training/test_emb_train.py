"""Training the [emb] cross-encoder with the same trainer and LCE loss: a few steps lower the loss and move the
marker embeddings and the body; `sieve train ce --head emb` writes a checkpoint that loads as [emb] with the same
scores, and continues from it with --init."""
from __future__ import annotations

import torch

from sieve.models.cross_encoder import CrossEncoder, PairLengths
from sieve.research.heads.emb import DOC_MARKER, QUERY_MARKER, EmbPairScorer
from tests.training.test_ce_train import tiny_beir, tiny_config, tiny_dataset  # noqa: F401 (fixtures)
from sieve.training.ce_train import CETrainer


def marker_rows(scorer: EmbPairScorer) -> torch.Tensor:
    emb = scorer.classifier.get_input_embeddings().weight
    return emb[[scorer.query_token_id, scorer.doc_token_id]].detach().clone()  # (2, d)


def test_lce_steps_lower_the_loss_and_train_the_markers(tiny_beir, tiny_dataset, tmp_path):  # noqa: F811
    trainer = CETrainer(tiny_config(tiny_beir, tmp_path, head="emb"), [tiny_dataset])
    scorer = trainer.ce.scorer
    assert isinstance(scorer, EmbPairScorer)
    assert trainer.ce.tokenizer.convert_ids_to_tokens([scorer.query_token_id, scorer.doc_token_id]) == [QUERY_MARKER, DOC_MARKER]
    batch = trainer.epoch_data()[0]
    markers, layer0 = marker_rows(scorer), scorer.classifier.base_model.encoder.layer[0].output.dense.weight.detach().clone()
    scorer.eval()
    with torch.no_grad():
        before = trainer.batch_loss(batch).item()
    for _ in range(4):
        trainer.train_step([batch])
    scorer.eval()
    with torch.no_grad():
        after = trainer.batch_loss(batch).item()
    assert after < before - 0.05, (before, after)
    assert not torch.equal(marker_rows(scorer), markers)
    assert not torch.equal(scorer.classifier.base_model.encoder.layer[0].output.dense.weight, layer0)


def test_sieve_train_ce_head_emb_writes_a_loadable_checkpoint(tiny_beir, cache_dir, tmp_path, monkeypatch):  # noqa: F811
    from sieve.cli import main

    monkeypatch.setenv("SIEVE_CACHE_DIR", str(cache_dir))
    out = tmp_path / "emb"
    args = ["train", "ce", "--data", str(tiny_beir), "--negatives", "3", "--neg-pool", "10", "--batch-groups", "2",
            "--max-length", "64", "--k-dev", "5", "--max-steps", "1", "--head", "emb"]
    main(args + ["--out", str(out)])
    assert "head `emb`" in (out / "model_card.md").read_text()
    loaded = CrossEncoder.from_pretrained(out, lengths=PairLengths(64, 64))
    assert isinstance(loaded.scorer, EmbPairScorer)
    docs = ["lava and magma erupt", "bread rises in the oven", "penguins on the ice"]
    scores = loaded.score("what is a lava volcano", docs)
    assert scores.shape == (3,) and scores.max() - scores.min() > 1e-3
    main(args + ["--out", str(tmp_path / "again"), "--init", str(out)])  # continue from the [emb] checkpoint
    again = CrossEncoder.from_pretrained(tmp_path / "again")
    assert isinstance(again.scorer, EmbPairScorer) and len(again.tokenizer) == len(loaded.tokenizer)
