"""Every HTTP request and response body, on shared strict bases.

The rules every request body follows (docs/api.md#errors), here so that every endpoint gets them from `Strict`:
unknown fields are refused, and types are not coerced: a string where the schema says boolean or integer
(`"yes"`, `"2"`), a float where it says integer (`2.5`, `2.0`), or a number where it says string is a 422
naming the field. A document text, wherever one is sent, is a non-empty string (`DocumentText`)."""
from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

QUERY_MAX_CHARS = 10_000  # hard ceiling before any tokenisation; the token limit is a setting
TIMEOUT_MAX_MS = 600_000
DOC_ID_MAX_CHARS = 512
DOC_TEXT_MAX_CHARS = 200_000


LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON may escape them ("\\ud800"); no UTF-8 text holds one
CONTROL_OR_SURROGATE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def unicode_text(value):
    # isascii() reads a flag CPython keeps on every str (O(1)): only a text with other characters is searched
    if isinstance(value, str) and not value.isascii() and LONE_SURROGATE.search(value):
        raise ValueError("contains a lone surrogate (\\ud800-\\udfff), which is not Unicode text")
    return value


def printable_id(value):
    if isinstance(value, str) and CONTROL_OR_SURROGATE.search(value):
        raise ValueError("an id may not contain control characters (NUL, newline, ...) or lone surrogates")
    return value


