"""Loads the models and the index named by the settings: called once, from the app's lifespan or the CLI."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from sieve.index import SearchIndex
from sieve.models.cmc_checkpoint import CMCBundle, load_cmc, untrained_cmc
from sieve.models.cross_encoder import CrossEncoder, PairLengths
from sieve.models.device import pick_device
from sieve.models.precision_stages import lower_cmc, lower_cross_encoder, lower_query_tower
from sieve.models.text_encoder import EncoderLengths, TextEncoder
from sieve.pipeline.anncur_stage import AnnCUR
from sieve.pipeline.searcher import Searcher
from sieve.service.config import Settings
from sieve.service.runtime import searcher_options

log = logging.getLogger("sieve")


@dataclass
class Components:
    searcher: Searcher
    device: str
    precision: dict[str, dict] = field(default_factory=dict)  # stage -> models.precision.Choice.as_dict()

    def model_names(self) -> dict[str, str | None]:
        s = self.searcher
        return {"bi_encoder": s.biencoder.name, "cmc": s.cmc.name if s.cmc else None,
                "cross_encoder": s.cross_encoder.name if s.cross_encoder else None,
                "anncur": s.anncur.cross_encoder.name if s.anncur else None,
                "late_cross_encoder": s.late_ce.name if s.late_ce else None, "mix": s.mix.name if s.mix else None}

    def close(self) -> None:
        self.searcher.close()
        self.searcher.index.close()
        if self.searcher.anncur:
            self.searcher.anncur.index.close()


def load_biencoder(settings: Settings, device: torch.device) -> TextEncoder:
    lengths = EncoderLengths(settings.query_max_length, settings.doc_max_length)
    return TextEncoder.from_pretrained(settings.resolved_model_path(), name=settings.model_name, lengths=lengths,
                                       device=device, batch_size=settings.encode_batch_size)


def load_components(settings: Settings) -> Components:
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    device = pick_device(settings.device)
    biencoder = load_biencoder(settings, device)
    index = SearchIndex.load(settings.index_dir, model_name=settings.model_name, model_hash=biencoder.weights_hash,
                             dim=biencoder.dim, use_gpu=settings.faiss_gpu and device.type == "cuda",
                             nprobe=settings.nprobe, ef_search=settings.ef_search)
    cmc = load_cmc_stage(settings, biencoder, index) if settings.cmc_enabled else None
    cross_encoder = None
    if (ce_path := settings.resolved_cross_encoder_path()) is not None:
        cross_encoder = CrossEncoder.from_pretrained(
            ce_path, lengths=settings.ce_lengths(ce_path),
            device=device, batch_size=settings.ce_batch_size)
    anncur = load_anncur(settings, device, cross_encoder)  # annCUR keeps the fp32 cross-encoder its index was built with
    cross_encoder, precision = lower_precision(settings, biencoder, cmc, cross_encoder)  # precision (docs/performance.md)
    log.info("loaded index %s (%d docs, version %d) on %s", settings.index_dir, index.size, index.version, device)
    late_ce, mix = load_late_ce(settings, device), load_mix(settings, device, index)
    searcher = Searcher(biencoder, index, cmc, cross_encoder, anncur=anncur, mix=mix, late_ce=late_ce,
                        **searcher_options(settings))
    return Components(searcher, str(device), precision)


def lower_precision(settings: Settings, biencoder: TextEncoder, cmc: CMCBundle | None,
                    cross_encoder: CrossEncoder | None) -> tuple[CrossEncoder | None, dict[str, dict]]:
    """Puts the lower-precision query towers and CMC layers in place (models/precision.py); the cross-encoder to
    serve /search and /rerank with, and every stage's record."""
    module, choice = lower_query_tower(biencoder, settings.precision)
    biencoder.query_module, record = module, {"bi_encoder_query": choice.as_dict()}
    if cmc is not None:
        cmc.model, choice = lower_cmc(cmc, biencoder, settings.precision)
        record["cmc"] = choice.as_dict()
        if cmc.query_tower is not biencoder:  # a trained query tower of its own
            cmc.query_tower.query_module, choice = lower_query_tower(cmc.query_tower, settings.precision)
            record["cmc_query"] = choice.as_dict()
    if cross_encoder is not None:
        cross_encoder, choice = lower_cross_encoder(cross_encoder, settings.precision)
        record["cross_encoder"] = choice.as_dict()
    for stage, rec in record.items():
        log.info("precision %s: %s (%s)", stage, rec["dtype"], rec["reason"])
    return cross_encoder, record


def load_late_ce(settings: Settings, device: torch.device) -> CrossEncoder | None:
    """The second cross-encoder (ce_model=ce_late), with the pair lengths of the settings or its training."""
    if settings.late_ce_path is None:
        return None
    return CrossEncoder.from_pretrained(settings.late_ce_path, device=device, batch_size=settings.ce_batch_size,
                                        lengths=settings.ce_lengths(settings.late_ce_path))


