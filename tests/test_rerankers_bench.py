"""benchmarks/rerankers.py end to end on a tiny BEIR folder with tiny random checkpoints (fake only at the models):
both modes write their JSON, every stage runs over the same candidates, and the numbers hang together."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.service.test_rerankers_http import checkpoints  # noqa: F401 (fixture: tiny cls+late and MixEncoder)
from tests.training.test_ce_train import tiny_beir  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def tiny_test_split(tiny_beir, tmp_path_factory):  # noqa: F811
    """The tiny folder with its dev judgements as the test split (the benchmark reads test)."""
    root = tmp_path_factory.mktemp("bench") / "tiny"
    shutil.copytree(tiny_beir, root)
    shutil.copy(root / "qrels" / "dev.tsv", root / "qrels" / "test.tsv")
    return root


def test_table_and_cross_domain_modes(tiny_test_split, checkpoints, cache_dir, tmp_path, monkeypatch):  # noqa: F811
    from benchmarks.rerankers import main

    monkeypatch.setenv("SIEVE_CACHE_DIR", str(tmp_path / "cache"))
    late, mix = str(checkpoints["late"]), str(checkpoints["mix"])
    doc = main(["table", "--data", str(tiny_test_split), "--ce", late, "--ce-late", late, "--mix", mix,
                "--depth", "8", "--wide", "16", "--out-dir", str(tmp_path)])
    rows = {r["stage"]: r for r in doc["rows"]}
    assert list(rows) == ["be@8", "be+cmc@8", "be+ce@8", "be+ce_late@8", "be+mix@8", "be+cmc@16", "be+mix@16"]
    assert json.loads((tmp_path / "rerankers_tiny.json").read_text())["rows"] == json.loads(json.dumps(doc["rows"]))
    # the same checkpoint as plain and as second cross-encoder ranks the same 8 candidates the same way
    assert rows["be+ce@8"]["ndcg@10"] == rows["be+ce_late@8"]["ndcg@10"]
    assert rows["be+cmc@8"]["ndcg@10"] == rows["be@8"]["ndcg@10"]  # the untrained CMC ranks as the bi-encoder
    assert rows["be+mix@8"]["extra_index_bytes"] == 30 * 32 * 4 and rows["be+ce@8"]["extra_index_bytes"] == 0
    assert all(0 <= r[m] <= 1 for r in rows.values() for m in ("ndcg@10", "mrr@10", "recall@10"))
    assert rows["be+mix@16"]["candidates"] == 16 and "mix" in rows["be+mix@16"]["stage_ms_p50"]
    cross = main(["cross-domain", "--data", str(tiny_test_split), "--ce", f"tiny={late}", "--ce-late", f"other={late}",
                  "--depth", "8", "--max-queries", "2", "--out-dir", str(tmp_path)])
    # heads are read from the checkpoints; a query sample the table did not use is measured, not reused
    assert [(r["head"], r["domain"], r["queries"]) for r in cross["rows"]] == [("cls+late", "in", 2), ("cls+late", "out", 2)]
    assert not any("from" in r for r in cross["rows"])
    assert cross["rows"][0]["ndcg@10"] == cross["rows"][1]["ndcg@10"]  # same checkpoint, same queries
    assert (tmp_path / "rerankers_cross_domain.json").is_file()
    # the same depth, queries and seed as the table: its rows are taken over, not measured twice
    reused = main(["cross-domain", "--data", str(tiny_test_split), "--ce", f"tiny={late}", "--depth", "8",
                   "--out-dir", str(tmp_path)])
    assert reused["rows"][0]["from"] == "rerankers_tiny.json"
    assert reused["rows"][0]["ndcg@10"] == rows["be+ce@8"]["ndcg@10"]
    with pytest.raises(SystemExit, match="TRAIN_DATASET=CHECKPOINT_DIR"):
        main(["cross-domain", "--data", str(tiny_test_split), "--ce", late])