# checked before str's own validation, whose length check would refuse a surrogate with a vaguer message
Text = Annotated[str, BeforeValidator(unicode_text)]  # every text a model reads
# one rule for every document a request sends to be ranked (/rerank, /v2/rerank): an empty one is a 422
DocumentText = Annotated[Text, Field(min_length=1)]
DocumentId = Annotated[str, BeforeValidator(printable_id)]  # ids end up in logs, files and URLs
# a stage's name (sieve/pipeline/registry.py); which names this server has is checked by the searcher (4xx)
StageName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class Strict(BaseModel):
    """A request body: unknown fields refused, no type coercion (strict: "2" is not an integer, "yes" not a bool)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- shared pieces ------------------------------------------------------------------------------------------
class DocumentOut(Reply):
    id: str | None = Field(None, description="Document id (absent for /rerank texts sent without one).")
    title: str | None = Field(None, description="Title, for indexed documents.")
    text: str = Field(..., description="Document text.")


STAGE_KEYS_DOC = "docs/api.md lists the keys of the stages Sieve ships; GET /readyz `stages` those of this server"


class ErrorInfo(Reply):
    code: str = Field(..., description="Machine-readable error code.")
    message: str = Field(..., description="What is wrong.")
    field: str | None = Field(None, description="The request field at fault, when there is one.")
    allowed: str | None = Field(None, description="What would have been accepted.")
    details: list[dict] | None = Field(None, description="One entry per validation problem.")


class ErrorResponse(Reply):
    error: ErrorInfo = Field(..., description="What went wrong and what is allowed.")


# -- /search ------------------------------------------------------------------------------------------------
class SearchRequest(Strict):
    query: Text = Field(..., min_length=1, max_length=QUERY_MAX_CHARS, description="Free-text query.")
    top_k: int = Field(10, ge=1, description="Results to return (<= retrieve_k and <= SIEVE_MAX_TOP_K).")
    retrieve_k: int = Field(512, ge=1, description="Candidates the retriever returns (clamped to the index size).")
    rerank: StageName | None = Field(
        None, description="Reranker of all retrieved candidates: cmc, none, or another registered reranker (mix with "
        "the research stages). Unset = SIEVE_DEFAULT_RERANK (none with retriever anncur, which CMC cannot rerank).")
    cmc_k: int = Field(16, ge=1, description="K': candidates CMC passes to the cross-encoder; the CE scores this many "
                       "(with retriever anncur: besides the anchors).")
    cross_encoder: bool | None = Field(None, description="Rerank the top cmc_k with the cross-encoder (4xx when none is "
                                       "configured); unset = SIEVE_DEFAULT_CROSS_ENCODER, and only when the server "
                                       "has the chosen ce_model and the retriever is not anncur.")
    ce_model: StageName = Field("ce", description="Which cross-encoder stage scores the head: ce "
                                "(SIEVE_CROSS_ENCODER_PATH) or another registered one (ce_late, the late-interaction "
                                "one, SIEVE_LATE_CE_PATH, with the research stages).")
    return_documents: bool = Field(False, description="Include each result's title and text.")
    timeout_ms: int | None = Field(None, ge=1, le=TIMEOUT_MAX_MS, description="Answer within this many ms: a rerank "
                                   "stage that does not fit is skipped (partial: true); default SIEVE_DEFAULT_TIMEOUT_MS.")
    retriever: StageName | None = Field(
        None, description="be: bi-encoder + FAISS; bm25: BM25 over title + text (the index's lexical part); hybrid: "
        "the top SIEVE_HYBRID_DEPTH of each fused by reciprocal rank; anncur: the cross-encoder itself, scored against "
        "k_i anchor documents, then MIPS over the annCUR index (SIEVE_ANNCUR_DIR). Unset = hybrid when the index has "
        "a lexical part, else be.")


class SearchHit(Reply):
    id: str = Field(..., description="Document id.")
    rank: int = Field(..., description="1-based rank.")
    score: float = Field(..., description="Score of the last stage that ranked this result.")
    scores: dict[str, float | None] = Field(..., description="Score from each stage that ran, keyed by its score column "
                                            "(retrieve = the first stage's ranking score; hybrid adds be and bm25; "
                                            "then cmc, ce, ...); null where a stage did not score this candidate "
                                            "(the cross-encoder scores only the head). " + STAGE_KEYS_DOC + ".")
    document: DocumentOut | None = Field(None, description="Title and text, when return_documents is true.")


class SearchResponse(Reply):
    results: list[SearchHit] = Field(..., description="Ranked results, best first.")
    timings_ms: dict[str, float] = Field(..., description="Latency in ms of each step that ran, keyed by its timing "
                                         "key (be_encode, mips, bm25, fuse, cmc_encode, cmc, ce, ...), plus total (the "
                                         "whole request inside the pipeline). " + STAGE_KEYS_DOC + ".")
    index_version: int = Field(..., description="Version of the index that answered.")
    stages: list[str] = Field(..., description="Stages that ranked the results, in order.")
    warnings: list[str] = Field(default_factory=list, description="E.g. retrieve_k clamped, query truncated.")
    partial: bool = Field(False, description="True when a stage was skipped for lack of time: the previous stage's order.")
    skipped: list[str] = Field(default_factory=list, description="Stages skipped for lack of time (e.g. ce, cmc).")
    cached: bool = Field(False, description="Served from the result cache (timings_ms then holds only total).")
    request_id: str | None = Field(None, description="This answer's id: POST /feedback events name it (with SIEVE_FEEDBACK_ENABLED the server keeps what it showed).")


# -- /rerank ------------------------------------------------------------------------------------------------
class RerankDocument(Strict):
    id: DocumentId | None = Field(None, min_length=1, description="Document id; an indexed id reuses its stored vector.")
    text: DocumentText | None = Field(None, description="Document text (non-empty); required when the id is not indexed.")

    @model_validator(mode="after")
    def id_or_text(self):
        if self.id is None and self.text is None:
            raise ValueError("each document needs a text, an indexed id, or both")
        return self


class RerankRequest(Strict):
    query: Text = Field(..., min_length=1, max_length=QUERY_MAX_CHARS, description="Free-text query.")
    documents: list[DocumentText | RerankDocument] = Field(..., min_length=1, description="Non-empty texts or {id, text} objects (at most SIEVE_RERANK_MAX_DOCUMENTS).")
    top_n: int | None = Field(None, ge=1, description="Results to return; default all.")
    return_documents: bool = Field(False, description="Echo each document (id and text) in the results.")
    model: StageName = Field("cmc", description="Reranker: cmc (default), ce (the cross-encoder), or another "
                             "registered stage that ranks texts (mix, ce_late with the research stages).")
    timeout_ms: int | None = Field(None, ge=1, le=TIMEOUT_MAX_MS, description="Answer within this many ms: when the "
                                   "reranker does not fit, the fallback order is returned (partial: true).")


class RerankResult(Reply):
    index: int = Field(..., description="Position of the document in the request.")
    relevance_score: float | None = Field(..., description="Score of the chosen reranker (higher is more relevant); "
                                          "on a CMC fallback the <query, document> score; null when the "
                                          "cross-encoder was skipped (the documents keep the request's order).")
    document: DocumentOut | None = Field(None, description="The document, when return_documents is true.")


class RerankResponse(Reply):
    results: list[RerankResult] = Field(..., description="Documents ranked best first.")
    timings_ms: dict[str, float] = Field(..., description="Per-stage latency in ms (cmc_encode, candidate_encode, cmc or ce, total).")
    model: str = Field(..., description="The reranker that ranked them.")
    index_version: int = Field(..., description="Version of the index whose stored vectors were used.")
    warnings: list[str] = Field(default_factory=list, description="E.g. query truncated.")
    partial: bool = Field(False, description="True when the reranker was skipped for lack of time.")
    skipped: list[str] = Field(default_factory=list, description="Stages skipped for lack of time (cmc or ce).")
    request_id: str | None = Field(None, description="This answer's id: POST /feedback events name it (with SIEVE_FEEDBACK_ENABLED the server keeps what it showed).")


# -- /v2/rerank (Cohere v2 shape) -----------------------------------------------------------------------------
class CohereRerankRequest(Strict):
    model: str = Field(..., description="Reranker: `ce`, `cmc`, or a Cohere name (`rerank-...`) = this server's "
                       "default reranker (the cross-encoder when loaded, else CMC).")
    query: Text = Field(..., min_length=1, max_length=QUERY_MAX_CHARS, description="Free-text query.")
    documents: list[DocumentText] = Field(
        ..., min_length=1, description="Non-empty texts (at most SIEVE_RERANK_MAX_DOCUMENTS).")
    top_n: int | None = Field(None, ge=1, description="Results to return; default all.")
    max_tokens_per_doc: int | None = Field(None, ge=1, description="Cut each document after this many "
                                           "whitespace-separated words before the model reads it; default no cut.")
    priority: int | None = Field(None, ge=0, description="Accepted for Cohere clients; ignored.")


class CohereRerankResult(Reply):
    index: int = Field(..., description="Position of the document in the request.")
    relevance_score: float | None = Field(..., description="Score of the chosen reranker (raw: a CE logit or CMC "
                                          "inner product, not Cohere's [0, 1]); null when the cross-encoder was "
                                          "skipped for lack of time (meta.warnings says so).")


class CohereApiVersion(Reply):
    version: str = Field("2", description="Cohere API version this shape follows.")


class CohereBilledUnits(Reply):
    search_units: int = Field(..., description="One per started 100 documents, as Cohere counts.")


class CohereMeta(Reply):
    api_version: CohereApiVersion = Field(default_factory=CohereApiVersion, description="Cohere API version.")
    billed_units: CohereBilledUnits = Field(..., description="What Cohere would bill: search units.")
    warnings: list[str] = Field(default_factory=list, description="E.g. query truncated, reranker skipped.")


class CohereRerankResponse(Reply):
    id: str = Field(..., description="Request id.")
    results: list[CohereRerankResult] = Field(..., description="Documents ranked best first.")
    meta: CohereMeta = Field(..., description="API version, billed units and warnings.")


# -- /documents and /admin ----------------------------------------------------------------------------------
class DocumentIn(Strict):
    id: DocumentId = Field(..., min_length=1, max_length=DOC_ID_MAX_CHARS, description="Document id; an existing id is replaced (no control characters).")
    title: Text = Field("", max_length=DOC_TEXT_MAX_CHARS, description="Title (encoded as 'title text').")
    text: Text = Field(..., min_length=1, max_length=DOC_TEXT_MAX_CHARS, description="Document text.")


class DocumentsRequest(Strict):
    documents: list[DocumentIn] = Field(..., min_length=1, description="Documents to add or replace "
                                        "(at most SIEVE_DOCUMENTS_MAX_BATCH, unique ids).")


class WriteResponse(Reply):
    index_version: int = Field(..., description="Index version that holds this write (durable on disk).")
    index_size: int = Field(..., description="Documents in that version.")
    upserted: int = Field(0, description="Documents added or replaced by this request.")
    deleted: list[str] = Field(default_factory=list, description="Ids deleted by this request.")


class DocumentResponse(Reply):
    id: str = Field(..., description="Document id.")
    title: str = Field(..., description="Title.")
    text: str = Field(..., description="Text.")
    index_version: int = Field(..., description="Index version it was read from.")


class ReloadResponse(Reply):
    index_version: int = Field(..., description="Version now served.")
    previous_version: int = Field(..., description="Version served before the reload.")
    index_size: int = Field(..., description="Documents in the served version.")
    changed: bool = Field(..., description="Whether a newer version was found and swapped in.")
    cmc_changed: bool = Field(False, description="Whether a newly published adapted CMC (`sieve adapt`) was found "
                                                 "and swapped in (only without SIEVE_CMC_PATH).")


# -- /feedback ---------------------------------------------------------------------------------------------
class FeedbackEvent(Strict):
    request_id: str = Field(..., min_length=1, max_length=64, description="The `request_id` of the /search or /rerank answer the event is about.")
    doc_id: DocumentId = Field(..., min_length=1, max_length=DOC_ID_MAX_CHARS, description="A document that answer showed.")
    type: Literal["click", "label"] = Field("click", description="click: the user opened it; label: an explicit judgement (`label`).")
    dwell_ms: int | None = Field(None, ge=0, le=86_400_000, description="Time spent on the document, when known.")
    label: int | None = Field(None, ge=0, le=3, description="Explicit relevance 0-3 (type label).")

    @model_validator(mode="after")
    def label_with_type(self):
        if (self.type == "label") != (self.label is not None):
            raise ValueError("`label` is given exactly when type is label")
        return self


class FeedbackRequest(Strict):
    events: list[FeedbackEvent] = Field(..., min_length=1, description="Events (at most SIEVE_FEEDBACK_MAX_EVENTS; more = 413).")


class FeedbackResponse(Reply):
    accepted: int = Field(..., description="Events stored (fsynced: they survive a crash of the server).")


# -- health -------------------------------------------------------------------------------------------------
class Health(Reply):
    status: Literal["ok"] = Field("ok", description="Always ok while the process answers.")


class RemoteCrossEncoderStatus(Reply):
    url: str = Field(..., description="The remote rerank endpoint (SIEVE_CE_URL, without credentials).")
    shape: Literal["cohere", "tei", "sieve"] = Field(..., description="Its request/answer format (SIEVE_CE_SHAPE).")
    model: str = Field(..., description="The model name sent to it (SIEVE_CE_MODEL_NAME; unused by tei).")
    state: Literal["closed", "open", "half_open"] = Field(..., description="Circuit breaker: closed = calls go out; "
                                                          "open = the stage is skipped at once; half_open = one probe call is let through.")
    consecutive_failures: int = Field(..., description="Failed calls in a row (SIEVE_CE_BREAKER_FAILURES opens the breaker).")
    opened_total: int = Field(..., description="Times the breaker opened since the server started.")
    retry_in_s: float | None = Field(None, description="While open: seconds until a probe call is let through.")


class StagePrecision(Reply):
    dtype: Literal["fp32", "bf16", "fp16", "int8"] = Field(..., description="Number format of the stage's weights and matmuls (int8: dynamically quantised linear layers).")
    reason: str = Field(..., description="Why this format: the device's capabilities, SIEVE_PRECISION=fp32, or a failed quality guard.")
    spearman: float | None = Field(None, description="Lowest Spearman rank correlation of the stage's scores with fp32 on the start-up probe inputs; null when it runs in fp32 by choice.")
    runtime: Literal["torch", "openvino"] = Field("torch", description="What runs the stage: torch, or OpenVINO (the cross-encoder with SIEVE_CE_RUNTIME auto on a CPU with native bf16, or openvino).")


class AdaptedCMCStatus(Reply):
    version: str = Field(..., description="The adapted CMC's directory under SIEVE_INDEX_DIR/adapted/ (what CURRENT names).")
    documents: int = Field(..., description="Documents it was adapted on (its documents.txt).")
    live_documents: int = Field(..., description="Documents in the live index version.")
    covered: int = Field(..., description="Live documents it was adapted on.")
    coverage: float = Field(..., description="covered / live_documents: drops as documents are added after `sieve adapt` (run it again when low).")
    created: str | None = Field(None, description="When it was made (ISO time, from its config.json).")


class CMCStatus(Reply):
    name: str = Field(..., description="The served CMC checkpoint's name.")
    source: Literal["setting", "adapted", "shipped", "untrained"] = Field(..., description="Where it came from: setting (SIEVE_CMC_PATH), adapted (the index's own, `sieve adapt`), shipped (the default in the package), untrained (the identity CMC: no checkpoint fits the bi-encoder).")
    path: str | None = Field(None, description="Its checkpoint directory, shown only to a caller with a valid API key "
                             "(null otherwise, and for the untrained CMC).")
    adapted: AdaptedCMCStatus | None = Field(None, description="For an adapted CMC: which one and how much of the live index it saw.")


class InterpreterStatus(Reply):
    cpu: int | None = Field(..., description="The one CPU this worker's Python threads run on (null while its watch has them unpinned).")
    share: list[int] = Field(..., description="The worker's CPUs, where the forwards' threads run.")
    moves: int = Field(0, description="Times the watch pinned the interpreter to another CPU: off one other processes kept busy, or again after an unpin.")
    unpins: int = Field(0, description="Times the watch found no free CPU while other processes kept the interpreter's busy and unpinned it (the whole share, pinned again 5 s later).")


class MpsStatus(Reply):
    state: Literal["started", "running", "unavailable", "off", "not cuda", "one worker"] = Field(..., description="How the workers share the GPU (SIEVE_CUDA_MPS): started = through an MPS control daemon the supervisor started (and stops at exit); running = through one that was already running; unavailable = no MPS to be had (the workers time-slice; the log says why); off = SIEVE_CUDA_MPS=off; not cuda, one worker = nothing to share.")
    pipe_directory: str | None = Field(None, description="The daemon's pipe directory (CUDA_MPS_PIPE_DIRECTORY), when there is one.")
    reason: str = Field(..., description="Why, in words.")


class WorkersStatus(Reply):
    count: int = Field(..., description="Worker processes of this server (SIEVE_WORKERS, or chosen automatically).")
    ready: int = Field(..., description="Workers serving now (their models loaded); /readyz answers 503 until all are.")
    pid: int = Field(..., description="Process id of the worker that answered.")
    chosen: str = Field(..., description="How the count was chosen: SIEVE_WORKERS, or the automatic rule from the CPU "
                                         "cores and the device, with its inputs.")
    torch_threads: int = Field(..., description="Torch intra-op threads of this worker (SIEVE_TORCH_THREADS; with "
                                                "several workers and no setting, the cores divided among them).")
    cpus: list[int] | None = Field(None, description="CPUs this worker may run on (its own share with SIEVE_PIN_WORKERS).")
    interpreter: InterpreterStatus | None = Field(None, description="SIEVE_PIN_INTERPRETER: where this worker's interpreter runs and what the watch on its CPU did; null when not pinned.")
    blas_threads: int | None = Field(None, description="Threads of numpy's BLAS in this worker: 1 once its models are "
                                                       "loaded (its request threads compute many small products at once).")
    mps: MpsStatus | None = Field(None, description="CUDA MPS for the workers (SIEVE_CUDA_MPS, docs/deployment.md); null for a single process (`sieve serve` without workers).")


class LimitsStatus(Reply):
    rerank_max_tokens: int = Field(..., description="The /rerank work cap in force (tokens a request may give its model to read; more = 413).")
    default_timeout_ms: int | None = Field(..., description="The deadline of a request that gives no timeout_ms, in force (null = none).")
    ce_batch_tokens: int = Field(..., description="The cross-encoder's tokens per forward pass in force (pairs x longest pair; SIEVE_CE_BATCH_TOKENS scaled by the speed-up, at most 32x).")
    speedup: float = Field(..., description="The device's speed-up over the 2-core CPU the defaults were sized on, that scaled the three above (1 = the CPU defaults).")
    source: Literal["cpu", "setting", "calibrated"] = Field(..., description="Where the speed-up came from: cpu (today's defaults, unscaled), setting (SIEVE_DEVICE_SPEEDUP) or calibrated (a forward timed at start-up on CUDA). Settings given explicitly are kept as given.")


class ClickMemoryStatus(BaseModel):
    version: str = Field(..., description="The published memory's directory under SIEVE_INDEX_DIR/clicks.")
    w_query: float = Field(..., description="Weight of the (query, document) click-through term.")
    w_doc: float = Field(..., description="Weight of the per-document click-through term.")
    w_near: float = Field(..., description="Weight of the nearest remembered queries' term (0: off).")
    near_min: float = Field(..., description="Cosine from which a remembered query counts as near.")
    near_k: int = Field(..., description="How many of the nearest remembered queries the term averages.")
    doc_gate: float | None = Field(None, description="The per-document term applies only to a query the memory knows: remembered itself, or with a remembered query at this cosine or more (null: to every query).")
    doc_related: float | None = Field(None, description="The per-document term applies to a document only where a remembered query whose users clicked it is at this cosine or more with the query (null: wherever it has a term).")
    pseudo: float = Field(..., description="Pseudo-examinations the click-through rates are smoothed with.")
    queries: int = Field(..., description="Queries (by hash) with remembered documents.")
    documents: int = Field(..., description="Documents with a per-document term.")


class Ready(Reply):
    status: Literal["ready"] = Field("ready", description="Models and index are loaded.")
    index_size: int = Field(..., description="Documents in the live index.")
    index_version: int = Field(..., description="Version of the live index.")
    index_backend: Literal["local", "qdrant", "qdrant-edge"] = Field("local", description="Where the served index lives (SIEVE_INDEX_BACKEND).")
    index_dir: str = Field(..., description="Where the served index is: the index directory (local); on Qdrant, the server's URL, the local-mode directory or the qdrant-edge shards' directory. Its full form for a caller with a valid API key, else only its last part (the directory's name).")
    collection: str | None = Field(None, description="The Qdrant collection served (null on a local index); its adapted CMC is the one `cmc` names.")
    models: dict[str, str | None] = Field(..., description="Loaded model per role (bi_encoder, cmc, cross_encoder, and "
                                          "each other registered stage with a model); null = not loaded.")
    stages: dict[str, list[str]] = Field(..., description="Stages this server can run, by role (retriever, reranker, "
                                         "cross_encoder): each registered stage whose model is loaded or that needs none.")
    device: str = Field(..., description="Torch device the models run on.")
    remote_cross_encoder: RemoteCrossEncoderStatus | None = Field(
        None, description="The remote cross-encoder and its circuit breaker, when SIEVE_CE_URL is set; the server "
                          "stays ready while it is down (answers are then partial, skipping ce).")
    precision: dict[str, StagePrecision] = Field(default_factory=dict, description="Per stage (bi_encoder_query, bi_encoder_documents, cmc, cmc_query, cross_encoder, vector_search: the exact search of flat index segments): the number format it runs in, chosen at start-up (SIEVE_PRECISION, SIEVE_DOC_PRECISION, SIEVE_FLAT_SEARCH_PRECISION).")
    cmc: CMCStatus | None = Field(None, description="The served CMC and where it came from (null when the CMC stage is off).")
    click_memory: ClickMemoryStatus | None = Field(None, description="The click memory `sieve feedback learn` published into the served index and this server adds to /search scores (null: none served, or SIEVE_CLICK_MEMORY_ENABLED is off).")
    workers: WorkersStatus | None = Field(None, description="The server's worker processes (docs/deployment.md).")
    limits: LimitsStatus | None = Field(None, description="The /rerank work cap and default deadline in force: the settings on a CPU, scaled by the device's speed-up on a faster one (docs/deployment.md, GPU).")
