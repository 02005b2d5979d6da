"""The append-only feedback log: records read back in order, a torn last line (a crash mid-write) skipped, and the
retention limit deleting the oldest segments first."""
from __future__ import annotations

from sieve.feedback.log import AppendLog, read_records


def test_records_read_back_and_a_torn_line_is_skipped(tmp_path):
    log = AppendLog(tmp_path, "events", retention_bytes=10**9)
    assert log.append([{"n": 1}, {"n": 2}]) == 2
    log.append([{"n": 3}])
    log.close()
    (segment,) = log.segments()
    with open(segment, "ab") as handle:
        handle.write(b'{"n": 4')  # the process died here: never acknowledged
    assert [r["n"] for r in read_records(tmp_path, "events")] == [1, 2, 3]


def test_retention_deletes_the_oldest_segments(tmp_path):
    log = AppendLog(tmp_path, "events", retention_bytes=3000, segment_bytes=1000)
    for n in range(100):
        log.append([{"n": n, "pad": "x" * 80}])
    log.close()
    kept = [r["n"] for r in read_records(tmp_path, "events")]
    assert sum(p.stat().st_size for p in log.segments()) <= 3000 + 1000  # the limit, plus the segment being written
    assert kept == list(range(kept[0], 100)) and kept[0] > 50  # the newest kept, in order, the oldest gone
