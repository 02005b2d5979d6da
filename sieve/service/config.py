"""The one settings object. Every field is read from the environment with the SIEVE_ prefix (SIEVE_INDEX_DIR, ...)
and documented in README.md; it is built once at start-up and handed to whatever needs it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

UNTRAINED = "untrained"  # SIEVE_CMC_PATH value: the identity CMC instead of a checkpoint
SHIPPED = "shipped:"  # SIEVE_*_PATH prefix: a checkpoint shipped in the package, e.g. shipped:cmc


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
    # lexical first stage (BM25 inside each index version) and hybrid fusion
    lexical_enabled: bool = Field(True, description="`sieve index build` / `sieve demo` / `sieve eval` give the index a BM25 part (retriever bm25 and hybrid).")
    lexical_language: str = Field("english", description="BM25 analyzer: stop words and PyStemmer stemmer of this language; 'none' = lower-cased tokens only.")
    hybrid_depth: int = Field(100, ge=1, description="Hybrid retriever: the top N of the bi-encoder and of BM25 that are fused.")
    rrf_k: float = Field(60.0, gt=0, description="Reciprocal-rank fusion constant: each list adds weight / (rrf_k + rank).")
    hybrid_weight_be: float = Field(1.0, ge=0, description="Weight of the bi-encoder list in the fusion.")
    hybrid_weight_bm25: float = Field(1.0, ge=0, description="Weight of the BM25 list in the fusion.")
    # the pipeline a /search gets for the fields it leaves unset (chosen on the transfer report, RESULTS.md)
    default_rerank: Literal["cmc", "mix", "none"] = Field("cmc", description="/search `rerank` when unset.")
    default_cross_encoder: bool = Field(False, description="/search `cross_encoder` when unset: on only if this is true and a cross-encoder is loaded.")
    # CMC
    cmc_enabled: bool = Field(True, description="Load a CMC stage.")
    cmc_path: Path | None = Field(None, description="CMC checkpoint directory; unset = the trained default shipped as shipped:cmc-fusion (the paper-style one: shipped:cmc); 'untrained' = identity CMC (ranks as the bi-encoder).")
    # cross-encoder
    cross_encoder_enabled: bool = Field(True, description="Load a cross-encoder stage.")
    cross_encoder_path: Path | None = Field(None, description="Local HF sequence-classification checkpoint; unset = the trained default shipped as shipped:cross-encoder (CE stage off when none is shipped).")
    ce_query_max_length: int | None = Field(None, ge=8, le=512, description="Query tokens of a pair; unset = what the checkpoint was trained with (its sieve_head.json), else 64.")
    ce_max_length: int | None = Field(None, ge=16, le=4096, description="Pair tokens; unset = what the checkpoint was trained with (its sieve_head.json), else 512.")
    ce_batch_size: int = Field(16, ge=1, le=1024, description="Pairs per cross-encoder forward pass in offline scoring (`sieve eval`, training, annCUR builds); serving packs pairs by SIEVE_CE_BATCH_TOKENS.")
    # more rerankers: a second, late-interaction cross-encoder and the MixEncoder
    late_ce_path: Path | None = Field(None, description="A second cross-encoder (`sieve train ce --head cls+late`), picked by ce_model=ce_late; unset = off.")
    mix_path: Path | None = Field(None, description="MixEncoder checkpoint (`sieve train mix`); the index must hold its 'mix' store; unset = off.")
    # annCUR: retrieval with the cross-encoder itself (`retriever: "anncur"`)
    anncur_dir: Path | None = Field(None, description="annCUR index built by `sieve index anncur` over SIEVE_INDEX_DIR; unset = annCUR off.")
    anncur_cross_encoder_path: Path | None = Field(None, description="The cross-encoder that built the annCUR index; unset = SIEVE_CROSS_ENCODER_PATH.")
    # request limits
    max_top_k: int = Field(1000, ge=1)
    max_retrieve_k: int = Field(16384, ge=1)
    rerank_max_documents: int = Field(1000, ge=1)
    rerank_max_tokens: int = Field(262_144, ge=1, description="Most tokens one /rerank may give its model to read (each text to encode or score counted as min(characters + 2, the model's truncation length)); more = 413.")
    # compute
    device: str = Field("auto", description="'auto' (CUDA when present), 'cpu' or 'cuda[:N]'.")
    precision: Literal["auto", "fp32"] = Field("auto", description="auto: bi-encoder query tower, CMC and cross-encoder run in the lowest precision the device has and that keeps rankings (bf16 with AVX-512 BF16/AMX, int8 linear layers with VNNI, fp16 on CUDA; see docs/performance.md and /readyz); fp32: everything in fp32.")
    torch_threads: int | None = Field(None, ge=1, description="Intra-op threads; unset = torch's default.")
    faiss_gpu: bool = Field(True, description="Move the FAISS index to the GPU when one is present (faiss-gpu).")
    nprobe: int = Field(16, ge=1, description="IVF cells probed per query.")
    ef_search: int = Field(128, ge=1, description="HNSW efSearch.")
    # throughput: micro-batching across concurrent requests (one worker thread per model)
    batching: bool = Field(True, description="Batch model work across concurrent requests; false = one forward pass per request.")
    batch_max_size: int = Field(32, ge=1, le=1024, description="Most requests in one batch.")
    batch_max_wait_ms: float = Field(2.0, ge=0, le=1000, description="Extra wait for more requests after the first one of a batch.")
    cmc_batch_candidates: int = Field(16384, ge=1, description="CMC: queries x longest candidate list per forward pass.")
    ce_batch_tokens: int = Field(8192, ge=16, description="Cross-encoder: pairs x longest pair (tokens) per forward pass.")
    # deadlines
    default_timeout_ms: int | None = Field(None, ge=1, description="Budget of a request that gives no timeout_ms; unset = none.")
    stage_budgets_ms: dict[str, float] = Field(default_factory=dict, description='Per-stage budgets, JSON: {"cmc": 200, "ce": 1000}.')
    # cache
    cache_enabled: bool = Field(True, description="Cache query embeddings and /search results.")
    cache_size: int = Field(10000, ge=1, description="Entries of the in-process LRU (used when SIEVE_REDIS_URL is unset).")
    cache_ttl_s: int = Field(3600, ge=1, description="Time to live of a cache entry.")
    redis_url: str | None = Field(None, description="redis://host:port/db: cache and rate limits in Redis; unset = in-process.")
    redis_prefix: str = Field("sieve:", description="Prefix of every Redis key this server writes.")
    redis_timeout_ms: int = Field(50, ge=1, description="Redis connect and read timeout; slower = served without Redis.")
    redis_retry_s: float = Field(5.0, ge=0, description="After a Redis failure, how long to go without it before trying again.")
    # protection
    api_keys: SecretStr | None = Field(None, description="Comma-separated API keys; set = Bearer key required (never logged).")
    api_keys_file: Path | None = Field(None, description="File with one API key per line (added to SIEVE_API_KEYS).")
    rate_limit_per_s: float | None = Field(None, gt=0, description="Requests per second per API key (or client address); unset = no limit.")
    rate_limit_burst: int = Field(20, ge=1, description="Token-bucket size: requests a key may send at once.")
    max_inflight: int = Field(64, ge=1, description="Requests in progress at once (counted once the body is read); past it, 429 at once.")
    header_timeout_s: float = Field(10.0, gt=0, description="Time to receive a request's line and headers; slower = connection closed.")
    body_timeout_s: float = Field(30.0, gt=0, description="Time to receive a request body; slower = 408 and the connection closed.")
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Largest request body; larger = 413.")
    max_header_bytes: int = Field(64 * 1024, ge=4096, description="Largest request line + headers; larger = 400 and the connection closed.")
    # live index updates
    documents_max_batch: int = Field(1000, ge=1, description="Most documents in one POST /documents.")
    write_batch_wait_ms: float = Field(20.0, ge=0, le=10000, description="Group commit: wait this long for more writes before one new version.")
    index_poll_s: float = Field(0, ge=0, description="Reload when another writer published a newer version, checked this often; 0 = only on POST /admin/index/reload.")
    # server
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    log_level: str = "info"

    @field_validator("model_path", "cmc_path", "cross_encoder_path", "late_ce_path", "mix_path", "ce_query_max_length", "ce_max_length", "anncur_dir", "anncur_cross_encoder_path",
                     "redis_url", "api_keys", "api_keys_file", "default_timeout_ms", "rate_limit_per_s", mode="before")
    @classmethod
    def empty_is_unset(cls, value):
        return None if value == "" else value

    @field_validator("cmc_path", "cross_encoder_path", "late_ce_path", "mix_path", "anncur_cross_encoder_path", mode="after")
    @classmethod
    def shipped_name(cls, value):
        """`shipped:NAME` = the checkpoint NAME shipped inside the installed package (sieve/checkpoints/NAME)."""
        if value is None or not str(value).startswith(SHIPPED):
            return value
        from sieve import checkpoints

        path = checkpoints.ROOT / str(value)[len(SHIPPED):]
        if checkpoints.shipped(path) is None:
            raise ValueError(f"{value}: no such shipped checkpoint (have: {', '.join(checkpoints.names())})")
        return path

    def resolved_model_path(self) -> Path:
        from sieve.models.weights import default_model_path

        return self.model_path or default_model_path()

    def resolved_cmc_path(self) -> Path | None:
        """The CMC checkpoint to load: the configured one, else the shipped default; None = the untrained CMC."""
        from sieve import checkpoints

        if self.cmc_path is not None:
            return None if str(self.cmc_path) == UNTRAINED else self.cmc_path
        return checkpoints.shipped(checkpoints.CMC)

    def resolved_cross_encoder_path(self) -> Path | None:
        """The cross-encoder to load: the configured one, else the shipped default; None = no CE stage."""
        from sieve import checkpoints

        if not self.cross_encoder_enabled:
            return None
        return self.cross_encoder_path or checkpoints.shipped(checkpoints.CROSS_ENCODER)

    def ce_lengths(self, path: Path) -> "PairLengths":
        """Pair lengths for the cross-encoder at `path`: the settings where set, else the lengths it was trained
        with (sieve_head.json, written by `sieve train ce`), else 64 / 512."""
        from sieve.models.ce_heads import trained_lengths
        from sieve.models.cross_encoder import PairLengths

        trained = trained_lengths(path)
        return PairLengths(self.ce_query_max_length or trained.query_max_length,
                           self.ce_max_length or trained.max_length)

    def lexical_config(self) -> "LexicalConfig | None":
        """What a new index's BM25 part is built with; None = no lexical part."""
        from sieve.index.lexical import LexicalConfig

        return LexicalConfig(language=self.lexical_language) if self.lexical_enabled else None

    def keys(self) -> set[str]:
        """Every accepted API key (settings and file); empty = no authentication."""
        keys = set((self.api_keys.get_secret_value() if self.api_keys else "").split(","))
        if self.api_keys_file:
            keys |= set(self.api_keys_file.read_text(encoding="utf-8").splitlines())
        return {k.strip() for k in keys if k.strip()}
