"""`score` never increases down a list, whichever stages ran (issue 27: the cross-encoder's head with CE logits
above the rest with CMC scores once read 7.0 at rank 16 and 11.6 at rank 17). Response shaping on real Candidates
and QueryState; the index is a stand-in that only names rows."""
from __future__ import annotations

import math

import numpy as np

import sieve.stages  # noqa: F401 - registers the stages whose score columns rank
from sieve.pipeline.candidates import Candidates
from sieve.pipeline.searcher import Outcome
from sieve.pipeline.state import QueryState
from sieve.service.responses import body_json, rerank_response, response_model, search_body

NAN = math.nan


class NamedRows:
    def ids(self, rows):
        return [f"d{r}" for r in rows]


def outcome(scores: dict, ran: list[str], skipped: tuple = ()) -> Outcome:
    n = len(next(iter(scores.values())))
    cands = Candidates(rows=np.arange(n), scores={k: np.asarray(v, dtype=np.float32) for k, v in scores.items()})
    state = QueryState("q", ran=ran, skipped=list(skipped))
    return Outcome(cands, ran[-1], state, 1, index=NamedRows())


def check(hits, raw: dict) -> list[float]:
    scores = [h.score for h in hits]
    assert all(a > b for a, b in zip(scores, scores[1:])), scores  # strictly: every stage's scores are distinct here
    for column, values in raw.items():  # each stage's own score is kept as it was
        assert [h.scores[column] for h in hits] == [None if math.isnan(v) else np.float32(v) for v in values]
    return scores


def test_candidates_below_the_cross_encoders_head_score_below_its_lowest():
    raw = {"retrieve": [0.9, 0.8, 0.7, 0.6, 0.5], "cmc": [12.0, 11.9, 11.6, 10.0, 2.0], "ce": [9.0, 7.0, NAN, NAN, NAN]}
    scores = check(response_model(search_body(outcome(raw, ["retrieve", "cmc", "ce"]), False)).results, raw)
    assert scores[:2] == [9.0, 7.0]  # the head keeps the cross-encoder's scores
    assert scores[2] == 6.0 and np.allclose(np.diff(scores[2:]), [-1.6, -8.0])  # CMC's gaps kept, one below 7.0


def test_with_cmc_skipped_the_retrieve_scores_go_below_the_cross_encoders():
    raw = {"retrieve": [0.9, 0.8, 0.7, 0.6], "ce": [0.2, -0.5, NAN, NAN]}
    scores = check(response_model(search_body(outcome(raw, ["retrieve", "ce"], ("cmc",)), False)).results, raw)
    assert scores[:2] == [np.float32(0.2), -0.5] and scores[2] == np.float32(0.7) - np.float32(0.7 + 0.5 + 1)


def test_rerank_relevance_scores_never_increase():
    raw = {"retrieve": [0.5, 0.4, 0.3, 0.2], "ce": [3.0, 1.0, NAN, NAN]}
    out = outcome(raw, ["retrieve", "ce"])
    out.candidates.texts = ["a", "b", "c", "d"]
    scores = [r.relevance_score for r in rerank_response(out, [None] * 4, "ce", False).results]
    assert scores[:2] == [3.0, 1.0] and scores[2] < 1.0 and scores == sorted(scores, reverse=True)


def test_the_search_answer_built_without_validation_is_what_the_schema_validates():
    """response_model builds its models with model_construct (no second validation): the JSON it serialises must
    be exactly what validating the same values through the schema gives."""
    from sieve.service import schemas
    from sieve.service.responses import to_json

    raw = {"retrieve": [0.9, 0.8, 0.7], "be": [0.5, NAN, 0.25], "bm25": [3.0, 0.0, 1.5], "cmc": [2.0, 1.0, NAN]}
    built = response_model(search_body(outcome(raw, ["retrieve", "cmc"], skipped=("ce",)), return_documents=False))
    built.timings_ms.update({"total": 1.5, "cmc": 0.25})
    built.warnings.append("retrieve_k 512 clamped to the index size 3")
    validated = schemas.SearchResponse.model_validate(built.model_dump())
    assert to_json(built) == to_json(validated)
    assert schemas.SearchResponse.model_validate_json(to_json(built)) == validated
    assert all(type(h.score) is float and type(h.rank) is int for h in built.results)


def test_the_plain_answer_serialises_byte_for_byte_as_the_schema():
    """The route serialises `search_body`'s plain values (no models): the bytes must be those of the response model
    validated from the same values (NaN as null, documents, warnings, a partial answer, a request id)."""
    from sieve.service import schemas
    from sieve.service.responses import to_json

    raw = {"retrieve": [0.9, 0.8, 0.7], "be": [0.5, NAN, 0.25], "bm25": [3.0, 0.0, 1.5], "cmc": [2.0, 1.0, NAN]}
    for texts in (None, ["first", "zweite \u00fc", "\u4e09"]):
        out = outcome(raw, ["retrieve", "cmc"], skipped=("ce",))
        out.candidates.texts = texts
        out.state.warnings.append("query truncated from 300 to 256 tokens")
        out.state.timings_ms.update({"total": 1.5, "cmc": 0.25})
        body = search_body(out, return_documents=texts is not None, request_id="abc")
        validated = schemas.SearchResponse.model_validate(body)
        assert body_json(body) == to_json(validated)
        assert to_json(response_model(search_body(out, texts is not None, "abc"))) == to_json(validated)
    assert validated.partial and validated.results[1].scores["be"] is None and validated.results[2].document.text == "\u4e09"


def test_a_list_its_last_stage_scored_whole_gets_that_stages_scores_never_rising():
    """The shortcut for a last column without gaps (CMC over every candidate) is the loop's answer: its scores as
    they are where they already fall, held at the running minimum where a later candidate scored higher (a
    click-memory re-sort can leave a column out of order)."""
    from sieve.pipeline.candidates import ranked_scores

    cmc = np.array([3.0, 2.5, 2.5, 2.7, -1.0, -4.0], dtype=np.float32)
    got = ranked_scores({"retrieve": np.linspace(1, 0, 6, dtype=np.float32), "cmc": cmc})
    assert got.tolist() == [3.0, 2.5, 2.5, 2.5, -1.0, -4.0]
    with_gap = cmc.copy()
    with_gap[5] = np.nan  # a gap: the loop, the retrieve score shifted below the last CMC score
    assert ranked_scores({"retrieve": np.linspace(1, 0, 6, dtype=np.float32), "cmc": with_gap})[5] < -1.0