def load_mix(settings: Settings, device: torch.device, index) -> "MixRuntime | None":
    """The MixEncoder, refused unless the index holds the context embeddings this very checkpoint computed."""
    if settings.mix_path is None:
        return None
    from sieve.models.mix_runtime import STORE, MixLengths, MixRuntime

    mix = MixRuntime.from_pretrained(settings.mix_path, device=device, batch_size=settings.encode_batch_size,
                                     lengths=MixLengths(settings.query_max_length, settings.doc_max_length))
    built = index.manifest.stores.get(STORE)
    if built is None or built["model_hash"] != mix.weights_hash:
        found = "has no 'mix' store" if built is None else f"has a 'mix' store from another model ({built['model_name']})"
        raise ValueError(f"SIEVE_MIX_PATH={settings.mix_path} needs its context embeddings in the index, but the index "
                         f"at {settings.index_dir} {found}; run `sieve index add-store --index {settings.index_dir} "
                         f"--mix-checkpoint {settings.mix_path}`")
    return mix


def index_corpus_hash(settings: Settings) -> str:
    from sieve.index.layout import current_version_dir
    from sieve.index.manifest import read_manifest

    return read_manifest(current_version_dir(settings.index_dir)).corpus_hash


def load_cmc_stage(settings: Settings, biencoder: TextEncoder, index) -> CMCBundle:
    """The configured CMC checkpoint, else the shipped default, else (or with SIEVE_CMC_PATH=untrained) the identity
    CMC. The shipped default was trained on the packaged bi-encoder's vectors: with another bi-encoder it does not
    apply, and the untrained CMC is served instead (said in the log); an explicitly configured one must fit."""
    path = settings.resolved_cmc_path()
    if path is None:
        # an untrained query tower equals the bi-encoder: share it, and the searcher encodes the query once
        return untrained_cmc(biencoder, share_query_tower=True)
    try:
        cmc = load_cmc(path, biencoder)
    except ValueError as exc:
        if settings.cmc_path is not None:
            raise
        log.warning("the shipped CMC does not fit the configured bi-encoder (%s); serving the untrained CMC", exc)
        return untrained_cmc(biencoder, share_query_tower=True)
    if cmc.config.mode == "separate" and not index.has_store("cmc"):
        raise ValueError(f"CMC checkpoint {path} is in separate mode but the index at {settings.index_dir} has no "
                         "'cmc' embedding store; build it with `sieve index build ... --cmc-checkpoint` or "
                         "`sieve index add-store`")
    return cmc


def load_anncur(settings: Settings, device: torch.device, cross_encoder: CrossEncoder | None) -> AnnCUR | None:
    """The annCUR index and the cross-encoder that built it, run with the pair lengths it was built with (other
    lengths give other scores than the ones its item embeddings approximate)."""
    if settings.anncur_dir is None:
        return None
    from sieve.index.anncur import AnnCURIndex

    path = settings.anncur_cross_encoder_path or settings.resolved_cross_encoder_path()
    if path is None:
        raise ValueError("SIEVE_ANNCUR_DIR is set but no cross-encoder is: set SIEVE_ANNCUR_CROSS_ENCODER_PATH (or "
                         "SIEVE_CROSS_ENCODER_PATH) to the checkpoint that built the annCUR index")
    anncur = AnnCURIndex.load(settings.anncur_dir, use_gpu=settings.faiss_gpu and device.type == "cuda",
                              nprobe=settings.nprobe, ef_search=settings.ef_search)
    built = anncur.record["cross_encoder"]
    default = settings.ce_lengths(path)
    lengths = PairLengths(built.get("query_max_length") or default.query_max_length,
                          built.get("max_length") or default.max_length)
    reuse = cross_encoder is not None and path == settings.resolved_cross_encoder_path() and cross_encoder.lengths == lengths
    ce = cross_encoder if reuse else CrossEncoder.from_pretrained(path, lengths=lengths, device=device,
                                                                  batch_size=settings.ce_batch_size)
    if anncur.corpus_hash != index_corpus_hash(settings):
        log.warning("the annCUR index at %s covers other documents than %s holds now: retriever anncur answers 400 "
                    "until it is rebuilt with `sieve index anncur`", settings.anncur_dir, settings.index_dir)
    if ce.weights_hash != anncur.index.manifest.model_hash:
        anncur.close()
        raise ValueError(f"the annCUR index at {settings.anncur_dir} was built by cross-encoder "
                         f"{built.get('name')!r} (weights sha256 {anncur.index.manifest.model_hash[:12]}...), not by "
                         f"{path}; point SIEVE_ANNCUR_CROSS_ENCODER_PATH at that one or rebuild with `sieve index anncur`")
    return AnnCUR(anncur, ce)
