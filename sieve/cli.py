"""`sieve` command line: index build/add/delete, serve, demo (build a demo index if needed, then serve), settings."""
from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sieve.research.anncur import cli as anncur_cli
from sieve.research.mix import cli as mix_cli

if TYPE_CHECKING:  # imported where used: `sieve --help` and argument errors import nothing heavy (not even pydantic)
    from sieve.service.config import Settings

DEMO_CORPUS = Path(__file__).with_name("demo_corpus.jsonl")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sieve", description="Sieve multi-stage retrieval service")
    sub = parser.add_subparsers(dest="command", required=True)

    index = sub.add_parser("index", help="build and edit indexes").add_subparsers(dest="index_command", required=True)
    build = index.add_parser("build", help="encode a BEIR corpus.jsonl into an index directory")
    build.add_argument("--corpus", required=True, type=Path)
    build.add_argument("--out", type=Path, help="index directory (the local backend)")
    add_backend_args(build)
    build.add_argument("--recreate", action="store_true", help="--backend qdrant(-edge): replace an existing collection")
    build.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    build.add_argument("--faiss", choices=["auto", "flat", "ivf", "hnsw"], default="auto",
                       help="auto = exact below SIEVE_ANN_MIN_ROWS rows per segment, IVF above; flat = always exact")
    build.add_argument("--nlist", type=int, help="IVF cells (default ~4*sqrt(N))")
    build.add_argument("--hnsw-m", type=int, default=32, help="HNSW neighbours per node")
    build.add_argument("--cmc-checkpoint", type=Path, help="also store the candidate vectors of a separate-mode CMC")
    build.add_argument("--mix-checkpoint", type=Path, help="also store a MixEncoder's context embeddings (store 'mix')")
    build.add_argument("--ce-tokens", action="store_true", help="also store each document's cross-encoder token ids (the configured one, SIEVE_CROSS_ENCODER_PATH, else the shipped one; store 'ce_tokens', float32 local indexes): a /search with the cross-encoder then tokenizes only its query")
    build.add_argument("--no-lexical", action="store_true", help="no BM25 part (retrievers bm25 and hybrid then answer 400)")
    build.add_argument("--lexical-language", help="BM25 analyzer language (SIEVE_LEXICAL_LANGUAGE, default english; 'none')")
    build.add_argument("--lexical-processes", type=positive_int, help="processes that tokenize the BM25 part while the documents are encoded (default: one per CPU from 20,000 documents, one per 5,000 at most; below that none, the tokenizing done after the encoding in this process)")
    build.set_defaults(func=cmd_build)
    add = index.add_parser("add", help="add or replace documents (BEIR jsonl)")
    add.add_argument("--index", type=Path)
    add_backend_args(add)
    add.add_argument("--corpus", required=True, type=Path)
    add.add_argument("--cmc-checkpoint", type=Path, help="needed when the index holds a CMC store")
    add.add_argument("--mix-checkpoint", type=Path, help="needed when the index holds a MixEncoder store")
    add.add_argument("--ce-tokens", action="store_true", help="needed when the index holds the cross-encoder's token ids")
    add.set_defaults(func=cmd_add)
    add_store = index.add_parser("add-store", help="add (or replace) a CMC or MixEncoder store covering every document")
    add_store.add_argument("--index", required=True, type=Path)
    add_store.add_argument("--cmc-checkpoint", type=Path, help="a separate-mode CMC: its candidate vectors")
    add_store.add_argument("--mix-checkpoint", type=Path, help="a MixEncoder: its context embeddings")
    add_store.add_argument("--ce-tokens", action="store_true", help="also store each document's cross-encoder token ids (the configured one, SIEVE_CROSS_ENCODER_PATH, else the shipped one; store 'ce_tokens', float32 local indexes): a /search with the cross-encoder then tokenizes only its query")
    add_store.set_defaults(func=cmd_add_store)
    anncur_cli.register(index)
    delete = index.add_parser("delete", help="delete documents by id")
    delete.add_argument("--index", type=Path)
    add_backend_args(delete)
    delete.add_argument("ids", nargs="+")
    delete.set_defaults(func=cmd_delete)
    compact = index.add_parser("compact", help="merge every segment into one, dropping deleted rows (docs/index.md)")
    compact.add_argument("--index", required=True, type=Path)
    compact.set_defaults(func=cmd_compact)

    serve = sub.add_parser("serve", help="serve an index (settings from SIEVE_* environment variables)")
    add_server_args(serve)
    serve.set_defaults(func=lambda args, settings: run_server(settings))
    demo = sub.add_parser("demo", help="build a demo index (bundled corpus or --corpus) if needed, then serve it")
    demo.add_argument("--corpus", type=Path, default=DEMO_CORPUS, help="BEIR corpus.jsonl (default: bundled demo)")
    add_server_args(demo)
    demo.set_defaults(func=cmd_demo)
    settings = sub.add_parser("settings", help="print the settings in effect (JSON, secrets masked) or their reference")
    settings.add_argument("--markdown", action="store_true",
                          help="the Markdown reference generated from the settings' descriptions (docs/configuration.md)")
    settings.set_defaults(func=cmd_settings)
    register_plugins(sub)
    return parser


