"""The trained defaults in checkpoints/: what the settings resolve to, and that each shipped binary, loaded the way
the service loads it, reproduces the reference scores recorded when it was shipped (checkpoints/reference.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from sieve import checkpoints
from sieve.checkpoints.reference import ce_reference, cmc_reference, demo_documents, load_shipped_cross_encoder, max_abs_diff
from sieve.models.cmc_checkpoint import load_cmc, untrained_cmc
from sieve.service.config import Settings


def test_settings_resolve_the_shipped_defaults(tmp_path):
    assert Settings().resolved_cmc_path() == checkpoints.CMC
    assert Settings(cmc_path="untrained").resolved_cmc_path() is None
    assert Settings(cmc_path=tmp_path).resolved_cmc_path() == tmp_path
    assert Settings(cross_encoder_enabled=False, cross_encoder_path=tmp_path).resolved_cross_encoder_path() is None
    assert Settings(cross_encoder_path=tmp_path).resolved_cross_encoder_path() == tmp_path


@pytest.mark.parametrize("path", [checkpoints.CMC, checkpoints.CMC_LISTWISE], ids=["cmc-fusion", "cmc-listwise"])
def test_shipped_cmc_reproduces_its_reference_scores(biencoder, path):
    assert checkpoints.shipped(path), f"{path} is missing"
    bundle = load_cmc(path, biencoder)
    assert bundle.query_tower is biencoder  # towers from the packaged bi-encoder itself
    recorded = json.loads((path / "reference.json").read_text())
    assert max_abs_diff(cmc_reference(biencoder, bundle), recorded) < 1e-3
    card = (path / "model_card.md").read_text()
    assert "sieve train" in card and "nDCG@10" in card and "unseen" in card.lower()  # data, command, metrics
    size_mb = (path / "cmc.safetensors").stat().st_size / 2**20
    assert size_mb < 50


def test_shipped_cmcs_are_not_the_identity(biencoder):
    """Trained CMCs reorder candidates: the listwise one's scores are far from the untrained (identity) CMC's; the
    fusion one's are far from its untrained score, the prior -log(1 + position)."""
    recorded = json.loads((checkpoints.CMC_LISTWISE / "reference.json").read_text())
    assert max_abs_diff(cmc_reference(biencoder, untrained_cmc(biencoder, share_query_tower=True)), recorded) > 0.1
    fusion = json.loads((checkpoints.CMC / "reference.json").read_text())
    prior = -np.log1p(np.arange(len(fusion["doc_ids"])))
    assert np.abs(np.asarray(fusion["scores"]) - prior).max() > 0.1
    assert load_cmc(checkpoints.CMC, biencoder).config.evidence  # the default takes first-stage evidence


def test_shipped_cross_encoder_reproduces_its_reference_scores():
    assert checkpoints.shipped(checkpoints.CROSS_ENCODER), "checkpoints/cross-encoder is missing"
    assert Settings().resolved_cross_encoder_path() == checkpoints.CROSS_ENCODER
    recorded = json.loads((checkpoints.CROSS_ENCODER / "reference.json").read_text())
    assert max_abs_diff(ce_reference(load_shipped_cross_encoder()), recorded) < 1e-3
    card = (checkpoints.CROSS_ENCODER / "model_card.md").read_text()
    assert "sieve train ce" in card and "nDCG@10" in card
    size_mb = (checkpoints.CROSS_ENCODER / "model.safetensors").stat().st_size / 2**20
    assert size_mb < 50


def test_shipped_cross_encoder_is_not_the_bi_encoder(biencoder):
    """The gated cross-encoder starts as 20 x the bi-encoder's cosine; trained, its scores are far from that."""
    recorded = json.loads((checkpoints.CROSS_ENCODER / "reference.json").read_text())
    ids, texts = demo_documents()
    docs = biencoder.encode_documents([texts[ids.index(i)] for i in recorded["doc_ids"]], progress=False)
    cosines = biencoder.encode_queries(recorded["queries"]).float().cpu().numpy() @ docs.T  # (Q, N)
    assert max_abs_diff({**recorded, "scores": (20.0 * cosines).tolist()}, recorded) > 0.5
