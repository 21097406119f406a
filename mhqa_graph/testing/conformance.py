"""Behaviour every `KnowledgeStore` backend must show.

Subclass `StoreConformance` in a test module and provide a `store` fixture that yields a
fresh, empty store and a `reopen` fixture that closes a store and opens the same one again:

    class TestMyBackend(StoreConformance):
        @pytest.fixture
        def store(self): ...
        @pytest.fixture
        def reopen(self): ...
"""

from __future__ import annotations

import itertools
import random

import pytest

from ..errors import EntityNotFound, InvalidInput, UnknownCorpus, UnknownGraph
from ..store.base import MAX_NAME_BYTES, MAX_NODE_FACTS
from ..types import EntityHit, Fact, Passage, PassageHit

TRIPLES = [
    ("Polish-Russian War", "director", "Xawery Żuławski"),
    ("Xawery Żuławski", "father", "Andrzej Żuławski"),
    ("Andrzej Żuławski", "country of citizenship", "Poland"),
    ("Snow White and the Seven Dwarfs", "director", "David Hand"),
]

PASSAGES = [
    Passage("p1", "Polish-Russian War (film)", "Polish-Russian War is a 2009 Polish film directed by Xawery Żuławski."),
    Passage("p2", "Xawery Żuławski", "Xawery Żuławski is a Polish film director, son of Andrzej Żuławski."),
    Passage("p3", "Andrzej Żuławski", "Andrzej Żuławski was a Polish film director and writer, born in Lviv."),
    Passage("p4", "Snow White", "Snow White and the Seven Dwarfs is a 1937 American animated fantasy film."),
    Passage("p5", "Lviv", "Lviv is the largest city in western Ukraine."),
]

AWKWARD_NAMES = [
    "O'Brien \"the Bold\"",
    "back`tick`",
    "{braces} and [brackets]",
    "}) DETACH DELETE n //",
    "CALL db.labels() YIELD label",
    "title:(a OR b) AND c* ~2 ^3 \\ /",
    "Zürich – Ελλάδα – 東京 – עברית – 🙂",
]


