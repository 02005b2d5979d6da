from __future__ import annotations

import json
from pathlib import Path

import pytest

from sieve.index import (FORMAT_VERSION, IndexFormatError, IndexMismatchError, IndexNotFoundError,
                   Manifest, SearchIndex, check_manifest)
from sieve.index.layout import current_version_dir


def _manifest(**overrides) -> Manifest:
    fields = dict(format_version=FORMAT_VERSION, model_name="mini", model_hash="ab" * 32,
                  dim=384, count=10, dtype="float32", faiss_kind="ivf",
                  faiss_params={"nlist": 4}, corpus_hash="cd" * 32,
                  created="2024-01-01T00:00:00+00:00", version=3,
                  stores={"cmc": {"model_name": "m", "model_hash": "h", "dim": 8}})
    return Manifest(**{**fields, **overrides})


def test_json_round_trip() -> None:
    m = _manifest()
    assert Manifest.from_json(m.to_json()) == m


def test_check_manifest_accepts_match_and_skips_none() -> None:
    m = _manifest()
    check_manifest(m, "mini", "ab" * 32, 384)
    check_manifest(m, None, None, None)


def test_mismatch_message_names_every_differing_field() -> None:
    with pytest.raises(IndexMismatchError) as exc:
        check_manifest(_manifest(), "other", "ef" * 32, 384, index_dir="/srv/idx")
    msg = str(exc.value)
    assert "index at /srv/idx was built with model 'mini'" in msg
    assert "configured with 'other'" in msg
    assert "differing: model_name, model_hash;" in msg
    assert "dim" not in msg.split("differing:")[1].split(";")[0]
    assert "sieve index build" in msg and "SIEVE_MODEL_PATH" in msg


def test_mismatch_on_dim_only() -> None:
    with pytest.raises(IndexMismatchError, match=r"differing: dim;"):
        check_manifest(_manifest(), "mini", "ab" * 32, 768)


def test_unknown_format_version_refused() -> None:
    text = json.dumps({**json.loads(_manifest().to_json()), "format_version": 99})
    with pytest.raises(IndexFormatError, match="format_version 99.*reads only format_version 2"):
        Manifest.from_json(text)


def test_missing_fields_refused() -> None:
    data = json.loads(_manifest().to_json())
    del data["dim"]
    with pytest.raises(IndexFormatError, match="lacks field.*dim"):
        Manifest.from_json(json.dumps(data))


def test_load_refuses_future_format(built: Path) -> None:
    path = current_version_dir(built) / "manifest.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "format_version": 3}))
    with pytest.raises(IndexFormatError, match="format_version 3"):
        SearchIndex.load(built)


def test_load_checks_model(built: Path, encoder) -> None:
    SearchIndex.load(built, model_name=encoder.name, model_hash=encoder.weights_hash,
                     dim=encoder.dim).close()
    with pytest.raises(IndexMismatchError, match="differing: model_hash"):
        SearchIndex.load(built, model_name=encoder.name, model_hash="0" * 64)


def test_never_built_dir(tmp_path: Path) -> None:
    with pytest.raises(IndexNotFoundError, match="sieve index build --corpus .* --out"):
        SearchIndex.load(tmp_path / "nothing")
    assert issubclass(IndexNotFoundError, FileNotFoundError)
