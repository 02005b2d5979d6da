"""Errors a request can cause. The HTTP layer maps each to a 4xx; every message says what is allowed."""
from __future__ import annotations


class RequestError(ValueError):
    """The request asks for something that cannot be done as asked (HTTP 422 by default)."""

    status_code = 422
    code = "invalid_request"

    def __init__(self, message: str, *, field: str | None = None, allowed: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.allowed = allowed


class StageUnavailable(RequestError):
    """A stage was asked for that this server has not loaded (e.g. no cross-encoder configured)."""

    status_code = 400
    code = "stage_unavailable"


class UnknownDocuments(RequestError):
    status_code = 422
    code = "unknown_document_ids"


class QueryTooLong(RequestError):
    status_code = 413
    code = "query_too_long"


class TooMuchWork(RequestError):
    """The request asks the models to read more tokens than this server allows one request."""

    status_code = 413
    code = "too_much_work"


class EncoderTimeout(Exception):
    """The query encoder gave no vector within the request's deadline and as long again, or the client hung up
    first (HTTP 503 `encoder_timeout`: the server's doing, not the request's). No ranking can start without it.
    `client_gone`: the client hung up (nobody reads the answer; not a server fault)."""

    def __init__(self, message: str, client_gone: bool = False):
        super().__init__(message)
        self.client_gone = client_gone
