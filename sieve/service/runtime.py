"""Settings -> runtime pieces the components loader and the live-index updater share: the searcher's batching
and deadline options, and opening the live index version with the same checks at start-up and on reload."""
from __future__ import annotations

from sieve.index import SearchIndex
from sieve.index.device_flat import flat_backend
from sieve.models.precision import Choice, cpu_field, native_bf16
from sieve.pipeline.batching import BatchConfig
from sieve.pipeline.first_stage import HybridConfig
from sieve.service.config import Settings


def searcher_options(settings: Settings, ce_batch_tokens: int | None = None) -> dict:
    """`ce_batch_tokens`: the cross-encoder's tokens per pass in force (service/limits.py); None = the setting's."""
    batching = BatchConfig(enabled=settings.batching, max_size=settings.batch_max_size,
                           max_wait_ms=settings.batch_max_wait_ms, cmc_candidates=settings.cmc_batch_candidates,
                           ce_tokens=ce_batch_tokens or settings.ce_batch_tokens, direct_workers=settings.max_inflight)
    hybrid = HybridConfig(depth=settings.hybrid_depth, rrf_k=settings.rrf_k, weight_be=settings.hybrid_weight_be,
                          weight_bm25=settings.hybrid_weight_bm25)
    return {"query_overflow": settings.query_overflow, "batching": batching,
            "stage_budgets_ms": settings.stage_budgets_ms, "hybrid": hybrid}


def flat_device(settings: Settings, device, vendor: str | None = None, family: int | None = None) -> str | None:
    """Where flat segments are searched (index/device_flat.py): on the GPU of a CUDA server; with torch over the
    memory-mapped vectors on a CPU where torch's product pays (torch_product_pays); None (FAISS's exact search) on
    any other CPU and with SIEVE_FLAT_SEARCH_ON_DEVICE=false. `vendor`, `family`: the CPU's vendor id and family
    (/proc/cpuinfo's when None)."""
    if not settings.flat_search_on_device:
        return None
    if device.type == "cuda":
        return str(device)
    vendor = vendor if vendor is not None else cpu_field("vendor_id")
    family = family if family is not None else cpu_family()
    return "cpu" if torch_product_pays(vendor, family) else None


def flat_search_precision(settings: Settings, where: str | None, bf16: bool | None = None) -> Choice:
    """The number format of the flat (exact) vector search for `where` (flat_device's answer): on the CPU a bf16
    copy of the vectors where the CPU multiplies bf16 natively (`bf16`: native_bf16() when None) and both
    SIEVE_PRECISION and SIEVE_FLAT_SEARCH_PRECISION are auto, else the float32 map; fp16 on CUDA."""
    if where is None:
        return Choice("fp32", "FAISS's exact search (float32)")
    if where != "cpu":
        if flat_backend(where, settings.faiss_gpu) == "faiss-gpu":
            return Choice("fp32", "faiss-gpu's flat index (float32)")
        return Choice("fp16", "flat segments' vectors held on the GPU in fp16")
    if "fp32" in (settings.precision, settings.flat_search_precision):
        name = "SIEVE_PRECISION" if settings.precision == "fp32" else "SIEVE_FLAT_SEARCH_PRECISION"
        return Choice("fp32", f"{name}=fp32")
    if not (native_bf16() if bf16 is None else bf16):
        return Choice("fp32", "no native bf16 products on this CPU (AVX-512 BF16 / AMX)")
    return Choice("bf16", "a bf16 copy of flat segments' vectors: native bf16 products on this CPU")


def torch_product_pays(vendor: str, family: int) -> bool:
    """Whether torch's matrix product (MKL's) over the memory-mapped vectors costs less CPU per query than FAISS's
    exact search on this CPU kind, as measured (benchmarks/dense_batch.py, SciFact's 5,183 x 384, top 512, batches
    of 2-32): on Intel Xeon hosts 0.49-0.72x (eleventh session); on AMD EPYC Zen 5 (family 26) 0.67-0.80x
    (`dense_batch_zen5.json`, sixteenth session); on AMD EPYC Zen 3 (family 25 without AVX-512) 0.73-0.97x
    (`dense_batch_zen3.json`, seventeenth session), and a served zero-cost /search 0.93x the server CPU of FAISS's
    (`overhead_zen3_s17_torch.json`); on AMD Zen 4 (family 25 with AVX-512, where FAISS runs its AVX-512 kernels)
    the product alone cost 1.25-1.4x in a loaded server's vector search (twelfth session), but a whole served
    zero-cost /search, where the first stage reads its candidates' inner products from the product's scores instead
    of gathering their vectors (fifteenth session), 0.93x and 0.87x the server CPU of FAISS's in two interleaved runs
    (`overhead_zen4_s28_torch_first.json`, `overhead_zen4_s28_torch.json`, twenty-eighth session). Any AMD before
    family 25 (not measured) and any other vendor keep FAISS (RESULTS.md, issue 32)."""
    if vendor == "GenuineIntel":
        return True
    return vendor == "AuthenticAMD" and family >= 25


def cpu_family() -> int:
    value = cpu_field("cpu family")
    return int(value) if value.isdigit() else 0


def load_index(settings: Settings, biencoder, device, cmc=None) -> SearchIndex:
    """The live version of SIEVE_INDEX_DIR, checked against the bi-encoder (and a separate-mode CMC's store); with
    SIEVE_INDEX_BACKEND=qdrant or qdrant-edge, the Qdrant collection (service/qdrant_service.py)."""
    if settings.on_qdrant:
        from sieve.service.qdrant_service import open_qdrant

        return open_qdrant(settings, biencoder)
    where = flat_device(settings, device)
    index = SearchIndex.load(settings.index_dir, model_name=settings.model_name, model_hash=biencoder.weights_hash,
                             dim=biencoder.dim, use_gpu=settings.faiss_gpu and device.type == "cuda",
                             nprobe=settings.nprobe, ef_search=settings.ef_search, flat_device=where,
                             flat_cpu_dtype=flat_search_precision(settings, where).dtype)
    if cmc is not None and cmc.config.mode == "separate" and not index.has_store("cmc"):
        index.close()
        raise ValueError(f"CMC checkpoint {settings.cmc_path} is in separate mode but the index at "
                         f"{settings.index_dir} has no 'cmc' embedding store; build it with "
                         "`sieve index build ... --cmc-checkpoint` or `sieve index add-store`")
    return index
