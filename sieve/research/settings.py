"""The research stages' own settings (env prefix SIEVE_, like the service's), listed in docs/configuration.md."""
from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ResearchSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SIEVE_", extra="ignore")

    @field_validator("*", mode="before")
    @classmethod
    def empty_is_unset(cls, value):
        return None if value == "" else value


class MixSettings(ResearchSettings):
    mix_path: Path | None = Field(None, description="MixEncoder checkpoint (`sieve train mix`); the index must hold its 'mix' store (`sieve index add-store --mix-checkpoint`); unset = off.")


class LateCrossEncoderSettings(ResearchSettings):
    late_ce_path: Path | None = Field(None, description="A second cross-encoder, normally a `sieve train ce --head gated+late` (or cls+late) checkpoint, picked per request with ce_model=ce_late; unset = off.")


class AnnCURSettings(ResearchSettings):
    anncur_dir: Path | None = Field(None, description="annCUR index built by `sieve index anncur` over SIEVE_INDEX_DIR; unset = annCUR off.")
    anncur_cross_encoder_path: Path | None = Field(None, description="The cross-encoder that built the annCUR index (its pair lengths are taken from the index); unset = SIEVE_CROSS_ENCODER_PATH.")
