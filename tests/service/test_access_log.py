"""The access log (service/access_log.py): uvicorn's text from the lean formatter, and SIEVE_ACCESS_LOG=false."""
from __future__ import annotations

import io
import logging
import logging.config
import re

import pytest
from uvicorn.logging import AccessFormatter

from sieve.service.access_log import UVICORN_FORMAT, LeanAccessFormatter, log_config
from tests.server import Server

ACCESS_MSG = '%s - "%s %s HTTP/%s" %d'
ARGS = [("127.0.0.1:5555", "POST", "/search", "1.1", 200), ("", "GET", "/x?[query not logged]", "1.0", 599),
        ("[::1]:3", "GET", "/documents/a%22b", "2", 404), ("10.0.0.1:80", "POST", "/v2/rerank", "1.1", 429)]


def record(args, level=logging.INFO, msg=ACCESS_MSG) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.access", level, __file__, 1, msg, args, None)


@pytest.mark.parametrize("level", [logging.INFO, logging.WARNING, logging.DEBUG])
@pytest.mark.parametrize("args", ARGS)
def test_the_lean_line_is_uvicorns_line(args, level):
    uvicorn = AccessFormatter(fmt=UVICORN_FORMAT, use_colors=False)
    lean = LeanAccessFormatter(fmt=UVICORN_FORMAT, use_colors=False)
    assert lean.lean
    assert lean.format(record(args, level)) == uvicorn.format(record(args, level))
    assert lean.format(record(args, level)) == uvicorn.format(record(args, level))  # the phrase's cached copy too


def test_colours_or_another_format_are_uvicorns():
    args = ARGS[0]
    coloured = LeanAccessFormatter(fmt=UVICORN_FORMAT, use_colors=True)
    assert not coloured.lean
    assert coloured.format(record(args)) == AccessFormatter(fmt=UVICORN_FORMAT, use_colors=True).format(record(args))
    assert "\x1b[" in coloured.format(record(args))
    own = '%(asctime)s %(client_addr)s "%(request_line)s" %(status_code)s'
    mine = LeanAccessFormatter(fmt=own, use_colors=False)
    assert not mine.lean and mine.format(record(args)).endswith('127.0.0.1:5555 "POST /search HTTP/1.1" 200 OK')


def test_log_config_writes_access_lines_through_the_lean_formatter():
    config = log_config()
    config["handlers"]["access"]["stream"] = stream = io.StringIO()
    loggers = [logging.getLogger(name) for name in config["loggers"]]
    before = [(lg.handlers[:], lg.level, lg.propagate) for lg in loggers]  # restored: other tests' loggers as found
    logging.config.dictConfig(config)
    try:
        access = logging.getLogger("uvicorn.access")
        assert isinstance(access.handlers[0].formatter, LeanAccessFormatter)
        access.info(ACCESS_MSG, *ARGS[0])
        assert stream.getvalue() == 'INFO:     127.0.0.1:5555 - "POST /search HTTP/1.1" 200 OK\n'
    finally:
        for lg, (handlers, level, propagate) in zip(loggers, before):
            lg.handlers[:], lg.level, lg.propagate = handlers, level, propagate


def test_access_log_off_writes_no_line_and_answers(demo_index, tmp_path):
    """SIEVE_ACCESS_LOG=false, one worker (the path of `sieve serve` without the supervisor): requests answered, no
    access line; the same server's start-up lines are there (the log is written at all)."""
    log = tmp_path / "server.log"
    srv = Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_ACCESS_LOG": "false", "SIEVE_WORKERS": "1"}, log)
    try:
        with srv.client() as client:
            assert client.post("/search", json={"query": "stars", "top_k": 3}).status_code == 200
            assert client.get("/readyz").status_code == 200
    finally:
        srv.stop()
    text = log.read_text()
    assert "Uvicorn running on" in text or "Application startup complete" in text, text[-2000:]
    assert not re.search(r'"(GET|POST) /\S* HTTP/1\.1" \d{3}', text), text[-2000:]