def register_plugins(sub) -> None:
    """Training and evaluation commands live beside their code; each module adds its own sub-commands."""
    from sieve.evaluation import cli as eval_cli
    from sieve.training import adapt_cli, feedback_cli
    from sieve.training import cli as train_cli

    mix_cli.register(train_cli.register(sub))
    eval_cli.register(sub)
    adapt_cli.register(sub)
    feedback_cli.register(sub)


def add_server_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--index", type=Path, help="index directory (SIEVE_INDEX_DIR)")
    parser.add_argument("--host", help="bind address (SIEVE_HOST)")
    parser.add_argument("--port", type=int, help="port (SIEVE_PORT)")
    parser.add_argument("--workers", help="worker processes on that port, or auto (SIEVE_WORKERS; docs/deployment.md)")


def add_backend_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=["local", "qdrant", "qdrant-edge"],
                        help="where the index lives (SIEVE_INDEX_BACKEND)")
    parser.add_argument("--qdrant-url", help="Qdrant server URL, directory or :memory: (SIEVE_QDRANT_URL)")
    parser.add_argument("--qdrant-edge-path", type=Path, help="--backend qdrant-edge: the shards' directory "
                                                               "(SIEVE_QDRANT_EDGE_PATH)")
    parser.add_argument("--collection", help="Qdrant collection (SIEVE_QDRANT_COLLECTION)")


def settings_from(args: argparse.Namespace) -> "Settings":
    from sieve.service.config import Settings

    given = {"index_dir": getattr(args, "index", None), "host": getattr(args, "host", None),
             "port": getattr(args, "port", None), "workers": getattr(args, "workers", None),
             "index_backend": getattr(args, "backend", None),
             "qdrant_url": getattr(args, "qdrant_url", None), "qdrant_collection": getattr(args, "collection", None),
             "qdrant_edge_path": getattr(args, "qdrant_edge_path", None)}
    return Settings(**{k: v for k, v in given.items() if v is not None})


def invalid_settings(exc: "pydantic.ValidationError") -> str:
    """One line per rejected setting, named as the operator sets it (SIEVE_<NAME>), with what it was given and
    what it takes."""
    lines = []
    for error in exc.errors(include_url=False):
        name = "SIEVE_" + "_".join(str(part) for part in error["loc"]).upper()
        lines.append(f"sieve: invalid setting {name}={error.get('input')!r}: {error['msg']}")
    return "\n".join(lines) or f"sieve: invalid settings: {exc}"


def needs_dir(path: Path | None, flag: str) -> Path:
    if path is None:
        raise SystemExit(f"sieve index: give {flag} (the local index directory), or --backend qdrant")
    return path


def qdrant_index(settings: Settings):
    from sieve.index.qdrant_backend import QdrantIndex

    index = QdrantIndex(settings.qdrant_config())
    index.load_meta()
    return index


