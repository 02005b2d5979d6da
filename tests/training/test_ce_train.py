"""Cross-encoder trainer: losses against hand-computed values, group construction, real training steps on a tiny
BEIR folder with the packaged MiniLM, the fp16 checkpoint, resume, and the `sieve train ce` command."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from sieve.index import Document
from sieve.models.ce_heads import read_head
from sieve.models.cross_encoder import CrossEncoder, PairLengths
from sieve.service.config import Settings
from sieve.training.ce_train import (CETrainConfig, CETrainer, bce_loss, build_groups, lce_loss, load_dataset, save_fp16)
from sieve.training.data import Split

TOPICS = ["volcano lava magma eruption crater", "penguin antarctic ice bird colony", "violin string bow orchestra",
          "bread yeast dough oven baking", "comet tail ice orbit sun", "glacier ice valley erosion melt",
          "chess opening gambit king pawn", "coffee bean roast espresso caffeine", "tennis serve racket court",
          "bee hive honey pollen queen", "submarine sonar depth hull", "tulip bulb spring flower garden"]
FILLER = ["city traffic bus route", "tax form income deadline", "printer toner paper jam", "river bridge ferry",
          "laptop battery charger", "winter coat wool scarf", "train station platform ticket", "market fruit stall",
          "email inbox spam filter", "paint brush canvas easel", "camera lens shutter photo", "radio antenna signal",
          "kitchen sink faucet leak", "school exam pencil grade", "moon crater telescope night", "desert sand dune camel",
          "forest pine needle cone", "ocean wave surf tide"]


@pytest.fixture(scope="module")
def tiny_beir(tmp_path_factory) -> Path:
    """12 topic documents + 18 fillers; query i asks about topic i. 8 train queries (one with two positives), 4 dev."""
    root = tmp_path_factory.mktemp("tiny-beir")
    docs = [{"_id": f"t{i}", "title": t.split()[0], "text": f"All about the {t}."} for i, t in enumerate(TOPICS)]
    docs += [{"_id": f"f{i}", "title": "", "text": f"Notes on {t}."} for i, t in enumerate(FILLER)]
    (root / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    queries = [{"_id": f"q{i}", "text": f"what is a {t.split()[1]} {t.split()[0]}"} for i, t in enumerate(TOPICS)]
    (root / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries) + "\n")
    (root / "qrels").mkdir()
    train = [f"q{i}\tt{i}\t1" for i in range(8)] + ["q0\tt5\t1"]
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(train) + "\n")
    dev = [f"q{i}\tt{i}\t1" for i in range(8, 12)]
    (root / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(dev) + "\n")
    return root


def tiny_config(data: Path, out: Path, **overrides) -> CETrainConfig:
    """Short pairs and small groups keep a step well under a second on two cores."""
    base = CETrainConfig(data_dirs=(data,), out_dir=out, negatives=3, neg_pool=10, batch_groups=2, lr=1e-4,
                         warmup_fraction=0.0, max_length=64, k_dev=5, log_every=1)
    return replace(base, **overrides)


@pytest.fixture(scope="module")
def tiny_dataset(tiny_beir, biencoder, cache_dir, tmp_path_factory):
    cfg = tiny_config(tiny_beir, tmp_path_factory.mktemp("unused"))
    return load_dataset(tiny_beir, biencoder, cfg, cache_dir)


def weights_of(trainer: CETrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.ce.scorer.state_dict().items()}


def test_lce_loss_matches_hand_computed_value():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    first = -math.log(math.exp(2) / (math.exp(2) + math.exp(1) + 1))  # positive scored highest
    second = math.log(3)  # a tie: the positive gets 1/3
    assert lce_loss(logits).item() == pytest.approx((first + second) / 2, rel=1e-6)


def test_bce_loss_matches_hand_computed_value():
    logits = torch.tensor([[2.0, -1.0, 3.0]])
    sigmoid = lambda x: 1 / (1 + math.exp(-x))
    expected = (-math.log(sigmoid(2)) - math.log(1 - sigmoid(-1)) - math.log(1 - sigmoid(3))) / 3
    assert bce_loss(logits).item() == pytest.approx(expected, rel=1e-6)


def test_groups_exclude_every_positive_and_are_seeded():
    corpus = [Document(f"d{i}", "", f"text {i}") for i in range(50)]
    split = Split(corpus, ["a", "b"], ["qa", "qb"], {"a": {"d0": 1, "d3": 2, "d9": 0}, "b": {"d7": 1}})
    pools = np.array([[3, 0, 9, 1, 2, 4, 5, 6, 8, 10], [7, 11, 12, 13, 14, 15, 16, 17, 18, 19]])
    groups = build_groups(split, pools, n_neg=5, rng=np.random.default_rng(0))
    for (i, rows), positives in zip(groups, [{0, 3}, {7}]):
        assert len(rows) == 6 and rows[0] in positives
        assert not positives.intersection(rows[1:].tolist())
        assert set(rows[1:].tolist()) <= set(pools[i].tolist())
        assert len(set(rows[1:].tolist())) == 5  # pool large enough: no repeats
    again = build_groups(split, pools, 5, np.random.default_rng(0))
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(groups, again))
    other = build_groups(split, pools, 5, np.random.default_rng(1))
    assert not all(np.array_equal(a[1], b[1]) for a, b in zip(groups, other))


def test_small_pool_is_drawn_with_replacement():
    corpus = [Document(f"d{i}", "", "") for i in range(5)]
    split = Split(corpus, ["a"], ["qa"], {"a": {"d0": 1}})
    (_, rows), = build_groups(split, np.array([[0, 1, 2]]), n_neg=4, rng=np.random.default_rng(0))
    assert rows[0] == 0 and len(rows) == 5 and set(rows[1:].tolist()) <= {1, 2}


def test_steps_lower_the_loss_on_the_batch_and_change_the_weights(tiny_beir, tiny_dataset, tmp_path):
    trainer = CETrainer(tiny_config(tiny_beir, tmp_path), [tiny_dataset])
    batch = trainer.epoch_data()[0]
    assert len(batch) == 2 and all(len(docs) == 4 for _, docs in batch)
    before_weights = weights_of(trainer)
    trainer.ce.scorer.eval()
    with torch.no_grad():
        before = trainer.batch_loss(batch).item()
    for _ in range(4):
        trainer.train_step([batch])
    trainer.ce.scorer.eval()
    with torch.no_grad():
        after = trainer.batch_loss(batch).item()
    assert after < before - 0.05, (before, after)
    changed = [k for k, v in weights_of(trainer).items() if not torch.equal(v, before_weights[k])]
    assert any("classifier" in k for k in changed) and any("encoder.layer.0." in k for k in changed)
    assert trainer.progress.step == 4 and trainer.progress.pairs == 32


def test_fp16_checkpoint_reproduces_the_in_memory_scores(tiny_beir, tiny_dataset, tmp_path):
    trainer = CETrainer(tiny_config(tiny_beir, tmp_path), [tiny_dataset])
    trainer.train_step([trainer.epoch_data()[0]])
    save_fp16(trainer.ce, tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys() if "weight" in k} == {torch.float16}
    loaded = CrossEncoder.from_pretrained(tmp_path, lengths=PairLengths(64, 64))
    docs = [d.full_text for d in tiny_dataset.train.corpus[:12]]
    trainer.ce.scorer.eval()
    expected, got = trainer.ce.score("what is a lava volcano", docs), loaded.score("what is a lava volcano", docs)
    # fp16 weights move these logits by ~5e-5; the documents' scores spread over ~0.05, 20x the tolerance
    assert expected.max() - expected.min() > 0.02
    assert torch.allclose(got, expected, rtol=0, atol=1e-3), (got - expected).abs().max()


def test_resume_continues_at_the_saved_step_and_matches_an_unbroken_run(tiny_beir, tiny_dataset, tmp_path):
    cfg = tiny_config(tiny_beir, tmp_path / "broken", batch_groups=4, log_every=100)
    interrupted = CETrainer(cfg, [tiny_dataset])
    interrupted.next_step()  # 8 groups in passes of 4: 2 steps an epoch, stop half-way
    interrupted.checkpoint(0.0, 0.0)
    interrupted.log({"event": "train", "step": 99})  # logged after the save, then the run "crashed"
    resumed = CETrainer(cfg, [tiny_dataset])
    resumed.resume()
    assert all(r["step"] != 99 for r in resumed.train_log.records())
    assert (resumed.progress.step, resumed.progress.epoch, resumed.progress.batch) == (1, 0, 1)
    assert resumed.scheduler.last_epoch == 1 and len(resumed.optimizer.state) > 0
    resumed.fit(progress_bar=False)
    unbroken = CETrainer(replace(cfg, out_dir=tmp_path / "unbroken"), [tiny_dataset])
    unbroken.fit(progress_bar=False)
    assert resumed.progress.step == unbroken.progress.step == 2
    got, expected = weights_of(resumed), weights_of(unbroken)
    assert got.keys() == expected.keys()
    assert max((got[k] - expected[k]).abs().max().item() for k in expected) < 1e-6


def test_sieve_train_ce_writes_a_loadable_checkpoint_and_resumes(tiny_beir, cache_dir, tmp_path, monkeypatch):
    from sieve.cli import main

    monkeypatch.setenv("SIEVE_CACHE_DIR", str(cache_dir))
    out = tmp_path / "ce"
    args = ["train", "ce", "--data", str(tiny_beir), "--out", str(out), "--negatives", "3", "--neg-pool", "10",
            "--batch-groups", "2", "--max-length", "64", "--k-dev", "5", "--log-every", "1"]
    main(args + ["--max-steps", "1"])
    card = (out / "model_card.md").read_text()
    assert "bi-encoder | cross-encoder" in card and "optimizer steps: 1" in card and "--max-steps 1 " in card
    assert CrossEncoder.from_pretrained(out).score("what is a lava volcano", ["lava and magma"]).shape == (1,)
    # the training lengths travel with the checkpoint; serving uses them unless the settings say otherwise
    assert read_head(out) == {"head": "cls", "query_max_length": 64, "max_length": 64}
    assert Settings().ce_lengths(out) == PairLengths(64, 64)
    monkeypatch.setenv("SIEVE_CE_MAX_LENGTH", "128")
    assert Settings().ce_lengths(out) == PairLengths(64, 128)
    monkeypatch.delenv("SIEVE_CE_MAX_LENGTH")
    with pytest.raises(SystemExit, match="--resume"):
        main(args + ["--max-steps", "2"])
    main(args + ["--max-steps", "2", "--resume"])
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["event"] == "start"] == [0, 1]
    assert [r["step"] for r in log if r["event"] == "train"] == [1, 2]
    assert [r["step"] for r in log if r["event"] == "eval"] == [1, 2]
    assert all(0.0 <= r["dev_ndcg@10"]["mean"] <= 1.0 for r in log if r["event"] == "eval")
    assert "optimizer steps: 2" in (out / "model_card.md").read_text()
