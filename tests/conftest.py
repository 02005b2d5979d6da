"""Session-wide real components: the packaged bi-encoder is loaded once; indexes are built once per session."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import sieve.stages  # noqa: F401 (the core stages register)
from sieve.pipeline import registry
from tests.ci_guard import (pytest_collection_modifyitems, pytest_configure, pytest_make_collect_report,  # noqa: F401
                            pytest_runtest_makereport)

# The suite compares served scores with fp32 references at 1e-4, so servers and Settings() here run fp32; the
# lower-precision path (SIEVE_PRECISION=auto, the service's default) is tested where a test asks for it.
os.environ.setdefault("SIEVE_PRECISION", "fp32")
# Apps created in pytest's own process would pin its threads (and every server it starts inherits its CPUs): the
# servers here run unpinned; tests/service/test_pin_interpreter.py and test_core_watch.py test the automatic default.
os.environ.setdefault("SIEVE_PIN_INTERPRETER", "false")
# One process per server unless a test asks for workers (the automatic count is 2 on a 2-core machine: every server
# would load its models twice); tests/service/test_workers_*.py test the workers and the automatic count.
os.environ.setdefault("SIEVE_WORKERS", "1")
registry.load_plugins()  # the research stages, as an installed server has them

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
DEMO_CORPUS = REPO / "sieve" / "demo_corpus.jsonl"


def data_dir(name: str) -> Path:
    """The real BEIR folder; skips with a reason outside CI when it is absent (CI always has it)."""
    path = DATA / name
    if not (path / "corpus.jsonl").is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing in CI")
        pytest.skip(f"real data not found at {path}")
    return path


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """Embedding cache shared across sessions on this machine (keyed by model and corpus hash), so the SciFact
    encoding (minutes) is paid once per machine."""
    path = Path(os.environ.get("SIEVE_TEST_CACHE", Path.home() / ".cache" / "sieve-tests"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def ce_checkpoint(tmp_path_factory):
    """A local cross-encoder directory (packaged MiniLM body, seeded untrained head), as a user would point at."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from sieve.models.weights import default_model_path

    path = tmp_path_factory.mktemp("ce-checkpoint")
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_pretrained(str(default_model_path()), num_labels=1).save_pretrained(path)
    AutoTokenizer.from_pretrained(str(default_model_path())).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def biencoder():
    import torch  # heavy imports inside the fixture: tests that need no model start fast

    from sieve.models.text_encoder import EncoderLengths, TextEncoder
    from sieve.models.weights import default_model_path

    torch.manual_seed(0)
    return TextEncoder.from_pretrained(default_model_path(), name="all-MiniLM-L6-v2", lengths=EncoderLengths(64, 256))


def ordinary_passages(n: int = 100) -> list[str]:
    """n English passages of 300-500 characters (the demo corpus's texts run together, cut after a word)."""
    texts = [json.loads(line)["text"] for line in DEMO_CORPUS.open()]
    out = []
    for i in range(n):
        joined = " ".join(texts[(i + j) % len(texts)] for j in range(3))
        cut = joined[:300 + (i * 37) % 200]
        out.append(cut[:cut.rfind(" ")])
    assert all(290 <= len(p) <= 500 for p in out)
    return out