def qdrant_encoded(index, docs, found: dict) -> dict:
    from sieve.index.encoder import checked_embeddings

    stores = ["primary", *(index.load_meta().get("stores") or {})]
    missing = [s for s in stores if s not in found]
    if missing:
        raise SystemExit(f"the collection holds vectors of {missing}: give the checkpoint that encodes them")
    return {s: checked_embeddings(found[s], [d.full_text for d in docs], progress=True) for s in stores}


def encoders(settings: Settings, cmc_checkpoint: Path | None, mix_checkpoint: Path | None = None,
             ce_tokens: bool = False, documents: bool = True) -> dict:
    """The document encoders of an index's stores; `documents`: the bi-encoder will encode documents here, so its
    document tower is lowered first (SIEVE_DOC_PRECISION: a guard run of about a second on a CPU)."""
    from sieve.models.cmc_checkpoint import load_cmc
    from sieve.models.device import pick_device
    from sieve.service.components import load_biencoder, lower_documents

    biencoder = load_biencoder(settings, pick_device(settings.device))
    if documents:
        lower_documents(settings, biencoder)
    found = {"primary": biencoder}
    if cmc_checkpoint:
        bundle = load_cmc(cmc_checkpoint, biencoder)
        if bundle.candidate_tower is None:
            raise SystemExit(f"{cmc_checkpoint} is a shared-mode CMC: it reuses the bi-encoder vectors, no store needed")
        found["cmc"] = bundle.candidate_tower
    if mix_checkpoint:
        from sieve.research.mix.runtime import STORE, MixLengths, MixRuntime

        found[STORE] = MixRuntime.from_pretrained(mix_checkpoint, device=biencoder.device, batch_size=settings.encode_batch_size,
                                                  lengths=MixLengths(settings.query_max_length, settings.doc_max_length))
    if ce_tokens:
        found.update(ce_token_store(settings))
    return found


def ce_token_store(settings: Settings) -> dict:
    """{"ce_tokens": the store encoder} of the configured cross-encoder (models/ce_tokens.py)."""
    from sieve.models import ce_tokens
    from sieve.models.cross_encoder import CrossEncoder

    if settings.on_qdrant:
        raise SystemExit("--ce-tokens: only a local index keeps the cross-encoder's token ids")
    path = settings.resolved_cross_encoder_path()
    if path is None:
        raise SystemExit("--ce-tokens: no cross-encoder is configured (SIEVE_CROSS_ENCODER_PATH)")
    ce = CrossEncoder.from_pretrained(path, lengths=settings.ce_lengths(path))
    if not ce_tokens.supports(ce):
        raise SystemExit(f"--ce-tokens: {path} tokenizes (query, document) text pairs itself; it has no per-document "
                         "token ids to store")
    return {ce_tokens.STORE: ce_tokens.CETokenStore(ce)}


def cmd_build_qdrant(args, settings: Settings, found: dict) -> None:
    from sieve.index import read_beir_corpus
    from sieve.index.qdrant_build import Layout, build_qdrant

    layout = Layout(settings.qdrant_shards, settings.qdrant_replicas, settings.qdrant_write_consistency)
    index = build_qdrant(read_beir_corpus(args.corpus), found, settings.qdrant_config(), lexical=lexical_of(args, settings),
                         layout=layout, cache_dir=settings.cache_dir, recreate=args.recreate)
    print(json.dumps({"qdrant": index.config.location, "collection": index.name, "count": index.size,
                      "version": index.version, "lexical": index.meta["lexical"]}))
    index.close()


