"""App factory: the lifespan loads models and index once; handlers only see what it put on app.state."""
from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import Callable

from fastapi import FastAPI, Request

from service.components import Components, load_components
from service.config import Settings
from service.errors import install_error_handlers
from service.metrics import Metrics
from service.routes import router

DESCRIPTION = """Sieve: bi-encoder retrieval over FAISS, CMC reranking of the candidates in context of each other,
and an optional cross-encoder. `POST /search` for applications, `POST /rerank` for candidate lists from elsewhere."""


def count_requests(app: FastAPI) -> None:
    @app.middleware("http")
    async def counter(request: Request, call_next):
        status = 500  # an exception escaping the handlers is answered 500 by the outermost middleware
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            endpoint = getattr(request.scope.get("route"), "path", "unmatched")  # the route template, never the raw URL
            app.state.metrics.requests.labels(endpoint=endpoint, status=str(status)).inc()


def create_app(settings: Settings | None = None,
               loader: Callable[[Settings], Components] = load_components) -> FastAPI:
    """`loader` is the seam for tests that need a fake model; production uses load_components."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.components = loader(settings)
        app.state.metrics.index_size.set(app.state.components.searcher.index.size)
        yield
        app.state.components.close()

    app = FastAPI(title="Sieve", version="0.1.0", description=DESCRIPTION, lifespan=lifespan)
    app.state.settings = settings
    app.state.metrics = Metrics()
    install_error_handlers(app)
    count_requests(app)
    app.include_router(router)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return app
