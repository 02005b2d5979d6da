"""CMC trainer: losses against hand-computed values, real training steps with the packaged MiniLM on a tiny BEIR
folder (the bundled demo corpus with made-up queries), resume, the saved checkpoint, distillation, the CLI."""
from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from sieve.models.cmc_checkpoint import load_cmc, untrained_cmc
from sieve.training.checkpointing import load_state, warmup_linear_schedule
from sieve.training.cmc_train import (CMCTrainConfig, LabelledTask, ListwiseTask, Trainee, load_labelled, train_cmc,
                                train_distill)
from sieve.training.losses import cmc_listwise_loss, cmc_loss, listwise_kl

DEMO = Path(__file__).resolve().parents[2] / "sieve" / "demo_corpus.jsonl"
TINY = CMCTrainConfig(k=16, batch_size=4, epochs=4, dev_fraction=0.25, eval_every=1000, log_every=1)


@pytest.fixture(scope="module")
def beir(tmp_path_factory) -> Path:
    """The 60-document demo corpus; 20 queries (two per topic, a document's title), two relevant documents each."""
    root = tmp_path_factory.mktemp("beir")
    docs = [json.loads(line) for line in DEMO.read_text().splitlines() if line.strip()]
    (root / "corpus.jsonl").write_text(DEMO.read_text())
    by_id = {d["_id"]: d for d in docs}
    topics = sorted({d["_id"].rsplit("-", 1)[0] for d in docs})
    queries, qrels = [], ["query-id\tcorpus-id\tscore"]
    for topic in topics:
        for j in (1, 2):
            qid = f"q-{topic}-{j}"
            queries.append({"_id": qid, "text": by_id[f"{topic}-{j}"]["title"].lower()})
            qrels += [f"{qid}\t{topic}-{j}\t1", f"{qid}\t{topic}-{j + 2}\t1"]
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels").mkdir()
    (root / "qrels" / "train.tsv").write_text("\n".join(qrels) + "\n")
    return root


