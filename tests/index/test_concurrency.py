from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from sieve.index import SearchIndex


def test_concurrent_reads_match_sequential(built: Path, docs, encoder) -> None:
    queries = encoder.encode_queries([d.full_text for d in docs[:40]])
    with SearchIndex.load(built) as index:
        expected = [index.search(queries[i:i + 1], 5) for i in range(40)]

        def work(i: int) -> None:
            scores, rows = index.search(queries[i:i + 1], 5)
            np.testing.assert_array_equal(rows, expected[i][1])
            wanted = rows[0].tolist()
            assert [d.id for d in index.documents(wanted)] == index.ids(wanted)
            assert index.documents([i])[0] == docs[i]
            np.testing.assert_allclose(index.embeddings([i]), queries[i:i + 1], atol=1e-6)

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(work, [i % 40 for i in range(400)]))