def cmd_build(args, settings: Settings) -> None:
    from sieve.index import build_index, read_beir_corpus
    from sieve.index.lexical import build_processes

    if args.ce_tokens and args.dtype != "float32":
        raise SystemExit("--ce-tokens needs --dtype float32 (float16 cannot hold every token id)")
    found = encoders(settings, args.cmc_checkpoint, args.mix_checkpoint, args.ce_tokens)
    if settings.on_qdrant:
        return cmd_build_qdrant(args, settings, found)
    args.out = needs_dir(args.out, "--out")
    params = {"nlist": args.nlist} if args.faiss == "ivf" and args.nlist else {"M": args.hnsw_m} if args.faiss == "hnsw" else {}
    if args.faiss == "auto":
        params = {"ann_min_rows": settings.ann_min_rows, **({"nlist": args.nlist} if args.nlist else {})}
    extra = {k: v for k, v in found.items() if k != "primary"}
    docs, timings = list(read_beir_corpus(args.corpus)), {}
    manifest = build_index(docs, found["primary"], args.out, dtype=args.dtype,
                           faiss_kind=args.faiss, faiss_params=params, cache_dir=settings.cache_dir,
                           extra_stores=extra or None, lexical=lexical_of(args, settings),
                           lexical_processes=args.lexical_processes or build_processes(len(docs)), timings=timings)
    print(json.dumps({"index": str(args.out), "count": manifest.count, "version": manifest.version,
                      "lexical": manifest.lexical or None, "document_precision": found["primary"].doc_precision,
                      "seconds": {part: round(s, 2) for part, s in timings.items()}}))


def lexical_of(args, settings: Settings):
    if args.no_lexical:
        return None
    if args.lexical_language:
        settings = settings.model_copy(update={"lexical_language": args.lexical_language, "lexical_enabled": True})
    return settings.lexical_config()


def cmd_add(args, settings: Settings) -> None:
    from sieve.index import add_documents, read_beir_corpus

    if settings.on_qdrant:  # written through, acknowledged by Qdrant (wait=true)
        index, docs = qdrant_index(settings), read_beir_corpus(args.corpus)
        index.upsert(docs, qdrant_encoded(index, docs, encoders(settings, args.cmc_checkpoint, args.mix_checkpoint)))
        return print(json.dumps({"collection": index.name, "count": index.size, "version": index.version}))
    needs_dir(args.index, "--index")
    manifest = add_documents(args.index, read_beir_corpus(args.corpus),
                             encoders(settings, args.cmc_checkpoint, args.mix_checkpoint, args.ce_tokens))
    manifest = merge_due(args.index, settings) or manifest
    print(json.dumps({"index": str(args.index), "count": manifest.count, "version": manifest.version}))


def cmd_add_store(args, settings: Settings) -> None:
    from sieve.index import add_store

    stores = {k: v for k, v in encoders(settings, args.cmc_checkpoint, args.mix_checkpoint, args.ce_tokens,
                                        documents=False).items() if k != "primary"}
    if not stores:
        raise SystemExit("sieve index add-store: give --cmc-checkpoint, --mix-checkpoint and/or --ce-tokens")
    for name, encoder in stores.items():
        manifest = add_store(args.index, name, encoder, cache_dir=settings.cache_dir)
    print(json.dumps({"index": str(args.index), "stores": sorted(manifest.stores), "version": manifest.version}))


def cmd_delete(args, settings: Settings) -> None:
    from sieve.index import delete_documents

    if settings.on_qdrant:
        index = qdrant_index(settings)
        index.delete(args.ids)
        return print(json.dumps({"collection": index.name, "count": index.size, "version": index.version}))
    needs_dir(args.index, "--index")
    manifest = delete_documents(args.index, args.ids)
    manifest = merge_due(args.index, settings) or manifest
    print(json.dumps({"index": str(args.index), "count": manifest.count, "version": manifest.version}))


def merge_due(index_dir: Path, settings: Settings):
    """Merge segments as the service would after a write; the last merged manifest, or None."""
    from sieve.index import merge_if_due

    policy, last = settings.merge_policy(), None
    while policy is not None and (merged := merge_if_due(index_dir, policy)) is not None:
        last = merged
    return last


def cmd_compact(args, settings: Settings) -> None:
    from sieve.index import compact

    manifest = compact(args.index)
    if manifest is None:
        from sieve.index.layout import current_version_dir
        from sieve.index.manifest import read_manifest

        manifest = read_manifest(current_version_dir(args.index))
    print(json.dumps({"index": str(args.index), "count": manifest.count, "version": manifest.version,
                      "segments": len(manifest.segments)}))


