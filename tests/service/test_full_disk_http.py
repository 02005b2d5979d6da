"""Defect 5 of issue 13: the index on a filesystem that fills up during a write. The write must fail with a clear
507, the server must keep serving, the index on disk must stay loadable, and writes work again once there is space.
The filesystem is a 2 MiB tmpfs the test mounts itself (the CI container runs as root)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from sieve.index import SearchIndex
from tests.server import Server

DISK = "2m"
LEFT_FREE = 48 * 1024  # bytes left after the filler: far less than one more version of the demo index


@pytest.fixture()
def small_disk(tmp_path):
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)]).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=True)


def fill(path, leave: int) -> None:
    """A file that takes all but `leave` bytes of the filesystem."""
    st = os.statvfs(path.parent)
    size = st.f_bavail * st.f_frsize - leave
    with open(path, "wb") as f:
        for _ in range(size // 65536):
            f.write(b"\0" * 65536)
        f.flush()
        os.fsync(f.fileno())


def test_a_write_that_fills_the_disk_answers_507_and_the_server_keeps_serving(small_disk, demo_index, tmp_path):
    index_dir = small_disk / "index"
    shutil.copytree(demo_index, index_dir)
    with SearchIndex.load(index_dir) as index:
        version, size = index.version, index.size
    server = Server({"SIEVE_INDEX_DIR": str(index_dir), "SIEVE_WRITE_BATCH_WAIT_MS": "5"}, tmp_path / "server.log")
    try:
        with server.client(timeout=60) as client:
            fill(small_disk / "filler", LEFT_FREE)
            docs = [{"id": f"full-{i}", "text": f"a note that will not fit {i} " * 20} for i in range(40)]
            r = client.post("/documents", json={"documents": docs})
            assert r.status_code == 507, r.text
            assert r.json()["error"]["code"] == "insufficient_storage" and "space" in r.json()["error"]["message"]
            assert server.proc.poll() is None, "the server died on a full disk"
            assert client.post("/search", json={"query": "volcanoes", "top_k": 3}).status_code == 200
            with SearchIndex.load(index_dir) as index:
                assert (index.version, index.size) == (version, size)
            assert not [p.name for p in (index_dir / "versions").iterdir() if p.name.startswith(".tmp-")]

            (small_disk / "filler").unlink()  # space again: the same write now succeeds
            r = client.post("/documents", json={"documents": docs})
            assert r.status_code == 200, r.text
            assert client.get("/documents/full-39").status_code == 200
    finally:
        server.stop()
