"""A batch's vector search that scored every row (index/search_index.py `search_scored`, torch's matrix product on
the CPU): the hybrid stage reads its candidates' inner products from those scores and reads no vector, and CMC's
runner gathers the candidates' vectors straight into its padded batch (pipeline/packing.py `IndexRows`). The same
candidates, and the same scores within float tolerance, as the path that reads the vectors in the request."""
from __future__ import annotations

import numpy as np
import torch

from sieve.index import SearchIndex
from sieve.models.cmc import CMC, CMCConfig, randomize_gates
from sieve.models.cmc_checkpoint import CMCBundle
from sieve.pipeline.dense_batch import DenseWant, encode_then_search
from sieve.pipeline.evidence import FEATURES
from sieve.pipeline.first_stage import HybridRetrieve
from sieve.pipeline.packing import IndexRows
from sieve.pipeline.stages import CMCRerank
from sieve.pipeline.state import QueryState

QUERIES = ["how do volcanoes erupt", "ocean tides and the moon", "photosynthesis in plants", "black holes"]
K = 30


def evidence_cmc(biencoder) -> CMCBundle:
    torch.manual_seed(0)
    model = randomize_gates(CMC(CMCConfig(dim=biencoder.dim, evidence=len(FEATURES))).eval())
    with torch.no_grad():  # the vectors count too (an untrained evidence CMC ranks by the first stage alone)
        model.evidence.cmc_weight.fill_(1.0)
        model.evidence.linear.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
    return CMCBundle(model.cfg, model, biencoder, None, "cmc-test", biencoder.weights_hash)


def test_hybrid_reads_inner_products_from_the_scored_rows_and_cmc_gathers_the_vectors(demo_index_dir, biencoder):
    bundle = evidence_cmc(biencoder)
    with SearchIndex.load(demo_index_dir, flat_device="cpu") as index, SearchIndex.load(demo_index_dir) as plain:
        encoded = encode_then_search(biencoder, [(q, DenseWant(index, K)) for q in QUERIES])  # one batch of four
        assert all(hits is not None and hits.every is not None for _, _, hits in encoded)
        items, reference = [], []
        for query, (vector, _, hits) in zip(QUERIES, encoded):
            state = QueryState(query, query_vectors={"be": vector, "cmc": vector}, dense_hits=hits)
            got = HybridRetrieve(index, K)(state).candidates
            alone = QueryState(query, query_vectors={"be": vector, "cmc": vector})  # FAISS alone: vectors read
            want = HybridRetrieve(plain, K)(alone).candidates
            assert got.vectors is None and want.vectors is not None
            assert got.rows.tolist() == want.rows.tolist(), query
            np.testing.assert_array_equal(got.scores["be"], hits.every[got.rows])  # the search's own products
            np.testing.assert_allclose(got.scores["be"], want.scores["be"], rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(got.scores["bm25"], want.scores["bm25"])
            items.append(CMCRerank(bundle, index).prepare(state))
            reference.append(CMCRerank(bundle, plain).prepare(alone))
        assert all(isinstance(item[1], IndexRows) for item in items)
        assert all(isinstance(item[1], np.ndarray) for item in reference)
        stage = CMCRerank(bundle, index)
        mixed = stage.compute([items[0], reference[1], items[2], reference[3]])  # both kinds in one padded batch
        for b, (lazy, read) in enumerate(zip(stage.compute(items), stage.compute(reference))):
            np.testing.assert_allclose(lazy, read, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(mixed[b], read, rtol=1e-4, atol=1e-5)
            assert np.argsort(-lazy, kind="stable")[:10].tolist() == np.argsort(-read, kind="stable")[:10].tolist()


def test_a_cmc_without_evidence_over_be_candidates_also_gathers_in_its_runner(demo_index_dir, biencoder):
    """The `be` retriever carries no vectors (index/search_index.py returns_vectors = False): a CMC that reads no
    first-stage evidence leaves the gather to its runner; one that needs the inner products reads them now."""
    torch.manual_seed(0)
    plain_model = randomize_gates(CMC(CMCConfig(dim=biencoder.dim)).eval())
    plain_cmc = CMCBundle(plain_model.cfg, plain_model, biencoder, None, "cmc-plain", biencoder.weights_hash)
    with SearchIndex.load(demo_index_dir) as index:
        vector = biencoder.encode_queries(["volcano lava"])[0]
        rows = index.search(vector.float().numpy()[None, :], K)[1][0]
        from sieve.pipeline.candidates import Candidates

        state = QueryState("volcano lava", candidates=Candidates(rows=rows, scores={"retrieve": np.zeros(K, np.float32)}),
                           query_vectors={"be": vector, "cmc": vector})
        lazy = CMCRerank(plain_cmc, index).prepare(state)
        assert isinstance(lazy[1], IndexRows)
        eager = CMCRerank(evidence_cmc(biencoder), index).prepare(state)  # no "be" column: be_of needs the vectors
        assert isinstance(eager[1], np.ndarray)
        stage = CMCRerank(plain_cmc, index)
        np.testing.assert_array_equal(stage.compute([lazy])[0],
                                      stage.compute([(lazy[0], index.embeddings(rows), lazy[2], lazy[3])])[0])
