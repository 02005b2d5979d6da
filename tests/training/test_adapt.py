"""`sieve adapt`: reads only the index, refuses what it cannot do, resumes after a kill, installs atomically."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from sieve.cli import main
from sieve.index import build_index, read_beir_corpus
from sieve.index.adapted import adapted_dir, adapted_documents, current_adapted
from tests.conftest import DEMO_CORPUS

AUDITED = """
import sys
opened = []
sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == "open" else None)
from sieve.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print("OPENED " + repr(sorted(set(opened))))
sys.exit(code)
"""


@pytest.fixture(scope="module")
def beir_folder(tmp_path_factory):
    """The demo corpus in BEIR layout, with queries and qrels beside it that adapt must never read."""
    folder = tmp_path_factory.mktemp("beir")
    shutil.copy(DEMO_CORPUS, folder / "corpus.jsonl")
    docs = read_beir_corpus(DEMO_CORPUS)
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": d.title}) + "\n"
                                                  for i, d in enumerate(docs)))
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" +
                                               "".join(f"q{i}\t{d.id}\t1\n" for i, d in enumerate(docs)))
    return folder


@pytest.fixture()
def index(beir_folder, tmp_path, biencoder, cache_dir):
    path = tmp_path / "index"
    build_index(read_beir_corpus(beir_folder / "corpus.jsonl"), biencoder, path, cache_dir=cache_dir, progress=False)
    return path


def run_adapt(*args: str) -> int:
    try:
        main(["adapt", *args, "--no-progress"])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def snapshot(folder: Path) -> dict[str, str]:
    """Every path under `folder` with its content's sha256 (directories: "dir"): equal snapshots = nothing added,
    removed or changed."""
    return {str(p.relative_to(folder)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))}


def lower_case(text: str) -> str:
    """Lower-case, punctuation split off as tokens: sentences end " ." (tokenised abstracts)."""
    return " ".join(re.sub(r"([.!?,;:()])", r" \1 ", text.lower()).split())


def unpunctuated(text: str) -> str:
    """Neither capitals nor punctuation."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def build_rewritten(folder: Path, rewrite, biencoder, cache_dir) -> Path:
    """The demo corpus with every title and text rewritten, as an index at folder/index."""
    from sieve.index import Document

    docs = [Document(d.id, rewrite(d.title), rewrite(d.text)) for d in read_beir_corpus(DEMO_CORPUS)]
    build_index(docs, biencoder, folder / "index", cache_dir=cache_dir, progress=False)
    return folder / "index"


