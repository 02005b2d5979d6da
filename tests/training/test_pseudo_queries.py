"""Pseudo-query generators: every query comes from its source document, in the shape each generator promises."""
from __future__ import annotations

import re

import pytest

from sieve.index import Document, read_beir_corpus
from sieve.index.lexical import Analyzer, LexicalConfig
from sieve.training.pseudo_queries import (GENERATORS, MAX_WORDS, MIN_WORDS, TermStats, generate, parts, query_stats,
                                           sentences)
from tests.conftest import DEMO_CORPUS


@pytest.fixture(scope="module")
def corpus():
    docs = read_beir_corpus(DEMO_CORPUS)
    return docs, TermStats(Analyzer(LexicalConfig()), docs)


@pytest.mark.parametrize("generator", GENERATORS)
def test_every_generator_quotes_its_source(corpus, generator):
    docs, stats = corpus
    queries = generate(generator, docs, range(len(docs)), stats, seed=1)
    assert len(queries) >= len(docs) // 2
    for q in queries:
        doc = docs[q.source]
        if generator in ("sentence", "span"):
            assert q.text in " ".join(doc.text.split()) or q.text in doc.text
        words = q.text.split()
        assert all(w.strip(".,;:!?()\"'").lower() in doc.full_text.lower() for w in words)
    assert query_stats([q.text for q in queries], [[q.source] for q in queries], stats)["term_overlap"] == 1.0


def test_terms_queries_are_short_and_salient(corpus):
    docs, stats = corpus
    queries = generate("terms", docs, range(len(docs)), stats, seed=0)
    assert all(1 <= len(q.text.split()) <= 6 for q in queries)
    shape = query_stats([q.text for q in queries], [[q.source] for q in queries], stats)
    assert 3 <= shape["words_mean"] <= 6


def test_generation_is_seeded(corpus):
    docs, stats = corpus
    first = generate("mix", docs, range(len(docs)), stats, seed=3)
    assert first == generate("mix", docs, range(len(docs)), stats, seed=3)
    assert first != generate("mix", docs, range(len(docs)), stats, seed=4)


def test_overlap_counts_terms_missing_from_the_document(corpus):
    docs, stats = corpus
    shape = query_stats(["zyzzyva quokka", docs[0].title], [[0], [0]], stats)
    assert shape["term_overlap"] == pytest.approx(0.5)


def test_unknown_generator_is_refused(corpus):
    docs, stats = corpus
    with pytest.raises(ValueError, match="allowed"):
        generate("gpt", docs, [0], stats)


def test_block_queries_are_a_run_of_sentences_cut_from_their_source(corpus):
    docs, stats = corpus
    queries = generate("block", docs, range(len(docs)), stats, seed=2)
    assert queries
    for q in queries:
        doc = docs[q.source]
        assert q.text in doc.text and q.text not in q.rest  # cut out, not quoted
        assert len(q.text.split()) + len(q.rest.split()) == len(doc.full_text.split())  # nothing else lost
        assert len(q.rest.split()) >= 0.3 * len(doc.full_text.split())  # the rest keeps at least half the sentences
    long_doc = type(docs[0])("long", "A title", " ".join(f"Sentence number {i} says something new." for i in range(12)))
    for q in generate("block", [long_doc], [0] * 20, stats, seed=5):
        assert 4 <= q.text.count("Sentence number") <= 6  # a third to a half of the 12 sentences, consecutive
        numbers = [int(w) for w in q.text.replace(".", "").split() if w.isdigit()]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))


LOWER = ("the cells were grown in culture for 3 days . results show a 2.5 fold increase in expression ( p < 0.05 ) . "
         "we conclude that the effect holds , e.g. in mice . fig. 2 shows the dose response in detail .")


def test_lower_case_sentences_ending_with_a_spaced_full_stop_are_split():
    found = parts(LOWER)
    assert found == ["the cells were grown in culture for 3 days .",
                     "results show a 2.5 fold increase in expression ( p < 0.05 ) .",
                     "we conclude that the effect holds , e.g. in mice .",  # no split after the abbreviation
                     "fig. 2 shows the dose response in detail ."]


def test_text_without_punctuation_is_cut_into_word_windows_covering_it_all():
    words = [f"w{i}" for i in range(93)]
    found = parts(" ".join(words))
    assert len(found) == 5 and all(MIN_WORDS <= len(p.split()) <= MAX_WORDS for p in found)
    assert " ".join(found).split() == words  # consecutive, nothing lost or repeated
    assert parts("one two three four five six seven eight") == ["one two three four", "five six seven eight"]
    assert parts("too short to cut") == ["too short to cut"]


def test_an_over_long_sentence_is_cut_and_short_parts_are_no_sentence_query():
    long_sentence = " ".join(f"w{i}" for i in range(60)) + "."
    found = parts(f"A short one. {long_sentence} Another sentence of several words here.")
    assert [len(p.split()) for p in found] == [3, 20, 20, 20, 6]  # 60 words: 3 windows of about WINDOW
    assert sentences(f"A short one. {long_sentence}") == found[1:4]


@pytest.mark.parametrize("text", [LOWER, " ".join(re.sub(r"[^\w\s]", " ", LOWER * 2).split())],
                         ids=["lower-case", "unpunctuated"])
def test_ict_and_block_work_on_lower_case_and_unpunctuated_text(text):
    doc = Document("d", "", text)
    stats = TermStats(Analyzer(LexicalConfig()), [doc])
    for generator in ("ict", "block", "sentence"):
        made = generate(generator, [doc], [0] * 5, stats, seed=1)
        assert made, generator
        for q in made:
            if q.rest is not None:
                assert sorted((q.text + " " + q.rest).split()) == sorted(text.split())  # the text, split in two