class StoreConformance:
    """The conformance tests. `store` must be empty at the start of each test."""

    # -- graphs -------------------------------------------------------------------
    def test_triples_round_trip(self, store):
        assert store.add_triples("kg", TRIPLES) == len(TRIPLES)
        info = store.node_info("kg", "Xawery Żuławski")
        assert info.name == "Xawery Żuławski"
        assert set(info.facts) == {
            Fact("father", "Andrzej Żuławski", "out"),
            Fact("director", "Polish-Russian War", "in"),
        }

    def test_duplicate_triples_add_nothing(self, store):
        store.add_triples("kg", TRIPLES)
        assert store.add_triples("kg", TRIPLES) == 0
        assert store.add_triples("kg", TRIPLES[:1] * 3) == 0
        assert store.stats().graphs["kg"] == {"entities": 6, "triples": 4}

    def test_repeats_inside_one_call_count_once(self, store):
        assert store.add_triples("kg", TRIPLES[:1] * 5) == 1

    def test_same_pair_with_two_relations_is_two_edges(self, store):
        store.add_triples("kg", [("A", "r1", "B"), ("A", "r2", "B")])
        assert {f.relation for f in store.node_info("kg", "A").facts} == {"r1", "r2"}

    def test_self_loop_is_out_and_in(self, store):
        store.add_triples("kg", [("Narcissus", "admires", "Narcissus")])
        assert set(store.node_info("kg", "Narcissus").facts) == {
            Fact("admires", "Narcissus", "out"), Fact("admires", "Narcissus", "in")}

    def test_graphs_are_separate(self, store):
        store.add_triples("one", TRIPLES[:1])
        store.add_triples("two", [("Polish-Russian War", "genre", "comedy")])
        assert store.node_info("one", "Polish-Russian War").facts == [Fact("director", "Xawery Żuławski", "out")]
        assert store.node_info("two", "Polish-Russian War").facts == [Fact("genre", "comedy", "out")]
        assert [h.name for h in store.match_entities("two", "Xawery", k=5)] == [] or all(
            h.name in {"Polish-Russian War", "comedy"} for h in store.match_entities("two", "Xawery", k=5))

    def test_a_hub_gives_its_first_facts_each_way(self, store):
        """Past MAX_NODE_FACTS each way, node_info gives the first in (relation, other) order, whatever the order
        of ingestion. (Names with a character of U+E000-U+FFFF where another has one above U+FFFF are left out:
        Neo4j orders them by UTF-16 code unit, SQLite and Python by code point.)"""
        others = [f"{c} {i:04d}" for i, c in zip(range(MAX_NODE_FACTS + 30), itertools.cycle("aZé東🙂"))]
        random.Random(7).shuffle(others)
        out = [(f"r{i % 3}", o) for i, o in enumerate(others)] + [("r0", "hub")]
        into = [("s", o) for o in others] + [("r0", "hub")]
        store.add_triples("kg", [("hub", r, o) for r, o in out[:-1]] + [(o, r, "hub") for r, o in into])
        assert store.node_info("kg", "hub").facts == (
            [Fact(r, o, "out") for r, o in sorted(out)[:MAX_NODE_FACTS]]
            + [Fact(r, o, "in") for r, o in sorted(into)[:MAX_NODE_FACTS]])

    @pytest.mark.parametrize("name", AWKWARD_NAMES)
    def test_awkward_names_round_trip(self, store, name):
        store.add_triples("kg", [(name, "rel'`{}", "plain"), ("plain", "back", name)])
        info = store.node_info("kg", name)
        assert set(info.facts) == {Fact("rel'`{}", "plain", "out"), Fact("back", "plain", "in")}
        assert name in [h.name for h in store.match_entities("kg", name, k=5)]

    def test_match_entities_finds_by_words(self, store):
        store.add_triples("kg", TRIPLES)
        hits = store.match_entities("kg", "polish russian war film", k=3)
        assert hits and isinstance(hits[0], EntityHit)
        assert hits[0].name == "Polish-Russian War"
        assert len(hits) <= 3
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)

    def test_match_entities_empty_text(self, store):
        store.add_triples("kg", TRIPLES)
        assert store.match_entities("kg", "   ", k=5) == []

    def test_unknown_graph(self, store):
        with pytest.raises(UnknownGraph):
            store.match_entities("nope", "x")
        with pytest.raises(UnknownGraph):
            store.node_info("nope", "x")

    def test_unknown_entity(self, store):
        store.add_triples("kg", TRIPLES)
        with pytest.raises(EntityNotFound):
            store.node_info("kg", "Nobody At All")

    def test_node_info_tolerates_case(self, store):
        store.add_triples("kg", TRIPLES)
        assert store.node_info("kg", "xawery żuławski").name == "Xawery Żuławski"

    # -- corpora ------------------------------------------------------------------
    def test_passages_round_trip(self, store):
        assert store.add_passages("docs", PASSAGES) == len(PASSAGES)
        assert list(store.passages("docs")) == PASSAGES

    def test_duplicate_passages_add_nothing(self, store):
        store.add_passages("docs", PASSAGES)
        assert store.add_passages("docs", PASSAGES) == 0
        assert store.stats().corpora["docs"] == {"passages": len(PASSAGES)}

    @pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
    def test_search_modes(self, store, mode):
        store.add_passages("docs", PASSAGES)
        hits = store.search("docs", "Which city was Andrzej Żuławski born in?", k=3, mode=mode)
        assert 1 <= len(hits) <= 3 and all(isinstance(h, PassageHit) for h in hits)
        assert "p3" in [h.id for h in hits]
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)

    def test_search_k_larger_than_corpus(self, store):
        store.add_passages("docs", PASSAGES[:2])
        assert len(store.search("docs", "film", k=50, mode="dense")) == 2

    def test_search_no_words(self, store):
        store.add_passages("docs", PASSAGES)
        assert store.search("docs", "", k=3) == []
        assert store.search("docs", "?!", k=3, mode="bm25") == []

    @pytest.mark.parametrize("query", AWKWARD_NAMES)
    def test_search_awkward_queries(self, store, query):
        store.add_passages("docs", PASSAGES + [Passage("odd", query, f"A passage about {query}.")])
        hits = store.search("docs", query, k=6, mode="hybrid")
        assert "odd" in [h.id for h in hits]

    def test_corpora_are_separate(self, store):
        store.add_passages("a", PASSAGES[:2])
        store.add_passages("b", PASSAGES[2:])
        assert {h.id for h in store.search("a", "film director", k=10)} <= {"p1", "p2"}

    def test_unknown_corpus(self, store):
        with pytest.raises(UnknownCorpus):
            store.search("nope", "x")
        with pytest.raises(UnknownCorpus):
            list(store.passages("nope"))

    @pytest.mark.parametrize("where", ["graph", "subject", "object", "corpus", "passage id"])
    def test_a_name_holding_the_key_separator_is_refused(self, store, where):
        """U+001F joins the parts of a key: a name holding it could stand for another graph's entity."""
        odd = "a\u001fb"
        with pytest.raises(InvalidInput, match="U\\+001F"):
            if where in ("graph", "subject", "object"):
                store.add_triples(odd if where == "graph" else "g", [(odd if where == "subject" else "s", "r",
                                                                      odd if where == "object" else "o")])
            else:
                store.add_passages(odd if where == "corpus" else "c",
                                   [Passage(odd if where == "passage id" else "p", "t", "x")])
        assert "a\u001fb" not in store.graphs() + store.corpora()

    @pytest.mark.parametrize("where", ["graph", "subject", "relation", "object", "corpus", "passage id"])
    def test_a_name_over_the_byte_cap_is_refused_and_one_at_it_kept(self, store, where):
        """A name over MAX_NAME_BYTES of UTF-8 (fewer characters, but two bytes each) is InvalidInput on every
        backend, before anything is written (Neo4j's range indexes refuse a key over about 8 KB); one of exactly
        MAX_NAME_BYTES is kept."""
        for name, fits in (("é" * (MAX_NAME_BYTES // 2 + 1), False), ("é" * (MAX_NAME_BYTES // 2), True)):
            collection = name if where in ("graph", "corpus") else "c" if where == "passage id" else "g"

            def add(name: str = name, collection: str = collection) -> None:
                if where in ("graph", "subject", "relation", "object"):
                    store.add_triples(collection, [tuple(name if where == part else part[0]
                                                         for part in ("subject", "relation", "object"))])
                else:
                    store.add_passages(collection, [Passage(name if where == "passage id" else "p", "t", "x")])

            if fits:
                add()
                assert collection in store.graphs() + store.corpora()
                continue
            with pytest.raises(InvalidInput, match=f"{2 * (MAX_NAME_BYTES // 2 + 1):,} bytes"):
                add()
            assert store.graphs() + store.corpora() == []
        if where in ("subject", "object"):
            assert store.node_info("g", "é" * (MAX_NAME_BYTES // 2)).facts
            with pytest.raises(InvalidInput, match="bytes"):
                store.node_info("g", "é" * (MAX_NAME_BYTES // 2 + 1))
        if where == "passage id":
            assert [p.id for p in store.passages("c")] == ["é" * (MAX_NAME_BYTES // 2)]

    @pytest.mark.parametrize("kind", ["graph", "corpus"])
    def test_a_collection_keeps_the_sha256_of_its_file(self, store, reopen, kind):
        """`set_file_sha256` records the file a graph or corpus was built from, kept across a reopen; None where none
        was recorded; an unknown collection or a digest that is not one is refused."""
        if kind == "graph":
            store.add_triples("env", TRIPLES)
        else:
            store.add_passages("env", PASSAGES)
        assert store.file_sha256(kind, "env") is None
        with pytest.raises(UnknownGraph if kind == "graph" else UnknownCorpus):
            store.set_file_sha256(kind, "nope", "a" * 64)
        for bad in ("A" * 64, "a" * 63, "sha256:" + "a" * 57, 7):
            with pytest.raises(InvalidInput, match="sha256"):
                store.set_file_sha256(kind, "env", bad)
        with pytest.raises(InvalidInput, match="kind"):
            store.file_sha256("table", "env")
        store.set_file_sha256(kind, "env", "a" * 64)
        store.set_file_sha256(kind, "env", "b" * 64)  # the last file built in full
        again = reopen(store)
        assert again.file_sha256(kind, "env") == "b" * 64
        assert again.file_sha256("corpus" if kind == "graph" else "graph", "env") is None

    def test_invalid_arguments(self, store):
        store.add_passages("docs", PASSAGES)
        for bad in (lambda: store.search("docs", "x", k=0), lambda: store.search("docs", "x", mode="fuzzy"),
                    lambda: store.add_triples("", TRIPLES), lambda: store.add_triples("kg", [("a", "b")]),
                    lambda: store.add_triples("kg", [("a", "", "c")])):
            with pytest.raises(InvalidInput):
                bad()

    # -- store-wide ---------------------------------------------------------------
    def test_stats(self, store):
        store.add_triples("kg", TRIPLES)
        store.add_passages("docs", PASSAGES)
        stats = store.stats()
        assert stats.graphs == {"kg": {"entities": 6, "triples": 4}}
        assert stats.corpora == {"docs": {"passages": 5}}
        assert store.graphs() == ["kg"] and store.corpora() == ["docs"]

    def test_reopen_gives_same_answers(self, store, reopen):
        store.add_triples("kg", TRIPLES)
        store.add_passages("docs", PASSAGES)
        before = (store.node_info("kg", "Andrzej Żuławski"), store.search("docs", "Lviv", k=2),
                  store.match_entities("kg", "Snow White", k=2), store.stats())
        again = reopen(store)
        after = (again.node_info("kg", "Andrzej Żuławski"), again.search("docs", "Lviv", k=2),
                 again.match_entities("kg", "Snow White", k=2), again.stats())
        assert after == before

    def test_retriever(self, store):
        store.add_passages("docs", PASSAGES)
        docs = store.as_retriever("docs", k=2, mode="bm25").invoke("Snow White animated film")
        assert docs[0].metadata["id"] == "p4" and docs[0].metadata["corpus"] == "docs"
        assert docs[0].page_content == PASSAGES[3].text
