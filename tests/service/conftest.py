from __future__ import annotations

import pytest

from sieve.index import build_index, read_beir_corpus
from tests.conftest import DEMO_CORPUS
from tests.server import Server


@pytest.fixture(scope="session")
def demo_index(tmp_path_factory, biencoder, cache_dir):
    path = tmp_path_factory.mktemp("demo-index")
    build_index(read_beir_corpus(DEMO_CORPUS), biencoder, path, cache_dir=cache_dir, progress=False)
    return path


@pytest.fixture(scope="session")
def server(demo_index, tmp_path_factory):
    srv = Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_RERANK_MAX_DOCUMENTS": "50",
                  "SIEVE_RERANK_MAX_TOKENS": "12000"},
                 tmp_path_factory.mktemp("logs") / "server.log")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def ce_server(demo_index, ce_checkpoint, tmp_path_factory):
    srv = Server({"SIEVE_INDEX_DIR": str(demo_index), "SIEVE_CROSS_ENCODER_PATH": str(ce_checkpoint),
                  "SIEVE_QUERY_OVERFLOW": "reject"},
                 tmp_path_factory.mktemp("logs") / "ce-server.log")
    yield srv
    srv.stop()


@pytest.fixture()
def client(server):
    with server.client() as c:
        yield c


# -- real Redis (the machine's, on 6379: a key prefix of our own, never FLUSHALL) --------------------------------
REDIS_URL = "redis://127.0.0.1:6379/0"


def redis_or_skip():
    import os

    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"Redis at {REDIS_URL} is not answering in CI: {exc}")
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    return client


@pytest.fixture(scope="session")
def redis_prefix():
    """A prefix of this session's own; its keys are deleted at the end."""
    import uuid

    client = redis_or_skip()
    prefix = f"sieve-test-{uuid.uuid4().hex[:8]}:"
    yield prefix
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture()
def index_copy(demo_index, tmp_path):
    """A private copy of the demo index for tests that write to it."""
    import shutil

    target = tmp_path / "index"
    shutil.copytree(demo_index, target)
    return target


# Each test takes keys of its own (fresh_key), so no test ever meets a rate-limit bucket another test spent: the
# guarded server accepts every key of both pools, one pool given in SIEVE_API_KEYS and one in SIEVE_API_KEYS_FILE.
ENV_KEYS = [f"key-env-{i:03d}-0123456789" for i in range(200)]
FILE_KEYS = [f"key-file-{i:03d}-0123456789" for i in range(200)]
API_KEYS = ENV_KEYS + FILE_KEYS
_unused = {"env": iter(ENV_KEYS), "file": iter(FILE_KEYS)}


@pytest.fixture()
def fresh_key():
    """`fresh_key()` -> a key no other test has used (from SIEVE_API_KEYS; `fresh_key("file")`: from the file)."""
    return lambda source="env": next(_unused[source])


_addresses = iter(f"127.0.{i // 250}.{2 + i % 250}" for i in range(250 * 200))


@pytest.fixture()
def fresh_address():
    """`fresh_address()` -> a loopback address (127.0.x.y) no other test connects from: per-address buckets (calls
    without a key, failed keys) are the test's own."""
    return lambda: next(_addresses)


@pytest.fixture(scope="session")
def guarded_server(demo_index, tmp_path_factory, redis_prefix):
    """API keys, a Redis-backed cache and rate limit (5/s, burst 5 per key), a 64 KiB body limit, a writable index."""
    import shutil

    index = tmp_path_factory.mktemp("guarded") / "index"
    shutil.copytree(demo_index, index)
    keys_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys_file.write_text("\n".join(FILE_KEYS) + "\n")
    srv = Server({"SIEVE_INDEX_DIR": str(index), "SIEVE_REDIS_URL": REDIS_URL, "SIEVE_REDIS_PREFIX": redis_prefix,
                  "SIEVE_API_KEYS": ",".join(ENV_KEYS), "SIEVE_API_KEYS_FILE": str(keys_file),
                  "SIEVE_RATE_LIMIT_PER_S": "5", "SIEVE_RATE_LIMIT_BURST": "5", "SIEVE_MAX_BODY_BYTES": "65536",
                  "SIEVE_LOG_LEVEL": "debug"},
                 tmp_path_factory.mktemp("logs") / "guarded-server.log")
    yield srv
    srv.stop()


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture()
def own_redis(tmp_path):
    """A private redis-server on a free port (never the machine's 6379): tests may kill, stop or stall it."""
    import shutil
    import subprocess
    import time

    from tests.server import free_port

    binary = shutil.which("redis-server")
    if binary is None:
        if __import__("os").environ.get("CI"):
            pytest.fail("redis-server is missing in CI")
        pytest.skip("redis-server is not installed")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True).stdout.strip() == "PONG":
            break
        time.sleep(0.1)
    yield proc, port
    if proc.poll() is None:
        import signal

        proc.send_signal(signal.SIGCONT)  # a test that stalled it may have failed before resuming it
        proc.kill()
        proc.wait()
