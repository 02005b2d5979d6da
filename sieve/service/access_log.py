"""The access log: one line per answered request, the text uvicorn writes ('INFO:     1.2.3.4:5 - "POST /search
HTTP/1.1" 200 OK'), at less cost per line.

uvicorn's AccessFormatter copies every record (copy.copy) and looks its status phrase up in http.HTTPStatus before a
%-format: about 23 of the ~50 µs one line costs in the event loop's thread (RESULTS.md, issue 32, forty-seventh
session). `LeanAccessFormatter` writes the same text from the record's five arguments in one f-string, the phrases
looked up once; with colours (output to a terminal) or another format string it is uvicorn's formatter, unchanged.
`uvicorn_options()` is what `sieve serve` hands uvicorn, in one process and under the supervisor alike: uvicorn's
default logging configuration with this formatter for the access log, and SIEVE_ACCESS_LOG (false: no access line).
"""
from __future__ import annotations

import copy
import http
import logging

from uvicorn.config import LOGGING_CONFIG
from uvicorn.logging import AccessFormatter

from sieve.service.config import Settings

UVICORN_FORMAT = LOGGING_CONFIG["formatters"]["access"]["fmt"]  # '%(levelprefix)s %(client_addr)s - ...'


def status_text(code: int) -> str:
    """'200 OK', '599 ' for a code without a phrase: what uvicorn's AccessFormatter writes without colours."""
    try:
        return f"{code} {http.HTTPStatus(code).phrase}"
    except ValueError:
        return f"{code} "


class LeanAccessFormatter(AccessFormatter):
    """uvicorn's access line without colours, formatted in one step; with colours or another format string, uvicorn's
    AccessFormatter (which, like this one, formats only access records: five arguments)."""

    def __init__(self, fmt: str | None = None, datefmt: str | None = None, style="%", use_colors: bool | None = None):
        super().__init__(fmt=fmt, datefmt=datefmt, style=style, use_colors=use_colors)
        self.lean = not self.use_colors and fmt == UVICORN_FORMAT and style == "%"
        self.statuses: dict[int, str] = {}

    def format(self, record: logging.LogRecord) -> str:
        args = record.args
        if not self.lean or record.exc_info or record.stack_info or not isinstance(args, tuple) or len(args) != 5:
            return super().format(record)
        client, method, path, version, code = args
        status = self.statuses.get(code)
        if status is None:
            status = self.statuses[code] = status_text(int(code))
        level = record.levelname
        return f'{level}:{" " * (8 - len(level))} {client} - "{method} {path} HTTP/{version}" {status}'


def log_config() -> dict:
    """uvicorn's default logging configuration (uvicorn.run's log_config) with the lean access formatter."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["access"]["()"] = f"{__name__}.LeanAccessFormatter"
    return config


def uvicorn_options(settings: Settings) -> dict:
    """The logging arguments of uvicorn.run / uvicorn.Config for these settings."""
    return {"log_level": settings.log_level, "log_config": log_config(), "access_log": settings.access_log}
