"""Live index updates (thin handlers over service/updates.py) and document look-up."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request

from sieve.index import Document
from sieve.pipeline.errors import RequestError
from sieve.service import schemas
from sieve.service.routes import ComponentsDep, ERRORS, Guarded, MetricsDep, SettingsDep, check_limit, hang_up
from sieve.service.updates import IndexUpdater

router = APIRouter()
WRITE_ERRORS = {**ERRORS, **{code: {"model": schemas.ErrorResponse} for code in (404, 409, 507)}}  # 507: disk full
DocId = Annotated[str, Path(min_length=1, max_length=schemas.DOC_ID_MAX_CHARS, description="Document id.")]


def get_updater(request: Request) -> IndexUpdater:
    return request.app.state.updater


UpdaterDep = Annotated[IndexUpdater, Depends(get_updater)]


def waiting(request: Request, settings) -> tuple:
    """How long a write request waits for its write (SIEVE_WRITE_TIMEOUT_S) and its client's hang-up event: past
    either, 503 `write_pending` (service/updates.py WritePending)."""
    return settings.write_timeout_s, hang_up(request)


@router.post("/documents", response_model=schemas.WriteResponse, responses=WRITE_ERRORS, tags=["documents"],
             dependencies=Guarded)
def add_documents(body: schemas.DocumentsRequest, request: Request, updater: UpdaterDep, settings: SettingsDep,
                  metrics: MetricsDep):
    """Add or replace documents. Acknowledged = durable on disk and visible to the next search."""
    check_limit(len(body.documents), settings.documents_max_batch, "documents", "SIEVE_DOCUMENTS_MAX_BATCH")
    ids = [d.id for d in body.documents]
    if len(set(ids)) != len(ids):
        raise RequestError("document ids repeat within the request", field="documents", allowed="unique ids")
    result = updater.upsert([Document(d.id, d.title, d.text) for d in body.documents], *waiting(request, settings))
    metrics.index_writes.labels(op="upsert").inc(len(ids))
    return schemas.WriteResponse(**result)


@router.delete("/documents/{doc_id}", response_model=schemas.WriteResponse, responses=WRITE_ERRORS,
               tags=["documents"], dependencies=Guarded)
def delete_document(doc_id: DocId, request: Request, updater: UpdaterDep, settings: SettingsDep, metrics: MetricsDep):
    """Delete one document (404 when the id is not indexed)."""
    result = updater.delete(doc_id, *waiting(request, settings))
    metrics.index_writes.labels(op="delete").inc()
    return schemas.WriteResponse(**result)


@router.get("/documents/{doc_id}", response_model=schemas.DocumentResponse, responses=WRITE_ERRORS,
            tags=["documents"], dependencies=Guarded)
def get_document(doc_id: DocId, components: ComponentsDep):
    """One indexed document, from the live version."""
    index = components.searcher.index
    doc = index.documents(index.rows_for_ids([doc_id]))[0]
    return schemas.DocumentResponse(id=doc.id, title=doc.title, text=doc.text, index_version=index.version)


@router.post("/admin/index/reload", response_model=schemas.ReloadResponse, responses=WRITE_ERRORS, tags=["admin"],
             dependencies=Guarded)
def reload_index(request: Request, updater: UpdaterDep, settings: SettingsDep):
    """Serve the newest version on disk (e.g. after `sieve index add`); in-flight requests finish on the old one."""
    return schemas.ReloadResponse(**updater.reload(*waiting(request, settings)))
