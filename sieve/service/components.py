"""Loads the models and the index named by the settings: called once, from the app's lifespan or the CLI.

The bi-encoder and the index first, then each registered stage's model (sieve/pipeline/registry.py) in
registration order: a stage's loader sees the settings, its own settings class, the device and what is loaded.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import torch

import sieve.stages  # noqa: F401 (registers the core stages)
from sieve.models.cross_encoder import CrossEncoder
from sieve.models.device import pick_device
from sieve.models.precision_stages import lower_cmc, lower_cross_encoder, lower_document_tower, lower_query_tower
from sieve.models.text_encoder import EncoderLengths, TextEncoder
from sieve.pipeline import registry
from sieve.pipeline.registry import LoadContext
from sieve.pipeline.searcher import Searcher
from sieve.service.config import Settings
from sieve.service.gpu_runtime import apply_runtime, device_runtime
from sieve.service.limits import Limits, device_limits
from sieve.service.runtime import flat_device, flat_search_precision, load_index, searcher_options

log = logging.getLogger("sieve")


@dataclass
class Components:
    searcher: Searcher
    device: str
    precision: dict[str, dict] = field(default_factory=dict)  # stage -> models.precision.Choice.as_dict()
    # the work cap, default deadline and cross-encoder pass width in force (service/limits.py); None: the settings'
    limits: Limits | None = None

    def model_names(self) -> dict[str, str | None]:
        """/readyz `models`: the bi-encoder and every registered stage with a model (null = not loaded)."""
        s = self.searcher
        names = {"bi_encoder": s.biencoder.name}
        for spec in registry.stages():
            if spec.optional:
                names[spec.model_key] = model_name(s.models.get(spec.name))
        return names

    def stage_names(self) -> dict[str, list[str]]:
        """/readyz `stages`: what each request field may name on this server."""
        models = self.searcher.models
        return {role: [s.name for s in registry.stages(role) if not s.optional or s.name in models]
                for role in registry.ROLES}

    def close(self) -> None:
        self.searcher.close()
        self.searcher.index.close()
        for model in self.searcher.models.values():
            if callable(getattr(model, "close", None)):
                model.close()


def served_name(settings: Settings) -> str:
    """The index as the log names it: its directory, or the Qdrant collection and where it is."""
    served = settings.served_index()
    if served["collection"] is None:
        return f"index {served['index_dir']}"
    return f"{served['index_backend']} collection {served['collection']!r} at {served['index_dir']}"


def model_name(model) -> str | None:
    if model is None:
        return None
    return getattr(model, "name", None) or type(model).__name__


def load_biencoder(settings: Settings, device: torch.device) -> TextEncoder:
    lengths = EncoderLengths(settings.query_max_length, settings.doc_max_length)
    return TextEncoder.from_pretrained(settings.resolved_model_path(), name=settings.model_name, lengths=lengths,
                                       device=device, batch_size=settings.encode_batch_size)


def lower_documents(settings: Settings, biencoder: TextEncoder) -> dict:
    """Puts the document tower SIEVE_DOC_PRECISION and SIEVE_PRECISION allow in place (fp32 when either is fp32);
    returns its record."""
    mode = "fp32" if "fp32" in (settings.precision, settings.doc_precision) else "auto"
    biencoder.doc_module, choice = lower_document_tower(biencoder, mode)
    if choice.dtype == "fp32" and mode == "fp32":
        choice = replace(choice, reason="SIEVE_PRECISION=fp32" if settings.precision == "fp32" else "SIEVE_DOC_PRECISION=fp32")
    biencoder.doc_precision = choice.dtype
    log.info("precision bi_encoder_documents: %s (%s)", choice.dtype, choice.reason)
    return choice.as_dict()


def stage_settings(spec, settings: Settings):
    """The stage's own settings (its class reads SIEVE_* from the environment); fields given to the service
    settings object explicitly (Settings(mix_path=...)) win."""
    if spec.settings is None:
        return None
    given = {k: v for k, v in (settings.model_extra or {}).items() if k in spec.settings.model_fields}
    return spec.settings(**given)


def load_stages(settings: Settings, device: torch.device, biencoder: TextEncoder, index) -> dict:
    registry.load_plugins()
    rerankers = registry.names(registry.RERANKER)
    if settings.default_rerank not in (*rerankers, "none"):
        raise ValueError(f"SIEVE_DEFAULT_RERANK={settings.default_rerank!r} is no registered reranker "
                         f"(have: {', '.join(rerankers)}, none)")
    loaded: dict = {}
    for spec in registry.stages():
        if spec.load is None:
            continue
        ctx = LoadContext(settings, device, biencoder, index, loaded, stage_settings(spec, settings))
        model = spec.load(ctx)
        if model is not None:
            loaded[spec.name] = model
    return loaded


def single_threaded_blas() -> None:
    """numpy's and FAISS's BLAS (OpenBLAS) on one thread in a serving process (/readyz `workers.blas_threads`
    reads numpy's back: service/workers.py). Every product the request threads compute is small, and they compute
    them concurrently: OpenBLAS hands a matrix-vector product of 2,000 x 384 or more to its thread pool, and 16
    threads doing that at once spent 30-65 ms of CPU per product on the 2-core host instead of 0.36 ms
    (benchmarks/blas_concurrency.py). numpy's OpenBLAS (threads of its own) takes the limit for the whole process;
    FAISS's is built on OpenMP, whose thread count is per calling thread, so there it holds for this thread only
    (FAISS calls BLAS for batches of 20 queries or more, not for a /search). Torch's threads (SIEVE_TORCH_THREADS)
    are not BLAS's and are left alone."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def load_components(settings: Settings) -> Components:
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    device = pick_device(settings.device)
    biencoder = load_biencoder(settings, device)
    index = load_index(settings, biencoder, device)  # the local index, or a Qdrant collection
    models = load_stages(settings, device, biencoder, index)
    log.info("loaded %s (%d docs, version %d) on %s; stages with models: %s", served_name(settings), index.size,
             index.version, device, ", ".join(models) or "none")
    precision = lower_precision(settings, biencoder, models)  # after every load: annCUR keeps its fp32 cross-encoder
    if not settings.on_qdrant:
        precision["vector_search"] = flat_search_precision(settings, flat_device(settings, device)).as_dict()
    apply_runtime(device_runtime(settings, device), device, biencoder, models.get("cmc"))  # buckets, streams, graphs
    limits = device_limits(settings, device, biencoder)  # the cross-encoder's passes follow the device too
    searcher = Searcher(biencoder, index, models=models, **searcher_options(settings, limits.ce_batch_tokens))
    single_threaded_blas()  # after every load: threadpoolctl limits the BLAS libraries loaded so far (FAISS's too)
    return Components(searcher, str(device), precision, limits)


def lower_precision(settings: Settings, biencoder: TextEncoder, models: dict) -> dict[str, dict]:
    """Puts the lower-precision query towers and CMC layers in place (models/precision.py) and a lowered copy of the
    in-process cross-encoder into `models` (a remote one is left alone); returns every stage's record."""
    cmc = models.get("cmc")
    cross_encoder = models.get("ce") if isinstance(models.get("ce"), CrossEncoder) else None
    module, choice = lower_query_tower(biencoder, settings.precision)
    biencoder.query_module, record = module, {"bi_encoder_query": choice.as_dict()}
    record["bi_encoder_documents"] = lower_documents(settings, biencoder)  # live writes
    if cmc is not None:
        cmc.model, choice = lower_cmc(cmc, biencoder, settings.precision)
        record["cmc"] = choice.as_dict()
        if cmc.query_tower is not biencoder:  # a trained query tower of its own
            cmc.query_tower.query_module, choice = lower_query_tower(cmc.query_tower, settings.precision)
            record["cmc_query"] = choice.as_dict()
    if cross_encoder is not None:
        models["ce"], choice = lower_cross_encoder(cross_encoder, settings.precision, settings.ce_runtime)
        record["cross_encoder"] = choice.as_dict()
    for stage, rec in record.items():
        if stage != "bi_encoder_documents":  # logged by lower_documents
            log.info("precision %s: %s (%s)", stage, rec["dtype"], rec["reason"])
    return record