def test_adapt_reads_the_index_only(index, beir_folder):
    env = {**os.environ, "SIEVE_TORCH_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", AUDITED, "adapt", "--index", str(index), "--steps", "60",
                           "--no-progress"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode in (0, 3), done.stderr[-2000:]
    opened = eval(done.stdout.split("OPENED ", 1)[1].strip())
    assert any(str(index) in path for path in opened)  # the audit saw the index being read
    data_files = [p for p in opened if p.endswith((".jsonl", ".tsv", ".json")) and str(index) not in p
                  and "/site-packages/" not in p and "/sieve/checkpoints/" not in p]
    assert not [p for p in opened if str(beir_folder) in p] and not data_files, data_files
    # whichever way the guard went, the index says so consistently
    assert (current_adapted(index) is not None) == (done.returncode == 0)


def test_zero_steps_is_not_installed_and_leaves_the_index_as_it_was(index, capsys):
    before = snapshot(index)
    assert run_adapt("--index", str(index), "--steps", "0") == 3
    out, err = capsys.readouterr()
    assert "NOT INSTALLED" in err
    assert current_adapted(index) is None
    report = json.loads(out[out.index("{"):])  # the report is printed, not left in the index
    assert report["installed"] is None and "no training step" in report["not_installed"]
    assert report["pseudo_queries"] == 60 and report["lists"]["heldout"] >= 5
    assert snapshot(index) == before  # no adapted/.lock, no adapted/.work, no adapted/


def test_too_small_an_index_is_refused(tmp_path, biencoder, cache_dir, capsys):
    small = tmp_path / "small"
    build_index(read_beir_corpus(DEMO_CORPUS)[:20], biencoder, small, cache_dir=cache_dir, progress=False)
    before = snapshot(small)
    assert run_adapt("--index", str(small)) == 2
    assert "needs at least 40" in capsys.readouterr().err
    assert snapshot(small) == before
    with pytest.raises(SystemExit, match="no index"):
        main(["adapt", "--index", str(tmp_path / "missing")])


@pytest.mark.parametrize("rewrite", [lower_case, unpunctuated], ids=["lower-case", "unpunctuated"])
def test_text_without_capitals_or_punctuation_adapts_and_installs(tmp_path, biencoder, cache_dir, capsys, rewrite):
    """The splitter that once needed a capital after a full stop made no pseudo-query of such text (issue 35)."""
    index = build_rewritten(tmp_path, rewrite, biencoder, cache_dir)
    assert run_adapt("--index", str(index), "--steps", "50") == 0, capsys.readouterr().err[-3000:]
    err = capsys.readouterr().err
    assert "60 pseudo-queries (ict) from 60 documents" in err
    assert current_adapted(index) is not None
    assert sorted(p.name for p in adapted_dir(index).iterdir()) == ["CURRENT", current_adapted(index).name]


def test_a_refusal_names_the_step_that_lost_the_pseudo_queries_and_leaves_the_index_as_it_was(
        tmp_path, biencoder, cache_dir, capsys):
    index = build_rewritten(tmp_path, lambda text: " ".join(text.split()[:3]), biencoder, cache_dir)  # 3 words each
    before = snapshot(index)
    assert run_adapt("--index", str(index), "--steps", "10") == 2
    err = capsys.readouterr().err
    assert "the ict generator made 0 pseudo-queries from 60 documents: 60 gave none (median length 3 words" in err
    assert "What to try: try --generator terms" in err
    assert "find their source document among the candidates" not in err  # the old message, which named no cause
    assert snapshot(index) == before


def test_shortfall_names_each_cause():
    from sieve.training.adapt import AdaptConfig
    from sieve.training.adapt_run import shortfall

    cfg = AdaptConfig()
    assert shortfall(cfg, 1400, 1400, 1400, 1390, 1100, 290, 512, None) is None
    few_made = shortfall(cfg, 1400, 15, 15, 15, 13, 2, 512, 9.0)
    assert few_made.startswith("13 pseudo-queries to train on (needs 16) and 2 held out (needs 5)")
    assert "made 15 pseudo-queries from 1400 documents: 1385 gave none (median length 9 words" in few_made
    missed = shortfall(cfg, 1400, 1400, 1400, 12, 10, 2, 512, None)
    assert "only 12 find their source document among the top 512 candidates" in missed
    assert "SIEVE_LEXICAL_LANGUAGE" in missed
    small = shortfall(cfg, 45, 45, 45, 40, 36, 4, 45, None)
    assert "too small for a held-out check" in small and "--per-doc" in small


def test_resumes_after_sigkill(index, capsys):
    env = {**os.environ, "SIEVE_TORCH_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "sieve.cli", "adapt", "--index", str(index), "--steps", "150",
                             "--no-progress"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    work = adapted_dir(index) / ".work"
    try:
        deadline = time.monotonic() + 540
        while not list(work.glob("train-*/train.json")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(work.glob("train-*/train.json")), "the first evaluation was never saved"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    state = next(work.glob("train-*/train.json"))
    saved = json.loads(state.read_text())["step"]
    assert 0 < saved < 150
    mined = sorted((adapted_dir(index) / ".work").glob("mined-*.safetensors"))
    assert mined
    before = {p: p.stat().st_mtime_ns for p in mined}
    code = run_adapt("--index", str(index), "--steps", "150")
    err = capsys.readouterr().err
    assert "resuming the interrupted run" in err
    assert f"resuming at step {saved} " in err  # training went on from the last saved evaluation, not from 0
    assert all(p.stat().st_mtime_ns == t for p, t in before.items() if p.exists())  # mined lists were reused
    assert code in (0, 3)


def test_install_publishes_a_loadable_cmc(index, biencoder):
    from sieve.index.adapted import LocalAdapted
    from sieve.models.cmc_checkpoint import load_cmc
    from sieve.training.adapt import AdaptConfig, new_model
    from sieve.training.adapt_run import install

    cfg = AdaptConfig(n_layers=1)
    model = new_model(cfg, biencoder.dim, None)
    with torch.no_grad():
        model.evidence.cmc_weight.fill_(0.5)
    metrics = {"first_stage": {"mrr@10": 0.5, "hit@1": 0.4, "queries": 10},
               "shipped_default": {"mrr@10": 0.5, "hit@1": 0.4, "queries": 10},
               "adapted": {"mrr@10": 0.6, "hit@1": 0.5, "queries": 10}}
    summary = {"command": "sieve adapt --index x", "index_version": 1, "documents": 60, "heldout_documents": 10,
               "pseudo_queries": 60, "lists": {"train": 50, "heldout": 10}, "query_stats": {}, "best_step": 50,
               "steps": 100, "history": [], "config": {**cfg.__dict__}, "wall_s": 1.0,
               "metrics": {"heldout_documents": metrics, "training_documents": metrics}}
    ids = [f"d{i}" for i in range(60)]
    store = LocalAdapted(index)
    path = install(store, model, biencoder, ids, "sha", summary, cfg)
    assert current_adapted(index) == path
    assert adapted_documents(path) == set(ids)
    bundle = load_cmc(path, biencoder)
    assert bundle.config.n_layers == 1 and bundle.config.evidence == 8
    assert float(bundle.model.evidence.cmc_weight.detach()) == pytest.approx(0.5, abs=1e-3)
    config = json.loads((path / "config.json").read_text())
    assert config["metadata"]["adapted"]["documents"] == 60
    card = (path / "model_card.md").read_text()
    assert "0.6000" in card and "held out" in card
    second = install(store, model, biencoder, ids, "sha", summary, cfg)
    assert current_adapted(index) == second != path


def test_verdict():
    from sieve.training.adapt import verdict

    def held(first, default, adapted):
        return {k: {"mrr@10": v} for k, v in zip(("first_stage", "shipped_default", "adapted"), (first, default, adapted))}

    assert verdict(held(0.5, 0.55, 0.6), best_step=100) is None
    assert "below the first stage" in verdict(held(0.7, 0.55, 0.6), best_step=100)
    assert "below the shipped default" in verdict(held(0.5, 0.65, 0.6), best_step=100)
    assert "no training step" in verdict(held(0.5, 0.55, 0.6), best_step=0)


def test_teacher_term_is_zero_for_its_own_ranking_and_positive_otherwise():
    from sieve.models.cmc import randomize_gates
    from sieve.pipeline.evidence import FEATURES
    from sieve.training.adapt import AdaptConfig, loss_of, new_model
    from sieve.training.adapt_data import Lists

    rng = np.random.default_rng(0)
    q, k, d = 6, 9, 12
    lengths = np.array([9, 7, 9, 5, 9, 8], np.int32)
    rows = np.tile(np.arange(k, dtype=np.int32), (q, 1))
    rows[np.arange(k)[None, :] >= lengths[:, None]] = -1  # padded lists: the teacher term must mask them
    lists = Lists(rng.normal(size=(q, d)).astype(np.float32), rows,
                  rng.normal(size=(q, k, len(FEATURES))).astype(np.float32), lengths,
                  np.array([0, 3, 8, 1, 2, 5], np.int32), np.arange(q, dtype=np.int32),
                  rng.normal(size=(q, d)).astype(np.float32))
    vectors = torch.from_numpy(rng.normal(size=(k, d)).astype(np.float32))
    model = randomize_gates(new_model(AdaptConfig(dropout=0.0), d, None)).eval()
    with torch.no_grad():
        for p in model.evidence.parameters():
            p.add_(0.3 * torch.randn_like(p))
    picks = np.arange(q)
    plain = loss_of(model, lists, picks, vectors, "cpu", k)
    same = loss_of(model, lists, picks, vectors, "cpu", k, teacher=model, teacher_weight=1.0)
    assert np.isfinite(same.item()) and abs(same.item() - plain.item()) < 1e-5
    other = new_model(AdaptConfig(dropout=0.0), d, None).eval()  # ranks as the first stage: another ranking
    differs = loss_of(model, lists, picks, vectors, "cpu", k, teacher=other, teacher_weight=1.0)
    assert differs.item() - plain.item() > 1e-3
