"""The one settings object. Every field is read from the environment with the SIEVE_ prefix (SIEVE_INDEX_DIR, ...)
and documented in docs/configuration.md (generated from the descriptions below by sieve/service/settings_doc.py);
it is built once at start-up and handed to whatever needs it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

UNTRAINED = "untrained"  # SIEVE_CMC_PATH value: the identity CMC instead of a checkpoint
SHIPPED = "shipped:"  # SIEVE_*_PATH prefix: a checkpoint shipped in the package, e.g. shipped:cmc


# /rerank's work cap on 2 CPU cores: the one place its default lives (a device-aware default can start from it)
RERANK_MAX_TOKENS_CPU = 16_384
WORKERS_POLL_S = 2.0  # with several workers and SIEVE_INDEX_POLL_S=0: how often each looks for a new CMC or click memory


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SIEVE_", extra="allow")  # allow: a stage's own settings (Settings(mix_path=...))

    # where things are
    index_dir: Path = Field(Path("demo-index"), description="Index directory built by `sieve index build`.")
    # the index on a Qdrant collection instead (sieve/index/qdrant_backend.py, docs/index.md "Qdrant")
    index_backend: Literal["local", "qdrant", "qdrant-edge"] = Field("local", description="Where the index lives: `local` (SIEVE_INDEX_DIR, the segmented index on this machine), `qdrant` (a collection built with `sieve index build --backend qdrant` on SIEVE_QDRANT_URL; first stages, documents and writes go to Qdrant) or `qdrant-edge` (the same collection as Qdrant shards in this process, qdrant-edge-py, under SIEVE_QDRANT_EDGE_PATH; one process per directory).")
    qdrant_url: str = Field(":memory:", description="SIEVE_INDEX_BACKEND=qdrant: the Qdrant server (http(s)://host:6333), or the client's local mode: a directory, or :memory: (empty at every start; tests).")
    qdrant_edge_path: Path = Field(Path("qdrant-edge"), description="SIEVE_INDEX_BACKEND=qdrant-edge: the directory holding the collection's shards (COLLECTION and COLLECTION__sieve), built with `sieve index build --backend qdrant-edge`.")
    qdrant_collection: str = Field("sieve", min_length=1, max_length=200, description="The Qdrant collection (its metadata lives in COLLECTION__sieve).")
    qdrant_api_key: SecretStr | None = Field(None, description="API key sent to SIEVE_QDRANT_URL (never logged).")
    qdrant_timeout_ms: int = Field(2000, ge=1, description="Longest one call to a Qdrant server may take; a call that fails or takes longer answers 503 (a search makes one to three calls). Local mode and qdrant-edge run in process, without a timeout.")
    qdrant_reopen_ms: int = Field(500, ge=1, description="A Qdrant that could not be opened (a local-mode folder or edge shard held by another process, not built yet) is tried again on a later request, at most once per this many ms; requests in between answer 503 at once.")
    qdrant_prefer_grpc: bool = Field(False, description="Talk gRPC (port 6334) instead of REST to SIEVE_QDRANT_URL.")
    qdrant_hnsw_ef: int | None = Field(None, ge=1, description="HNSW beam width of Qdrant's dense search (a server, qdrant-edge); unset = the collection's own (recall vs latency, docs/index.md).")
    qdrant_exact: bool = Field(False, description="Qdrant searches dense vectors exhaustively (recall 1, slower on large collections).")
    qdrant_shards: int = Field(1, ge=1, description="`sieve index build --backend qdrant`: shards of the new collection (a cluster spreads them over its nodes).")
    qdrant_replicas: int = Field(1, ge=1, description="`sieve index build --backend qdrant`: copies of each shard.")
    qdrant_write_consistency: int = Field(1, ge=1, description="`sieve index build --backend qdrant`: replicas that must confirm a write before Qdrant acknowledges it.")
    cache_dir: Path = Field(Path.home() / ".cache" / "sieve", description="Embedding cache, keyed by model weights, max length and corpus hash.")
    # bi-encoder
    model_path: Path | None = Field(None, description="Local HF checkpoint of the bi-encoder; unset = packaged all-MiniLM-L6-v2.")
    model_name: str = Field("all-MiniLM-L6-v2", description="Model name recorded in (and checked against) the index manifest.")
    query_max_length: int = Field(64, ge=8, le=512, description="Query tokens for the bi-encoder and CMC query tower.")
    doc_max_length: int = Field(256, ge=16, le=512, description="Document tokens (title + text) when encoding.")
    query_overflow: Literal["truncate", "reject"] = Field("truncate", description="Over-long queries: `truncate` to SIEVE_QUERY_MAX_LENGTH (and say so in `warnings`) or `reject` (413).")
    encode_batch_size: int = Field(32, ge=1, le=1024, description="Texts per forward pass when the bi-encoder (or the MixEncoder) encodes documents.")
    # lexical first stage (BM25 inside each index version) and hybrid fusion
    lexical_enabled: bool = Field(True, description="`sieve index build` / `sieve demo` / `sieve eval` give the index a BM25 part (retriever bm25 and hybrid).")
    lexical_language: str = Field("english", description="BM25 analyzer: stop words and PyStemmer stemmer of this language; 'none' = lower-cased tokens only.")
    hybrid_depth: int | None = Field(None, ge=1, description="Hybrid retriever: the top N of the bi-encoder and of BM25 that are fused; unset = the request's retrieve_k (default 512), so CMC compares the top retrieve_k of the fused list (100 was the default before the adapted CMC).")
    rrf_k: float = Field(60.0, gt=0, description="Reciprocal-rank fusion constant: each list adds weight / (rrf_k + rank).")
    hybrid_weight_be: float = Field(1.0, ge=0, description="Weight of the bi-encoder list in the fusion.")
    hybrid_weight_bm25: float = Field(1.0, ge=0, description="Weight of the BM25 list in the fusion.")
    # the pipeline a /search gets for the fields it leaves unset (chosen on the transfer report, RESULTS.md)
    default_rerank: str = Field("cmc", description="/search `rerank` when the request leaves it unset: cmc, none or another registered reranker (checked at start-up).")
    default_cross_encoder: bool = Field(False, description="/search `cross_encoder` when unset: on only if this is true and a cross-encoder is loaded.")
    # CMC
    cmc_enabled: bool = Field(True, description="Load a CMC stage.")
    cmc_path: Path | None = Field(None, description="CMC checkpoint directory; set, it is served (it must fit the bi-encoder) and the index's adapted CMC is not. Unset = the served index's adapted CMC (`sieve adapt`: kept in SIEVE_INDEX_DIR/adapted, or inside the Qdrant collection with SIEVE_INDEX_BACKEND=qdrant / qdrant-edge; a newly published one is swapped in live), else the trained default shipped as shipped:cmc-fusion (the paper-style one: shipped:cmc), made for the packaged bi-encoder; one that does not fit the bi-encoder (another SIEVE_MODEL_PATH) is passed over with a warning in the log, down to the untrained CMC. 'untrained' = identity CMC (ranks as the bi-encoder).")
    # cross-encoder
    cross_encoder_enabled: bool = Field(True, description="Load a cross-encoder stage; false = CE stage off (`cross_encoder: true` then answers 400).")
    cross_encoder_path: Path | None = Field(None, description="Local HF sequence-classification checkpoint (or one of the heads in sieve/models/ce_heads.py); unset = the trained default shipped as shipped:cross-encoder (head gated; CE stage off when none is shipped).")
    ce_query_max_length: int | None = Field(None, ge=8, le=512, description="Query tokens of a pair; unset = what the checkpoint was trained with (its sieve_head.json), else 64.")
    ce_max_length: int | None = Field(None, ge=16, le=4096, description="Pair tokens; unset = what the checkpoint was trained with (its sieve_head.json), else 512.")
    ce_batch_size: int = Field(16, ge=1, le=1024, description="Pairs per cross-encoder forward pass outside serving (training, distillation teachers, annCUR scoring); serving packs pairs by SIEVE_CE_BATCH_TOKENS.")
    # the research stages (annCUR, MixEncoder, late-interaction cross-encoder) have their own settings classes in
    # sieve/research/settings.py; every stage's settings are listed in docs/configuration.md
    # the cross-encoder stage on another server (pipeline/remote_ce.py, docs/remote-cross-encoder.md)
    ce_url: str | None = Field(None, description="Rerank endpoint of a remote cross-encoder (TEI, infinity, Cohere-compatible, another Sieve); set = the \"ce\" stage calls it and no in-process cross-encoder is loaded; a URL without a path gets the shape's usual one.")
    ce_shape: Literal["cohere", "tei", "sieve"] = Field("sieve", description="Request/answer format of SIEVE_CE_URL: cohere (v2 rerank; infinity too), tei (Hugging Face TEI /rerank), sieve (another Sieve's /rerank).")
    ce_model_name: str = Field("ce", description="The `model` sent to a cohere- or sieve-shaped SIEVE_CE_URL (e.g. rerank-v3.5, the model id infinity serves, ce).")
    ce_api_key: SecretStr | None = Field(None, description="Bearer key sent to SIEVE_CE_URL (never logged).")
    ce_timeout_ms: int = Field(10_000, ge=1, description="Longest a remote cross-encoder call may take when the request has no deadline (with one: what is left of it).")
    ce_retries: int = Field(2, ge=0, le=10, description="Retries of a failed remote call (connection error, 429, 5xx), each only while time remains.")
    ce_retry_backoff_ms: float = Field(50.0, ge=0, description="Wait before the first retry; doubled for each next one (with jitter).")
    ce_breaker_failures: int = Field(5, ge=1, description="Failed remote calls in a row that open the circuit breaker (calls then skip the stage at once).")
    ce_breaker_open_s: float = Field(10.0, ge=0, description="How long the breaker stays open before one probe call is let through.")
    # request limits
    max_top_k: int = Field(1000, ge=1, description="Largest `top_k` a /search may ask for; more = 422.")
    max_retrieve_k: int = Field(16384, ge=1, description="Largest `retrieve_k` a /search may ask for; more = 422.")
    rerank_max_documents: int = Field(1000, ge=1, description="Most documents in one /rerank or /v2/rerank request; more = 422.")
    rerank_max_tokens: int = Field(RERANK_MAX_TOKENS_CPU, ge=1, description="Most tokens one /rerank or /v2/rerank may give its model to read, counted as the model reads them (the tokenizer's count of each text to encode, or each (query, document) pair to score, up to the model's truncation length; texts under the cap by the bound characters + 2 are not tokenized); more = 413 before any work. The default fits 100 passages of 300-500 characters (SciFact abstracts cut there: 8,766 tokens, about 11,000 as cross-encoder pairs) and is what CMC's candidate tower reads within the default deadline on 2 CPU cores (benchmarks/results/rerank_cap.json). Unset on a faster device (CUDA), it is scaled with the deadline by the device's speed-up (SIEVE_DEVICE_SPEEDUP; /readyz `limits` shows the value in force); a value set here is kept as set.")
    # compute
    device: str = Field("auto", description="'auto' (CUDA when present), 'cpu' or 'cuda[:N]'; chosen once at start-up.")
    precision: Literal["auto", "fp32"] = Field("auto", description="auto: bi-encoder query tower, CMC and cross-encoder run in the lowest precision the device has and that keeps rankings (bf16 with AVX-512 BF16 on AMD or AMX on Intel, int8 linear layers with VNNI, fp16 on CUDA; see docs/performance.md and /readyz); fp32: everything in fp32.")
    doc_precision: Literal["auto", "fp32"] = Field("auto", description="auto: the bi-encoder encodes documents (`sieve index build`/`add`, live writes, `sieve eval`'s indexes) in the lowest precision the device has and that keeps the probe documents' rankings (fp16 on CUDA, bf16 with AVX-512 BF16 on AMD or AMX on Intel; never int8): 2.5-3x fp32's documents per second on an AMD Zen 5 host, vectors within 1e-4 in cosine of fp32's (docs/performance.md); fp32: always fp32, as is every document with SIEVE_PRECISION=fp32. The embedding cache keeps each precision's vectors apart.")
    torch_threads: int | None = Field(None, ge=1, description="Torch intra-op threads; unset = torch's default.")
    pin_workers: bool = Field(False, description="Bind each worker process to its own share of the CPUs (a single process: to its first CPU), so its threads stay on the same cores: on a quiet 2-core host a single pinned process answered 1.6x the requests of an unpinned one with zero-cost forwards and 1.04x with the real models, on one core instead of two (RESULTS.md). Off by default: a pinned worker cannot move away from a core other processes of the host keep busy, nor use another worker's idle core. /readyz `workers.cpus` shows each worker's.")
    pin_interpreter: bool | None = Field(None, description="Bind each worker's Python threads (event loop, request threads, batchers) to one CPU of its share (a single process: of every CPU it may use), while torch's intra-op threads, which run the forwards, and the native threads already running when it pins (the tokenizers' Rust threads) use the whole share: the interpreter's hand-offs stay on one core and the forwards keep every core. On 2-core hosts one such process spent 2.4-2.9 ms of CPU per /search with zero-cost forwards against 6.4 unpinned (Zen 4; Intel Xeon 2.3 against 5.9, Zen 3 2.7 against 7.9) and answered 1.02-1.07x the unpinned process's requests with the real models (RESULTS.md). Each process takes the first CPU no other Sieve process of the host has claimed (a lock file in /dev/shm), and, from the end of its start-up (other workers loading their models at the same time are not contention), a watch moves the interpreter to another CPU of its share, or unpins it, when other processes keep its CPU busy (service/core_watch.py). unset or `auto` = on when a worker's share has 2 to 4 CPUs (measured with 2; a single process on a 3-4 CPU machine, each worker of the automatic count on a CPU (4 CPUs each) and on CUDA (2 each) are unmeasured), and for several workers with a CPU each (no more workers than CPUs: each runs wholly on its own CPU, and its watch may move it to any free one; 2 workers on 2 Zen 4 cores: 1.69x one worker's zero-cost requests, 1.12x the same workers unpinned); off for a single process with 1 CPU or a share of more than 4. /readyz `workers.interpreter` shows the CPU and what the watch did.")
    faiss_gpu: bool = Field(True, description="Move the FAISS index to the GPU when CUDA and faiss-gpu are present (not HNSW).")
    flat_search_on_device: bool = Field(True, description="Exact search of flat (exact) index segments with torch: on CUDA every such segment's vectors held in GPU memory in fp16 and searched there (one matmul + top-k; faiss-gpu's flat index where installed and SIEVE_FAISS_GPU is on); on an Intel CPU or an AMD Zen 3 or later, for a batch of 2 or more queries, torch's matmul + top-k over the memory-mapped float32 vectors (no copy): 0.5-0.97x the CPU per query of FAISS's exact search (on AMD Zen 4 the product alone costs 1.25-1.4x FAISS's AVX-512 kernels, but a whole /search 0.87-0.93x the server CPU, the candidates' scores read from the product's); one query alone, a float16 index, and any other CPU (AMD before Zen 3, not measured) stay with FAISS (index/device_flat.py, service/runtime.py); where SIEVE_FLAT_SEARCH_PRECISION picks a bf16 copy (CPUs with native bf16 products), that copy is searched for every batch, one query and a float16 index included. false = FAISS's exact search on every CPU.")
    flat_search_precision: Literal["auto", "fp32"] = Field("auto", description="auto: on a CPU with native bf16 products (AVX-512 BF16 on AMD, AMX on Intel) and SIEVE_PRECISION auto, torch's flat search on the CPU (SIEVE_FLAT_SEARCH_ON_DEVICE) multiplies a bfloat16 copy of each flat segment's vectors (in RAM, in each worker: half the float32 map's size; a segment whose copy would pass 256 MiB keeps its float32 map), for one query as for a batch: on an AMD Zen 5 host 0.5-0.75x the CPU per query of the float32 product from 2 queries, and a whole zero-cost /search 0.93x the server CPU at one worker, 0.73x at two (the default on 2 cores); scores within about 2.5e-3 of fp32's, so near ties may swap (docs/performance.md has the rankings it changes and `sieve eval` with it on and off); fp32: the float32 map as it is. /readyz `precision.vector_search` shows what runs.")
    device_speedup: float | None = Field(None, gt=0, description="How many times faster than the 2-core CPU the defaults were sized on this server's device runs the models; scales the default SIEVE_RERANK_MAX_TOKENS and SIEVE_DEFAULT_TIMEOUT_MS when they are not set (docs/deployment.md, GPU). Empty = measured at start-up on CUDA (a short bi-encoder forward), 1 on a CPU. /readyz `limits` shows what is in force.")
    shape_buckets: Literal["auto", "on", "off"] = Field("auto", description="Pad query-encoder batches (batch size, tokens) and CMC batches (queries, candidates) up to fixed bucket sizes, masked, so a GPU sees few distinct shapes (what CUDA graphs need); scores are unchanged. auto = on CUDA only.")
    cuda_graphs: bool = Field(False, description="On CUDA, run the query encoders and CMC through torch.compile(mode='reduce-overhead', dynamic shapes: CUDA graphs, one per bucketed shape) with shape buckets on; compiled on first use, so the first requests are slow; needs batching on. Ignored on a CPU. Unmeasured and untried on a GPU: none was available to this work.")
    cuda_streams: bool = Field(True, description="On CUDA, the query towers (bi-encoder, CMC's own) and CMC each run their forwards on a CUDA stream of the batcher thread that calls them, so where CMC's query tower differs from the bi-encoder the two encode a query at the same time on the GPU. No effect on a CPU.")
    cuda_mps: Literal["auto", "on", "off"] = Field("auto", description="Several worker processes on CUDA (SIEVE_WORKERS) share the GPU through NVIDIA MPS (Multi-Process Service), so their kernels run side by side instead of the GPU time-slicing one CUDA context per worker: `sieve serve` uses an MPS control daemon already running (CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps), else starts `nvidia-cuda-mps-control -d` under a private pipe directory its workers inherit and stops it when it exits. Measured on one H200 with 16 cores, SciFact x 9 (46,647 documents), 8 workers, default /search at 64 clients, with the daemon started by hand: 1,732 QPS (p99 98 ms) against 1,232 (p99 126 ms) time-sliced; 2,293 against 1,896 at 128 clients. auto = use or start it where it can, else log a warning and time-slice; on = refuse to start without it (only where it applies: CUDA and several workers); off = never (the workers time-slice). One process, one worker or a CPU: nothing is done. /readyz `workers.mps` says what was decided (docs/deployment.md).")
    nprobe: int = Field(16, ge=1, description="IVF cells probed per query.")
    ef_search: int = Field(128, ge=1, description="HNSW efSearch.")
    # throughput: micro-batching across concurrent requests (one worker thread per model)
    batching: bool = Field(True, description="Batch model work across concurrent requests; false = one forward pass per request.")
    batch_max_size: int = Field(32, ge=1, le=1024, description="Most requests in one batch.")
    batch_max_wait_ms: float = Field(2.0, ge=0, le=1000, description="After the first request of a batch, wait this long for more (0 = take what is queued), and only while another request in flight in this process has no item in the batch yet or the batch holds fewer than the last one: a request alone is computed at once.")
    cmc_batch_candidates: int = Field(16384, ge=1, description="CMC: queries x longest candidate list per forward pass.")
    ce_runtime: Literal["auto", "torch", "openvino"] = Field("auto", description="Cross-encoder runtime. auto: OpenVINO (bf16) on a CPU with native bf16 when precision is auto and the head converts, torch otherwise; openvino: OpenVINO in the precision's dtype (bf16 or fp32) on any CPU; torch: never OpenVINO. Rank-guarded like precision; /readyz says which runs.")
    ce_batch_tokens: int = Field(2048, ge=16, description="Cross-encoder: pairs x longest pair (tokens) per forward pass; also the most a request can run past its deadline in the cross-encoder (one pass: about 0.5 s on 2 CPU cores; 8192 once overran a 2 s deadline by 1.7 s on a loaded host, and on this CPU it scored no faster per token). Unset on a faster device (CUDA), multiplied by the device's speed-up, at most 32x (65,536: 512 pairs of 128 tokens, one forward of about 10 ms on an H200); /readyz `limits` shows the value in force; a value set here is kept as set.")
    # deadlines
    default_timeout_ms: int | None = Field(10_000, ge=1, description="Deadline of a /search, /rerank or /v2/rerank that gives no timeout_ms (stages that do not fit are skipped: partial answer); empty = none. 10 s: about 10x the slowest ordinary request on 2 CPU cores (a /search with the cross-encoder), and a /rerank at SIEVE_RERANK_MAX_TOKENS fits in it. Unset on a faster device (CUDA), divided by the device's speed-up, never below 1 s (SIEVE_DEVICE_SPEEDUP; /readyz `limits`); a value set here is kept as set.")
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
    header_timeout_s: float = Field(10.0, gt=0, description="Time to receive a request's line and headers (from connecting, or from the previous response); slower = connection closed.")
    body_timeout_s: float = Field(30.0, gt=0, description="Time to receive a request body; slower = 408 and the connection closed.")
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Largest request body (by Content-Length, or counted as a chunked body arrives); larger = 413.")
    max_header_bytes: int = Field(64 * 1024, ge=4096, description="Largest request line + headers; larger = 400 and the connection closed.")
    # live index updates
    documents_max_batch: int = Field(1000, ge=1, description="Most documents in one POST /documents.")
    write_batch_wait_ms: float = Field(20.0, ge=0, le=10000, description="Group commit: wait this long for more writes before one new version.")
    write_timeout_s: float = Field(300.0, gt=0, le=86400, description="The longest a write request (POST/DELETE /documents, POST /admin/index/reload on a local index) waits for its write to be applied; past it, or once its client hangs up, 503 `write_pending`: nothing acknowledged, the write stays queued and is applied unless the server stops (sending it again is safe). The default leaves room for a full POST on CPU: SciFact's 5,183 abstracts encode in 3.5-5.5 min on the 2-core hosts measured here, so SIEVE_DOCUMENTS_MAX_BATCH (1,000) of them take about 40-65 s, plus any write queued ahead.")
    index_poll_s: float = Field(0, ge=0, description="Reload when another writer published a newer version (and swap in an adapted CMC that `sieve adapt` published, when SIEVE_CMC_PATH is unset, and a click memory that `sieve feedback learn` published; on a Qdrant collection only the CMC: every search reads Qdrant), checked this often; 0 = only on POST /admin/index/reload, except with several worker processes, which look every 2 s (a reload reaches the one worker that answers it).")
    ann_min_rows: int = Field(50_000, ge=1, description="`sieve index build --faiss auto` (the default): an index segment of at least this many rows gets an IVF index (approximate, recall measured in docs/index.md), smaller ones are searched exactly.")
    index_merge: bool = Field(True, description="Merge index segments in the background after writes (SIEVE_INDEX_MAX_SEGMENTS, SIEVE_INDEX_COMPACT_DELETED_FRACTION); false = only `sieve index compact`.")
    index_max_segments: int = Field(10, ge=1, description="More segments than this after a write: merge the SIEVE_INDEX_MERGE_WIDTH adjacent segments holding the fewest rows.")
    index_merge_width: int = Field(5, ge=2, description="How many adjacent segments one background merge folds into one.")
    index_compact_deleted_fraction: float = Field(0.2, gt=0, le=1, description="Deleted (tombstoned) rows above this share of all rows: merge every segment into one (a full compaction, in the background).")
    # feedback (sieve/feedback: impressions, POST /feedback, `sieve feedback learn`)
    feedback_enabled: bool = Field(False, description="Log what /search showed (an impression per answer, written off the request path) and accept POST /feedback events against its `request_id`; `sieve feedback learn` trains CMC from them.")
    feedback_dir: Path | None = Field(None, description="Where impressions and feedback events are appended (fsynced, append-only); unset = SIEVE_INDEX_DIR/feedback.")
    feedback_log_query_text: bool = Field(False, description="Impressions also keep the query text (else only its vector and a hash of the normalised text).")
    feedback_log_candidates: int = Field(100, ge=1, le=2048, description="Impressions keep the first this many first-stage candidates (ids, bi-encoder and BM25 scores) the learner ranks among.")
    feedback_max_events: int = Field(500, ge=1, description="Most events in one POST /feedback; more = 413.")
    feedback_retention_mb: float = Field(1024.0, gt=0, description="Impressions and events kept on disk, each; past it the oldest log segments are deleted.")
    feedback_swap_fraction: float = Field(0.0, ge=0, le=1, description="Share of /search answers in which two adjacent results among the top SIEVE_FEEDBACK_SWAP_DEPTH swap places (logged), so `sieve feedback learn` can estimate position bias from the logs; 0 = never (the learner then uses (1/rank)^eta).")
    feedback_swap_depth: int = Field(10, ge=2, le=100, description="Positions a randomised swap may touch (1..depth).")
    feedback_explore_fraction: float = Field(0.0, ge=0, le=1, description="Share of /search answers that show, in SIEVE_FEEDBACK_EXPLORE_SLOTS positions drawn at random among the top_k, candidates drawn at random from the served ranking's ranks top_k+1..SIEVE_FEEDBACK_EXPLORE_DEPTH (logged: the impression's `explore`), so clicks can vouch for documents the ranking does not show yet and the click memory and its guard can count them; such an answer never swaps and is computed, not read from the result cache. 0 = never (the default): the request path is unchanged.")
    feedback_explore_depth: int = Field(50, ge=2, le=2048, description="Deepest rank of the served ranking an exploring answer draws its shown candidates from (SIEVE_FEEDBACK_EXPLORE_FRACTION).")
    feedback_explore_slots: int = Field(1, ge=1, le=10, description="Positions of the top_k an exploring answer gives to deeper candidates (SIEVE_FEEDBACK_EXPLORE_FRACTION).")
    feedback_explore_from: Literal["ranks", "neighbours"] = Field("ranks", description="What an exploring answer shows (SIEVE_FEEDBACK_EXPLORE_FRACTION): ranks = candidates drawn uniformly from ranks top_k+1..SIEVE_FEEDBACK_EXPLORE_DEPTH; neighbours = first the candidates (any rank below top_k) that users of similar queries clicked (query vectors with cosine >= SIEVE_FEEDBACK_EXPLORE_NEAR, among the last SIEVE_FEEDBACK_EXPLORE_CLICKS clicks of every worker, read from the events log once a second off the request path; drawn among the up to 4 x slots most similar), the remaining slots as ranks.")
    feedback_explore_near: float = Field(0.7, ge=0, le=1, description="Cosine of the query vectors from which another query's click leads exploration (SIEVE_FEEDBACK_EXPLORE_FROM=neighbours).")
    feedback_explore_clicks: int = Field(20_000, ge=1, le=1_000_000, description="Most recent clicks (query vector, document; every worker's) each worker process keeps in memory for exploration (SIEVE_FEEDBACK_EXPLORE_FROM=neighbours; about 1.5 kB each).")
    feedback_memory: int = Field(100_000, ge=1, description="Impressions kept in memory to validate events; an older request id is looked up on disk.")
    click_memory_enabled: bool = Field(True, description="Add the click memory `sieve feedback learn` published into the served index (SIEVE_INDEX_DIR/clicks) to /search scores after the last stage: documents users clicked for a query (and overall) rise, ones shown often and rarely clicked fall. Picked up live on reload and poll; a local index only.")
    # server
    host: str = Field("127.0.0.1", description="Bind address of `sieve serve` / `sieve demo`.")
    port: int = Field(8000, ge=1, le=65535, description="Port of `sieve serve` / `sieve demo`.")
    log_level: str = Field("info", description="Log level of the server and uvicorn (debug, info, warning, error).")
    access_log: bool = Field(True, description="One line per answered request on stdout (uvicorn's access log and its text: client, method, path with any query string scrubbed, status), at SIEVE_LOG_LEVEL info or debug. false = none (behind a proxy or load balancer that logs requests): less server CPU per request (docs/deployment.md).")
    workers: int | None = Field(None, ge=1, le=256, description="Worker processes of `sieve serve`, answering on one port and serving one index (docs/deployment.md); unset or `auto` = one per 2 CPU cores on CUDA (at most 8), one per 4 cores on a CPU but at least 2 from 2 cores (at most 4); /readyz says what was chosen. Without SIEVE_REDIS_URL each worker keeps its own caches and rate-limit counters. Each worker loads its own models; with several, torch threads are the cores divided among them unless SIEVE_TORCH_THREADS is set.")
    reuse_port: bool | None = Field(None, description="With several workers, each listens on a socket of its own bound to the port with SO_REUSEPORT, and the kernel spreads new connections over the workers by their addresses; false = one socket shared by all, where the worker that wakes first accepts every connection then queued, so a client's burst of keep-alive connections can all land on one worker and stay there (RESULTS.md, issue 32). unset or `auto` = on Linux, off elsewhere (other systems do not spread connections over such sockets). A worker's socket listens only once its models are loaded and closes with it: when a worker stops (SIGHUP's rolling restart) or dies, the connections queued on its socket and not yet read are reset (nothing answered is lost; the client connects again), unless the host sets net.ipv4.tcp_migrate_req=1, which hands them to another worker (docs/deployment.md).")
    http_parser: Literal["httptools", "h11"] = Field("httptools", description="HTTP/1.1 parser of `sieve serve`: httptools (uvicorn's C parser; h11 when httptools is not installed) or h11 (pure Python, more CPU per request). Both bound the request line + headers in size (SIEVE_MAX_HEADER_BYTES) and time (SIEVE_HEADER_TIMEOUT_S) and answer what they cannot read with a JSON 400.")
    fast_search: bool = Field(True, description="POST /search, /rerank and /v2/rerank answered by a lean path in front of FastAPI and the middleware stack (service/fast_search.py): the same limits, guard, validation, handler, answers and metrics with less Python per request; a request it does not take (another content type, no Content-Length, a body that is not valid) goes through FastAPI as before. false = always through FastAPI.")

    @field_validator("model_path", "cmc_path", "cross_encoder_path", "ce_query_max_length", "ce_max_length",
                     "redis_url", "api_keys", "api_keys_file", "ce_url", "ce_api_key", "default_timeout_ms", "device_speedup",
                     "rate_limit_per_s", "workers", "pin_interpreter", "reuse_port", mode="before")
    @classmethod
    def empty_is_unset(cls, value):
        return None if value == "" or value == "auto" else value

    @field_validator("ce_url", mode="after")
    @classmethod
    def remote_url(cls, value):
        """An http(s) URL with a host, checked at start-up rather than on the first request."""
        if value is not None:
            from sieve.pipeline.remote_ce import endpoint_url

            endpoint_url(value, "sieve")
        return value

    @field_validator("cmc_path", "cross_encoder_path", mode="after")
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

    def feedback_path(self) -> Path:
        return self.feedback_dir or self.index_dir / "feedback"

    def resolved_model_path(self) -> Path:
        from sieve.models.weights import default_model_path

        return self.model_path or default_model_path()

    def resolved_cmc_path(self, adapted: Path | None = None) -> Path | None:
        """The first CMC checkpoint in the load order (cmc_choices); None = the untrained CMC. `adapted`: the
        index's live adapted CMC (AdaptedStore.current()); without it none is considered (the configured one, else
        the shipped default)."""
        return self.cmc_choices(adapted)[0][1]

    def cmc_choices(self, adapted: Path | None = None) -> list[tuple[str, Path | None]]:
        """The CMC load order as (source, checkpoint; None = the untrained CMC): SIEVE_CMC_PATH alone when set
        ("setting"; it must fit), else `adapted`, the index's live adapted CMC ("adapted"), the shipped default
        ("shipped") and the untrained CMC ("untrained"), each tried when the one before does not fit the bi-encoder."""
        from sieve import checkpoints

        if self.cmc_path is not None:
            return [("setting", None if str(self.cmc_path) == UNTRAINED else self.cmc_path)]
        choices: list[tuple[str, Path | None]] = [("adapted", adapted)] if adapted is not None else []
        if (shipped := checkpoints.shipped(checkpoints.CMC)) is not None:
            choices.append(("shipped", shipped))
        return choices + [("untrained", None)]

    def adapted_store(self, index) -> "AdaptedStore":
        """Where the opened `index` keeps its adapted CMCs (index/adapted.py): inside SIEVE_INDEX_DIR, or inside
        the Qdrant collection (local copies under SIEVE_CACHE_DIR/adapted)."""
        from sieve.index.adapted import store_for

        return store_for(index, self.index_dir, self.cache_dir)

    def served_index(self) -> dict[str, str | None]:
        """What this server serves (/readyz, the start-up log): the backend, where the index is (the directory,
        or the Qdrant server's URL, local-mode directory or edge shards' directory) and the Qdrant collection."""
        if not self.on_qdrant:
            return {"index_backend": "local", "index_dir": str(self.index_dir), "collection": None}
        where = self.qdrant_edge_path if self.index_backend == "qdrant-edge" else self.qdrant_url
        return {"index_backend": self.index_backend, "index_dir": str(where), "collection": self.qdrant_collection}

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

    def poll_s(self) -> float:
        """How often the index writer thread (on Qdrant, the updater) looks for what another process published:
        SIEVE_INDEX_POLL_S, or WORKERS_POLL_S with several workers when it is 0, so that an adapted CMC or a click
        memory published after a reload that reached one worker reaches the others too (new index versions they
        catch up on before each request)."""
        if self.index_poll_s or (self.workers or 1) <= 1:
            return self.index_poll_s
        return WORKERS_POLL_S

    def merge_policy(self):
        """When segments are merged after writes (None: never, only `sieve index compact`)."""
        if not self.index_merge:
            return None
        from sieve.index.compaction import MergePolicy

        return MergePolicy(self.index_max_segments, self.index_merge_width, self.index_compact_deleted_fraction)

    def lexical_config(self) -> "LexicalConfig | None":
        """What a new index's BM25 part is built with; None = no lexical part."""
        from sieve.index.lexical import LexicalConfig

        return LexicalConfig(language=self.lexical_language) if self.lexical_enabled else None

    @property
    def on_qdrant(self) -> bool:
        """The index is a Qdrant collection (on a server, the client's local mode, or edge)."""
        return self.index_backend in ("qdrant", "qdrant-edge")

    def qdrant_config(self) -> "QdrantConfig":
        """Where the Qdrant collection is and how to call it (SIEVE_QDRANT_*)."""
        from sieve.index.qdrant_backend import QdrantConfig

        edge = self.index_backend == "qdrant-edge"
        return QdrantConfig(str(self.qdrant_edge_path) if edge else self.qdrant_url, self.qdrant_collection,
                            self.qdrant_api_key.get_secret_value() if self.qdrant_api_key else None,
                            self.qdrant_timeout_ms / 1000, self.qdrant_prefer_grpc, self.qdrant_hnsw_ef,
                            self.qdrant_exact, "edge" if edge else "client", self.qdrant_reopen_ms / 1000)

    def keys(self) -> set[str]:
        """Every accepted API key (settings and file); empty = no authentication."""
        keys = set((self.api_keys.get_secret_value() if self.api_keys else "").split(","))
        if self.api_keys_file:
            keys |= set(self.api_keys_file.read_text(encoding="utf-8").splitlines())
        return {k.strip() for k in keys if k.strip()}
