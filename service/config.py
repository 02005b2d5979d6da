"""The one settings object. Every field is read from the environment with the SIEVE_ prefix (SIEVE_INDEX_DIR, ...)
and documented in README.md; it is built once at start-up and handed to whatever needs it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SIEVE_", extra="ignore")

    # where things are
    index_dir: Path = Field(Path("demo-index"), description="Index directory built by `sieve index build`.")
    cache_dir: Path = Field(Path.home() / ".cache" / "sieve", description="Embedding cache (keyed by model and corpus hash).")
    # bi-encoder
    model_path: Path | None = Field(None, description="Local HF checkpoint of the bi-encoder; unset = packaged all-MiniLM-L6-v2.")
    model_name: str = Field("all-MiniLM-L6-v2", description="Name recorded in the index manifest.")
    query_max_length: int = Field(64, ge=8, le=512, description="Query tokens for the bi-encoder and CMC query tower.")
    doc_max_length: int = Field(256, ge=16, le=512, description="Document tokens (title + text) when encoding.")
    query_overflow: Literal["truncate", "reject"] = Field("truncate", description="Over-long queries: cut to query_max_length, or answer 413.")
    encode_batch_size: int = Field(32, ge=1, le=1024)
    # CMC
    cmc_enabled: bool = Field(True, description="Load a CMC stage.")
    cmc_path: Path | None = Field(None, description="CMC checkpoint directory; unset = untrained CMC (ranks as the bi-encoder).")
    # cross-encoder
    cross_encoder_path: Path | None = Field(None, description="Local HF sequence-classification checkpoint; unset = CE stage off.")
    ce_query_max_length: int = Field(64, ge=8, le=512)
    ce_max_length: int = Field(512, ge=16, le=4096)
    ce_batch_size: int = Field(16, ge=1, le=1024)
    # request limits
    max_top_k: int = Field(1000, ge=1)
    max_retrieve_k: int = Field(16384, ge=1)
    rerank_max_documents: int = Field(1000, ge=1)
    # compute
    device: str = Field("auto", description="'auto' (CUDA when present), 'cpu' or 'cuda[:N]'.")
    torch_threads: int | None = Field(None, ge=1, description="Intra-op threads; unset = torch's default.")
    faiss_gpu: bool = Field(True, description="Move the FAISS index to the GPU when one is present (faiss-gpu).")
    nprobe: int = Field(16, ge=1, description="IVF cells probed per query.")
    ef_search: int = Field(128, ge=1, description="HNSW efSearch.")
    # server
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    log_level: str = "info"

    @field_validator("model_path", "cmc_path", "cross_encoder_path", mode="before")
    @classmethod
    def empty_is_unset(cls, value):
        return None if value == "" else value

    def resolved_model_path(self) -> Path:
        from models.weights import default_model_path

        return self.model_path or default_model_path()
