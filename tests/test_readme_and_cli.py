"""Docs stay true: docs/configuration.md is the settings' own descriptions, every relative link resolves, README's two
set-up commands are the ones CI runs; the CLI builds, edits and refuses indexes with clear messages."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "sieve" / "demo_corpus.jsonl"


def test_configuration_doc_is_generated_from_the_settings():
    from sieve.service import settings_doc

    sections = settings_doc.settings_sections()
    undescribed = [f"{cls.__name__}.{name}" for _, cls in sections for name, info in cls.model_fields.items()
                   if not (info.description or "").strip()]
    assert not undescribed, f"settings without a description= (docs/configuration.md is made of them): {undescribed}"
    committed = (REPO / "docs" / "configuration.md").read_text()
    assert committed == settings_doc.render(sections), \
        f"docs/configuration.md is out of date; regenerate it: {settings_doc.REGENERATE}"


def test_sieve_settings_markdown_prints_the_configuration_doc():
    out = sieve("settings", "--markdown")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (REPO / "docs" / "configuration.md").read_text()


MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_every_relative_link_in_the_docs_points_to_a_file():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in MARKDOWN_LINK.findall(page.read_text()):
            path = target.split("#", 1)[0]
            if not path or re.match(r"^[a-z][a-z0-9+.-]*:", path):  # same-page anchor, http:, mailto:
                continue
            resolved = (page.parent / path).resolve()
            if not resolved.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert len(pages) > 1 and not broken, f"links to files that do not exist: {broken}"


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    test_command = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"
    assert test_command in readme and test_command in ci
    assert "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/sieve demo" in readme


def sieve(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "sieve.cli", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def test_cli_build_tokenizes_bm25_in_other_processes_to_the_same_scores(tmp_path, cache_dir):
    """`--lexical-processes 2`: the BM25 part tokenized in two spawned processes while the documents are encoded
    (from `python -m sieve.cli`, as `sieve` runs), and every query term scores every document as with one."""
    from sieve.index import SearchIndex

    env = {"SIEVE_CACHE_DIR": str(cache_dir)}
    for name, processes in (("one", "1"), ("two", "2")):
        out = sieve("index", "build", "--corpus", str(DEMO), "--out", str(tmp_path / name), "--faiss", "flat",
                    "--lexical-processes", processes, env=env)
        assert out.returncode == 0, out.stderr
    one, two = SearchIndex.load(tmp_path / "one"), SearchIndex.load(tmp_path / "two")
    for query in ("bread baking oven", "the planets of the solar system", "green tea"):
        assert np.array_equal(one.lexical_scores(query), two.lexical_scores(query)), query
        assert one.lexical_scores(query).any(), query


def test_cli_build_add_delete(tmp_path, cache_dir):
    env = {"SIEVE_CACHE_DIR": str(cache_dir)}
    out = sieve("index", "build", "--corpus", str(DEMO), "--out", str(tmp_path / "idx"), "--faiss", "hnsw", env=env)
    assert out.returncode == 0, out.stderr
    built = json.loads(out.stdout.splitlines()[-1])
    assert built["count"] == 60 and set(built["seconds"]) == {"encode", "lexical_wait", "write"}
    assert built["document_precision"] == "fp32"  # the suite's SIEVE_PRECISION (tests/conftest.py)
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps({"_id": "new-1", "title": "Tea", "text": "Green tea is steamed."}) + "\n")
    added = sieve("index", "add", "--index", str(tmp_path / "idx"), "--corpus", str(extra), env=env)
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout.splitlines()[-1]) == {"index": str(tmp_path / "idx"), "count": 61, "version": 2}
    gone = sieve("index", "delete", "--index", str(tmp_path / "idx"), "new-1", "astro-1")
    assert json.loads(gone.stdout.splitlines()[-1])["count"] == 59
    missing = sieve("index", "delete", "--index", str(tmp_path / "idx"), "no-such-id")
    assert missing.returncode != 0 and "no-such-id" in missing.stderr and "Traceback" not in missing.stderr


def test_serve_refuses_an_index_built_with_another_model(tmp_path, cache_dir):
    built = sieve("index", "build", "--corpus", str(DEMO), "--out", str(tmp_path / "idx"),
                  env={"SIEVE_CACHE_DIR": str(cache_dir)})
    assert built.returncode == 0, built.stderr
    out = sieve("serve", "--index", str(tmp_path / "idx"), "--port", "1", env={"SIEVE_MODEL_NAME": "another-model"})
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "another-model" in out.stderr and "all-MiniLM-L6-v2" in out.stderr


def test_serve_without_an_index_says_how_to_build_one(tmp_path):
    out = sieve("serve", "--index", str(tmp_path / "nothing"), "--port", "1")
    assert out.returncode != 0 and "sieve index build" in out.stderr and "Traceback" not in out.stderr


def test_cli_keeps_the_cross_encoders_token_ids(tmp_path, cache_dir):
    """`--ce-tokens`: built with the index, needed by `add` once the index holds them, refused on float16."""
    env = {"SIEVE_CACHE_DIR": str(cache_dir)}
    out = sieve("index", "build", "--corpus", str(DEMO), "--out", str(tmp_path / "idx"), "--ce-tokens", env=env)
    assert out.returncode == 0, out.stderr
    manifest = json.loads(next((tmp_path / "idx" / "versions").glob("v*/manifest.json")).read_text())
    assert manifest["stores"]["ce_tokens"]["model_name"] == "ce-tokens:cross-encoder"
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps({"_id": "new-1", "title": "Tea", "text": "Green tea is steamed."}) + "\n")
    without = sieve("index", "add", "--index", str(tmp_path / "idx"), "--corpus", str(extra), env=env)
    assert without.returncode != 0 and "ce_tokens" in without.stderr and "Traceback" not in without.stderr
    added = sieve("index", "add", "--index", str(tmp_path / "idx"), "--corpus", str(extra), "--ce-tokens", env=env)
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout.splitlines()[-1])["count"] == 61
    half = sieve("index", "build", "--corpus", str(DEMO), "--out", str(tmp_path / "half"), "--dtype", "float16",
                 "--ce-tokens", env=env)
    assert half.returncode != 0 and "float32" in half.stderr and "Traceback" not in half.stderr


def test_eval_pipelines_are_read_against_the_stage_registry(tmp_path):
    """`sieve eval --pipelines` in a fresh process: the registry is loaded before the names are checked (a bare
    `--pipelines be` was once refused: "'be' is not a retriever ()")."""
    wrong = sieve("eval", "--data", str(tmp_path), "--pipelines", "be,colbert")
    assert wrong.returncode == 2 and "'colbert' is not a retriever (" in wrong.stderr, wrong.stderr
    assert "be, bm25, hybrid" in wrong.stderr, wrong.stderr
    right = sieve("eval", "--data", str(tmp_path / "nowhere"), "--pipelines", "be,hybrid+cmc,anncur")
    assert "is not a retriever" not in right.stderr, right.stderr  # parsed; it fails later, on the missing data
    assert right.returncode != 0 and "nowhere" in right.stderr, right.stderr