@pytest.fixture(scope="module")
def layers_run(beir, biencoder, cache_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "cmc-layers"
    return train_cmc(TINY, [beir], biencoder, out, cache_dir=cache_dir, command="sieve train cmc (test)")


def tower_state(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def fixed_batch_loss(bundle, beir, biencoder, cache_dir, cfg) -> float:
    """CE + KL of `bundle` (eval mode) on the epoch-0 batches: the same candidates for every model compared."""
    train, dev = load_labelled(beir, biencoder, cfg, cache_dir)
    trainee = Trainee(bundle, cfg.regime).eval()
    task = (ListwiseTask if cfg.objective == "listwise" else LabelledTask)(trainee, [train], [dev], cfg, biencoder.device)
    with torch.no_grad():
        return float(np.mean([task.loss(task.batch(0, i))[0] for i in range(task.steps_per_epoch)]))


def test_dev_split_is_used_when_present_and_datasets_mix(beir, biencoder, cache_dir, tmp_path):
    other = tmp_path / "with-dev"
    shutil.copytree(beir, other)
    lines = (beir / "qrels" / "train.tsv").read_text().splitlines()
    (other / "qrels" / "train.tsv").write_text("\n".join(lines[:-8]) + "\n")  # 16 queries train
    (other / "qrels" / "dev.tsv").write_text("\n".join(lines[:1] + lines[-8:]) + "\n")  # 4 queries dev
    train, dev = load_labelled(other, biencoder, TINY, cache_dir)
    assert (len(train.ids), len(dev.ids)) == (16, 4) and not set(train.ids) & set(dev.ids)
    held_train, held_dev = load_labelled(beir, biencoder, TINY, cache_dir)  # no dev split: 25% held out
    assert (len(held_train.ids), len(held_dev.ids)) == (15, 5)
    trainee = Trainee(untrained_cmc(biencoder, "shared"), "layers")
    task = LabelledTask(trainee, [train, held_train], [dev, held_dev], TINY, biencoder.device)
    assert len(task.examples) == 2 * 16 + 2 * 15  # two relevant documents per query, both datasets
    assert {task.examples[e][0] for e in task.plan(0)[0][:8]} == {0, 1}  # one shuffled stream over both


# ---------------------------------------------------------------- losses


def test_cmc_loss_on_a_hand_computed_toy():
    scores, retriever = torch.tensor([[2.0, 1.0, 0.0]]), torch.zeros(1, 3)  # r is uniform
    p = [math.exp(s) / (math.exp(2) + math.exp(1) + 1) for s in (2, 1, 0)]
    ce = -math.log(p[0])  # 0.4076
    kl_p_r = sum(pi * math.log(pi * 3) for pi in p)  # KL(p || r) = 0.2662
    kl_r_p = sum(math.log((1 / 3) / pi) / 3 for pi in p)  # the other direction, 0.3090: must not be used
    out = cmc_loss(scores, retriever, None, lambda_ce=1.0, lambda_kl=0.5)
    assert out.ce.item() == pytest.approx(ce, abs=1e-6)
    assert out.kl.item() == pytest.approx(kl_p_r, abs=1e-6) and abs(kl_p_r - kl_r_p) > 0.04
    assert out.total.item() == pytest.approx(ce + 0.5 * kl_p_r, abs=1e-6)
    padded = cmc_loss(torch.tensor([[2.0, 1.0, 0.0, 9.0]]), torch.tensor([[0.0, 0.0, 0.0, -5.0]]),
                      torch.tensor([[True, True, True, False]]), 1.0, 0.5)
    assert padded.total.item() == pytest.approx(out.total.item(), abs=1e-6)


def test_listwise_loss_on_a_hand_computed_toy():
    scores, retriever = torch.tensor([[2.0, 1.0, 0.0, 5.0]]), torch.zeros(1, 4)
    relevance = torch.tensor([[2.0, 0.0, 1.0, 0.0]])  # graded: target (2/3, 0, 1/3) over the 3 real candidates
    mask = torch.tensor([[True, True, True, False]])
    log_p = [s - math.log(math.exp(2) + math.exp(1) + 1) for s in (2.0, 1.0, 0.0)]
    ce = -(2 / 3 * log_p[0] + 1 / 3 * log_p[2])
    kl = sum(math.exp(lp) * (lp + math.log(3)) for lp in log_p)  # KL(p || uniform r)
    out = cmc_listwise_loss(scores, retriever, relevance, mask, lambda_ce=1.0, lambda_kl=0.5)
    assert out.ce.item() == pytest.approx(ce, abs=1e-6) and out.kl.item() == pytest.approx(kl, abs=1e-6)
    assert out.total.item() == pytest.approx(ce + 0.5 * kl, abs=1e-6)
    one_gold = cmc_loss(scores[:, :3], retriever[:, :3], None, 1.0, 0.5)  # a single relevant candidate: same loss
    single = cmc_listwise_loss(scores[:, :3], retriever[:, :3], torch.tensor([[1.0, 0.0, 0.0]]), None, 1.0, 0.5)
    assert single.total.item() == pytest.approx(one_gold.total.item(), abs=1e-6)


def test_kl_term_is_zero_only_when_cmc_matches_the_retriever():
    scores = torch.randn(4, 10, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(4, 10, dtype=torch.bool)
    mask[1, 7:] = False
    assert cmc_loss(scores, scores, mask, 1.0, 1.0).kl.item() == pytest.approx(0.0, abs=1e-6)
    assert cmc_loss(scores, scores + 3.0, mask, 1.0, 1.0).kl.item() == pytest.approx(0.0, abs=1e-6)  # softmax shift
    assert cmc_loss(scores, 2 * scores, mask, 1.0, 1.0).kl.item() > 0.05


def test_listwise_kl_by_hand_and_finite_gradients_with_padding():
    teacher = torch.tensor([[math.log(2.0), 0.0, 0.0, 0.0]])
    student = torch.zeros(1, 4, requires_grad=True)
    mask = torch.tensor([[True, True, True, False]])
    expected = 0.5 * math.log(0.5 * 3) + 2 * 0.25 * math.log(0.25 * 3)  # KL([.5, .25, .25] || uniform)
    loss = listwise_kl(student, teacher, mask, temperature=1.0)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert listwise_kl(student, 2 * teacher, mask, temperature=2.0).item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    assert torch.isfinite(student.grad).all() and student.grad[0, 3] == 0 and student.grad[0, 0] < 0


def test_warmup_then_linear_decay():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = warmup_linear_schedule(opt, total_steps=10, warmup_fraction=0.2)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:3] == pytest.approx([0.5, 1.0, 1.0])
    assert all(a > b for a, b in zip(lrs[2:], lrs[3:])) and lrs[-1] == pytest.approx(1 / 8)


# ---------------------------------------------------------------- training


def test_layers_regime_lowers_the_loss_and_trains_only_the_layers(layers_run, beir, biencoder, cache_dir):
    trained = layers_run.bundle
    assert layers_run.steps == 4 * 8  # 30 examples / batch 4 = 8 steps per epoch, 4 epochs, no early stop
    assert all(layer.gate.abs().max() > 1e-3 for layer in trained.model.layers)  # moved off the identity
    for name, value in biencoder.module.state_dict().items():
        torch.testing.assert_close(trained.query_tower.module.state_dict()[name], value, rtol=0, atol=0)
    before = fixed_batch_loss(untrained_cmc(biencoder, "shared"), beir, biencoder, cache_dir, TINY)
    after = fixed_batch_loss(trained, beir, biencoder, cache_dir, TINY)
    assert after < 0.8 * before, (before, after)


def test_listwise_objective_lowers_its_loss(beir, biencoder, cache_dir, tmp_path):
    cfg = replace(TINY, objective="listwise", pool=30, dev_k=30, epochs=8)  # relevant docs: in the top 30 of 60
    result = train_cmc(cfg, [beir], biencoder, tmp_path / "listwise", cache_dir=cache_dir)
    assert result.steps == 8 * 4  # one list per query: 15 queries / batch 4 = 4 steps per epoch
    task_batch = ListwiseTask(Trainee(result.bundle, "layers"), *[[q] for q in load_labelled(beir, biencoder, cfg, cache_dir)],
                              cfg, biencoder.device).batch(0, 0)
    assert ((task_batch.relevance > 0).sum(dim=1) >= 1).all()  # every list holds a relevant document
    before = fixed_batch_loss(untrained_cmc(biencoder, "shared"), beir, biencoder, cache_dir, cfg)
    after = fixed_batch_loss(result.bundle, beir, biencoder, cache_dir, cfg)
    assert after < 0.8 * before, (before, after)


def test_checkpoint_reloads_and_reproduces_the_trained_scores(layers_run, biencoder):
    out = layers_run.out_dir
    loaded = load_cmc(out, biencoder)
    assert loaded.query_tower is biencoder and not (out / "query_tower").exists()  # frozen towers are not stored
    g = torch.Generator().manual_seed(5)
    q = torch.nn.functional.normalize(torch.randn(3, 384, generator=g), dim=-1)
    c = torch.nn.functional.normalize(torch.randn(3, 16, 384, generator=g), dim=-1)
    with torch.no_grad():
        trained, reloaded = layers_run.bundle.model.eval()(q, c), loaded.model(q, c)
    identity = torch.einsum("bd,bkd->bk", q, c)
    torch.testing.assert_close(reloaded, trained, atol=1e-3, rtol=1e-3)  # float16 on disk
    assert (trained - identity).abs().max() > 0.1  # 100x the tolerance: not a comparison of two identities
    meta = json.loads((out / "config.json").read_text())["metadata"]
    assert meta["regime"] == "layers" and set(meta["dev"]) >= {"ndcg@10", "be_ndcg@10", "mrr@10", "be_mrr@10"}
    card = (out / "model_card.md").read_text()
    assert meta["git_commit"] in card and f"{meta['dev']['ndcg@10']:.4f}" in card and "sieve train cmc (test)" in card
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == list(range(1, 33))
    assert [r["step"] for r in log if "dev" in r] == [32]


def test_resume_continues_at_the_saved_step_with_the_same_state(beir, biencoder, cache_dir, tmp_path, monkeypatch):
    cfg = replace(TINY, epochs=1, eval_every=3)  # 8 steps, state saved at 3 and 6
    whole = train_cmc(cfg, [beir], biencoder, tmp_path / "whole", cache_dir=cache_dir)
    real_loss, calls = LabelledTask.loss, []

    def crash_at_step_5(self, batch):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt("simulated crash")
        return real_loss(self, batch)

    monkeypatch.setattr(LabelledTask, "loss", crash_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        train_cmc(cfg, [beir], biencoder, tmp_path / "crashed", cache_dir=cache_dir)
    monkeypatch.setattr(LabelledTask, "loss", real_loss)
    saved = load_state(tmp_path / "crashed" / "state")
    assert saved.state.step == 3 and all(s["step"] == 3 for s in saved.optimizer["state"].values())
    with pytest.raises(ValueError, match="resume"):
        train_cmc(cfg, [beir], biencoder, tmp_path / "crashed", cache_dir=cache_dir)
    resumed = train_cmc(cfg, [beir], biencoder, tmp_path / "crashed", cache_dir=cache_dir, resume=True)
    assert resumed.steps == whole.steps == 8
    final_whole, final_resumed = load_state(tmp_path / "whole" / "state"), load_state(tmp_path / "crashed" / "state")
    for name, value in final_whole.weights.items():
        torch.testing.assert_close(final_resumed.weights[name], value, atol=1e-6, rtol=1e-5)
    def log(run: str) -> list[tuple[int, float]]:
        lines = (tmp_path / run / "train_log.jsonl").read_text().splitlines()
        return [(r["step"], round(r.get("loss", -1), 4)) for r in map(json.loads, lines)]

    assert log("crashed") == log("whole")  # the steps logged after the crash were cut and redone, not duplicated


def test_shared_regime_trains_the_query_tower_and_not_the_biencoder(beir, biencoder, cache_dir, tmp_path):
    be_before = tower_state(biencoder.module)
    cfg = replace(TINY, regime="shared", max_steps=2, tower_lr=1e-3)
    result = train_cmc(cfg, [beir], biencoder, tmp_path / "shared", cache_dir=cache_dir)
    changed = [n for n, v in result.bundle.query_tower.module.state_dict().items() if not torch.equal(v, be_before[n])]
    assert len(changed) > 10
    for name, value in biencoder.module.state_dict().items():
        assert torch.equal(value, be_before[name]), name
    assert load_cmc(tmp_path / "shared", biencoder).config.mode == "shared"


def test_separate_regime_trains_a_candidate_tower(beir, biencoder, cache_dir, tmp_path):
    cfg = replace(TINY, regime="separate", k=4, batch_size=2, max_steps=1, tower_lr=1e-3)
    result = train_cmc(cfg, [beir], biencoder, tmp_path / "separate", cache_dir=cache_dir)
    before = biencoder.module.state_dict()
    moved = [n for n, v in result.bundle.candidate_tower.module.state_dict().items() if not torch.equal(v, before[n])]
    assert moved and load_cmc(tmp_path / "separate", biencoder).candidate_tower is not None


def test_distillation_lowers_the_kl_to_a_fixed_teacher(beir, biencoder, cache_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from sieve.models.cross_encoder import CrossEncoder
    from sieve.models.weights import default_model_path

    torch.manual_seed(0)  # an untrained scoring head on MiniLM: an arbitrary but fixed teacher
    head = AutoModelForSequenceClassification.from_pretrained(str(default_model_path()), num_labels=1)
    head.save_pretrained(tmp_path / "ce")
    AutoTokenizer.from_pretrained(str(default_model_path())).save_pretrained(tmp_path / "ce")
    teacher = CrossEncoder.from_pretrained(tmp_path / "ce", batch_size=8)
    cfg = replace(TINY, k=8, epochs=15, eval_every=1000, dev_fraction=0.25, lr=3e-3)
    args = (cfg, beir / "queries.jsonl", beir / "corpus.jsonl", teacher, biencoder, tmp_path / "distill")
    result = train_distill(*args, split="train", cache_dir=cache_dir)
    assert result.metrics["kl"] < 0.7 * result.metrics["be_kl"], result.metrics
    cached = (tmp_path / "distill" / "teacher_scores.jsonl").read_text().splitlines()
    assert len(cached) == 20 and len(json.loads(cached[0])["scores"]) == 8
    monkeypatch.setattr(CrossEncoder, "score", lambda *a, **k: pytest.fail("teacher re-scored a cached query"))
    again = train_distill(*args, split="train", cache_dir=cache_dir, resume=True)  # finished: loads, trains nothing
    assert again.metrics == result.metrics and again.steps == result.steps


def test_cli_registers_both_commands_with_config_defaults(beir, tmp_path):
    from sieve.cli import build_parser
    from sieve.training.cmc_cli import cmd_cmc, cmd_distill, config_from

    args = build_parser().parse_args(["train", "cmc", "--data", str(beir), "--data", str(beir), "--out", str(tmp_path),
                                      "--regime", "shared", "--lambda-kl", "0.5", "--max-steps", "7"])
    assert args.func is cmd_cmc and args.data == [beir, beir]
    assert config_from(args) == CMCTrainConfig(regime="shared", lambda_kl=0.5, max_steps=7)
    args = build_parser().parse_args(["train", "cmc-distill", "--queries", "q.jsonl", "--corpus", "c.jsonl",
                                      "--cross-encoder", "ce", "--out", str(tmp_path), "--temperature", "2"])
    assert args.func is cmd_distill and config_from(args) == CMCTrainConfig(k=32, temperature=2.0)


def test_cli_trains_and_reports(beir, biencoder, cache_dir, tmp_path, monkeypatch, capsys):
    import sieve.service.components
    from sieve.cli import main

    monkeypatch.setattr(sieve.service.components, "load_biencoder", lambda settings, device: biencoder)
    monkeypatch.setenv("SIEVE_CACHE_DIR", str(cache_dir))
    out = tmp_path / "cli-run"
    main(["train", "cmc", "--data", str(beir), "--out", str(out), "--k", "8", "--batch-size", "8", "--max-steps", "3"])
    printed = capsys.readouterr().out
    meta = json.loads((out / "config.json").read_text())["metadata"]
    assert f"CMC checkpoint: {out}" in printed and f"{meta['dev']['ndcg@10']:.4f}" in printed
    assert meta["steps"] == 3 and meta["command"].startswith("sieve ")