def check_port(settings: Settings) -> None:
    """Ends with one line naming the setting when the address is taken, before seconds of model loading."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            sock.bind((settings.host, settings.port))
        except OSError as exc:
            raise SystemExit(f"sieve: cannot listen on {settings.host}:{settings.port} ({exc.strerror}); another "
                             "process has it: choose another port with --port or SIEVE_PORT") from None


def run_server(settings: Settings) -> None:
    """One process: loads models and index before uvicorn starts, so a bad index or model ends with one clear line.
    Several (SIEVE_WORKERS, or the automatic choice): service/workers.py, each worker loading its own."""
    import os

    import uvicorn

    from sieve.service import supervisor, workers

    check_port(settings)
    plan = workers.plan(settings)
    if plan.count > 1:
        supervisor.serve(settings, plan)
        return
    os.environ[workers.CHOSEN_ENV] = plan.chosen  # /readyz says how the count was chosen
    settings = settings.model_copy(update={"workers": 1})
    from sieve.service.app import create_app
    from sieve.service.components import load_components

    components = load_components(settings)
    app = create_app(settings, loader=lambda _: components, served_process=True)
    from sieve.service import access_log
    from sieve.service.connections import bounded_protocol

    # httptools (C parser) where installed; the protocol bounds the size and time of request line + headers
    # on SIGTERM, requests in flight finish within their deadline (partial answers); this bounds the wait anyway
    grace_s = (settings.default_timeout_ms or 30_000) / 1000 + 5
    rejected = app.state.metrics.rejected
    protocol = bounded_protocol(settings.header_timeout_s, lambda reason: rejected.labels(reason=reason).inc(),
                                settings.http_parser)
    uvicorn.run(app, host=settings.host, port=settings.port, **access_log.uvicorn_options(settings), http=protocol,
                h11_max_incomplete_event_size=settings.max_header_bytes, timeout_graceful_shutdown=grace_s)


def cmd_settings(args, settings: Settings) -> None:
    from sieve.service import settings_doc

    print(settings_doc.render(settings_doc.settings_sections()) if args.markdown else settings.model_dump_json(indent=2),
          end="" if args.markdown else "\n")


def cmd_demo(args, settings: Settings) -> None:
    """Builds the index only when it is missing or was built from another corpus or model, then serves it."""
    from sieve.index import IndexNotFoundError, IndexMismatchError, SearchIndex, build_index, corpus_hash, read_beir_corpus

    check_port(settings)
    docs = read_beir_corpus(args.corpus)
    found = encoders(settings, None, documents=False)["primary"]
    try:
        live = SearchIndex.load(settings.index_dir, model_name=settings.model_name, model_hash=found.weights_hash, dim=found.dim)
        stale = live.manifest.corpus_hash != corpus_hash(docs) or live.has_lexical != settings.lexical_enabled
        live.close()
    except (IndexNotFoundError, IndexMismatchError):
        stale = True
    if stale:
        print(f"building the demo index at {settings.index_dir} from {args.corpus} ({len(docs)} documents)", file=sys.stderr)
        from sieve.service.components import lower_documents

        lower_documents(settings, found)
        build_index(docs, found, settings.index_dir, cache_dir=settings.cache_dir, lexical=settings.lexical_config())
    run_server(settings)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.command_line = shlex.join(["sieve", *argv])  # recorded in model cards and result files
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # its CPU-feature probing is noise to users
    logging.getLogger("bm25s").setLevel(logging.WARNING)  # a DEBUG line per BM25 build
    from pydantic import ValidationError  # here, not at the top: `sieve --help` imports nothing heavy

    try:
        settings = settings_from(args)
    except ValidationError as exc:  # a SIEVE_* variable or flag out of range: name it, no traceback
        raise SystemExit(invalid_settings(exc)) from None
    try:
        args.func(args, settings)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise SystemExit(f"sieve: {exc}") from None


if __name__ == "__main__":
    main()
