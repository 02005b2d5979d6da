"""The trained defaults in checkpoints/: what the settings resolve to, and that each shipped binary, loaded the way
the service loads it, reproduces the reference scores recorded when it was shipped (checkpoints/reference.py)."""
from __future__ import annotations

import json

import checkpoints
from checkpoints.reference import cmc_reference, max_abs_diff
from models.cmc_checkpoint import load_cmc, untrained_cmc
from service.config import Settings


def test_settings_resolve_the_shipped_defaults(tmp_path):
    assert Settings().resolved_cmc_path() == checkpoints.CMC
    assert Settings(cmc_path="untrained").resolved_cmc_path() is None
    assert Settings(cmc_path=tmp_path).resolved_cmc_path() == tmp_path
    assert Settings(cross_encoder_enabled=False, cross_encoder_path=tmp_path).resolved_cross_encoder_path() is None
    assert Settings(cross_encoder_path=tmp_path).resolved_cross_encoder_path() == tmp_path


def test_shipped_cmc_reproduces_its_reference_scores(biencoder):
    assert checkpoints.shipped(checkpoints.CMC), "checkpoints/cmc is missing"
    bundle = load_cmc(checkpoints.CMC, biencoder)
    assert bundle.query_tower is biencoder  # layers regime: the towers are the packaged bi-encoder itself
    recorded = json.loads((checkpoints.CMC / "reference.json").read_text())
    assert max_abs_diff(cmc_reference(biencoder, bundle), recorded) < 1e-3
    card = (checkpoints.CMC / "model_card.md").read_text()
    assert "sieve train cmc" in card and "nDCG@10" in card  # data, command, commit and metrics beside the weights
    size_mb = (checkpoints.CMC / "cmc.safetensors").stat().st_size / 2**20
    assert size_mb < 50


def test_shipped_cmc_is_not_the_identity(biencoder):
    """A trained CMC reorders candidates: its reference scores are far from the untrained (identity) CMC's."""
    recorded = json.loads((checkpoints.CMC / "reference.json").read_text())
    assert max_abs_diff(cmc_reference(biencoder, untrained_cmc(biencoder, share_query_tower=True)), recorded) > 0.1
