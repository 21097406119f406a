"""Every Cypher statement the Neo4j backend sends, plus Lucene query escaping.

Model:
    (:Collection {key, kind: 'graph'|'corpus', namespace, name, scope, embedder, dim, next_seq})
    (:Entity {key, graph, name, folded, embedding})-[:REL {relation}]->(:Entity)
    (:Passage {key, corpus, pid, seq, title, text, embedding})
A collection's `scope` is its name, prefixed by its namespace if it has one; entities and passages
store it as `graph`/`corpus`. Keys join parts with "\\u001f" (see `key`): Collection `kind, scope`,
Entity `scope, name`, Passage `scope, pid`. User data only ever travels in parameters; the
statements below are the complete, fixed query text.
"""

from __future__ import annotations

import re

SEP = "\u001f"


def key(scope: str, name: str) -> str:
    """Two key parts joined by SEP, e.g. key(graph scope, entity name)."""
    return f"{scope}{SEP}{name}"


# -- schema (also in neo4j/schema.cypher, with the dimensions fixed at 384) -------------------
CREATE_COLLECTION_KEY = "CREATE CONSTRAINT collection_key IF NOT EXISTS FOR (c:Collection) REQUIRE c.key IS UNIQUE"
CREATE_ENTITY_KEY = "CREATE CONSTRAINT entity_key IF NOT EXISTS FOR (e:Entity) REQUIRE e.key IS UNIQUE"
CREATE_PASSAGE_KEY = "CREATE CONSTRAINT passage_key IF NOT EXISTS FOR (p:Passage) REQUIRE p.key IS UNIQUE"
CREATE_ENTITY_GRAPH_INDEX = "CREATE INDEX entity_graph IF NOT EXISTS FOR (e:Entity) ON (e.graph)"
CREATE_ENTITY_FOLDED_INDEX = "CREATE INDEX entity_folded IF NOT EXISTS FOR (e:Entity) ON (e.graph, e.folded)"
CREATE_PASSAGE_CORPUS_INDEX = "CREATE INDEX passage_corpus IF NOT EXISTS FOR (p:Passage) ON (p.corpus)"
CREATE_PASSAGE_ORDER_INDEX = "CREATE INDEX passage_order IF NOT EXISTS FOR (p:Passage) ON (p.corpus, p.seq)"
CREATE_ENTITY_FULLTEXT = "CREATE FULLTEXT INDEX entity_name_ft IF NOT EXISTS FOR (e:Entity) ON EACH [e.name]"
CREATE_PASSAGE_FULLTEXT = (
    "CREATE FULLTEXT INDEX passage_text_ft IF NOT EXISTS FOR (p:Passage) ON EACH [p.title, p.text]"
)
# Index OPTIONS are an expression map, so the dimension is a parameter like any other value.
CREATE_ENTITY_VECTOR = """\
CREATE VECTOR INDEX entity_embedding IF NOT EXISTS
FOR (e:Entity) ON (e.embedding)
OPTIONS {indexConfig: {`vector.dimensions`: $dimensions, `vector.similarity_function`: 'cosine'}}"""
CREATE_PASSAGE_VECTOR = """\
CREATE VECTOR INDEX passage_embedding IF NOT EXISTS
FOR (p:Passage) ON (p.embedding)
OPTIONS {indexConfig: {`vector.dimensions`: $dimensions, `vector.similarity_function`: 'cosine'}}"""
AWAIT_INDEXES = "CALL db.awaitIndexes($seconds)"

SCHEMA = (
    CREATE_COLLECTION_KEY, CREATE_ENTITY_KEY, CREATE_PASSAGE_KEY, CREATE_ENTITY_GRAPH_INDEX,
    CREATE_ENTITY_FOLDED_INDEX, CREATE_PASSAGE_CORPUS_INDEX, CREATE_PASSAGE_ORDER_INDEX, CREATE_ENTITY_FULLTEXT,
    CREATE_PASSAGE_FULLTEXT,
)
VECTOR_SCHEMA = (CREATE_ENTITY_VECTOR, CREATE_PASSAGE_VECTOR)  # take $dimensions

# -- collections -------------------------------------------------------------------------------
EMBEDDERS = "MATCH (c:Collection) RETURN DISTINCT c.embedder AS embedder, c.dim AS dim"
COLLECTION = "MATCH (c:Collection {key: $collection}) RETURN c.embedder AS embedder, c.dim AS dim"
MERGE_COLLECTION = """\
MERGE (c:Collection {key: $collection})
  ON CREATE SET c.kind = $kind, c.namespace = $namespace, c.name = $name, c.scope = $scope,
                c.embedder = $embedder, c.dim = $dim, c.next_seq = 0
RETURN c.embedder AS embedder, c.dim AS dim"""
COLLECTION_NAMES = "MATCH (c:Collection {namespace: $namespace, kind: $kind}) RETURN c.name AS name ORDER BY name"
STATS = """\
MATCH (c:Collection {namespace: $namespace})
RETURN c.kind AS kind, c.name AS name,
  CASE c.kind WHEN 'graph' THEN COUNT { MATCH (e:Entity) WHERE e.graph = c.scope } ELSE 0 END AS entities,
  CASE c.kind WHEN 'graph' THEN COUNT { MATCH (s:Entity)-[:REL]->(:Entity) WHERE s.graph = c.scope } ELSE 0 END
    AS triples,
  CASE c.kind WHEN 'corpus' THEN COUNT { MATCH (p:Passage) WHERE p.corpus = c.scope } ELSE 0 END AS passages"""
DROP_ENTITIES = """\
MATCH (c:Collection {namespace: $namespace, kind: 'graph'})
MATCH (e:Entity) WHERE e.graph = c.scope
WITH e LIMIT $limit
DETACH DELETE e
RETURN count(*) AS deleted"""
DROP_PASSAGES = """\
MATCH (c:Collection {namespace: $namespace, kind: 'corpus'})
MATCH (p:Passage) WHERE p.corpus = c.scope
WITH p LIMIT $limit
DELETE p
RETURN count(*) AS deleted"""
DROP_COLLECTIONS = "MATCH (c:Collection {namespace: $namespace}) DELETE c"

# -- graphs ------------------------------------------------------------------------------------
EXISTING_ENTITIES = "UNWIND $keys AS k MATCH (e:Entity {key: k}) RETURN e.key AS key"
ADD_ENTITIES = """\
UNWIND $rows AS row
MERGE (e:Entity {key: row.key})
  ON CREATE SET e.graph = $graph, e.name = row.name, e.folded = row.folded, e.embedding = row.embedding"""
ADD_TRIPLES = """\
UNWIND $rows AS row
MATCH (s:Entity {key: row.subject})
MATCH (o:Entity {key: row.object})
MERGE (s)-[r:REL {relation: row.relation}]->(o)
  ON CREATE SET r._new = true
WITH r WHERE r._new
REMOVE r._new
RETURN count(r) AS added"""
ENTITIES_BY_FOLDED = """\
MATCH (e:Entity)
WHERE e.graph = $graph AND e.folded = $folded
RETURN e.name AS name
LIMIT 2"""
NODE_INFO = """\
MATCH (n:Entity {key: $key})
RETURN [(n)-[r:REL]->(m:Entity) | {relation: r.relation, other: m.name, direction: 'out'}]
     + [(n)<-[r:REL]-(m:Entity) | {relation: r.relation, other: m.name, direction: 'in'}] AS facts"""
# Index queries cover every graph/corpus: fetch $fetch hits, keep this one's, report how many came back.
ENTITY_FULLTEXT = """\
CALL db.index.fulltext.queryNodes('entity_name_ft', $query, {limit: $fetch}) YIELD node, score
WITH count(*) AS fetched, collect(CASE WHEN node.graph = $graph THEN {name: node.name, score: score} END) AS hits
RETURN fetched, hits[..$k] AS hits"""
ENTITY_VECTOR = """\
CALL db.index.vector.queryNodes('entity_embedding', $fetch, $vector) YIELD node, score
WITH count(*) AS fetched, collect(CASE WHEN node.graph = $graph THEN {name: node.name, score: score} END) AS hits
RETURN fetched, hits[..$k] AS hits"""

# -- corpora -----------------------------------------------------------------------------------
EXISTING_PASSAGES = "UNWIND $keys AS k MATCH (p:Passage {key: k}) RETURN p.key AS key"
# The dummy write locks the collection, so concurrent writers get disjoint `seq` ranges.
ADD_PASSAGES = """\
MATCH (c:Collection {key: $collection})
SET c._lock = true
WITH c, c.next_seq AS base
SET c.next_seq = base + size($rows)
REMOVE c._lock
WITH base
UNWIND $rows AS row
MERGE (p:Passage {key: row.key})
  ON CREATE SET p.corpus = $corpus, p.pid = row.pid, p.seq = base + row.i, p.title = row.title,
                p.text = row.text, p.embedding = row.embedding, p._new = true
WITH p WHERE p._new
REMOVE p._new
RETURN count(p) AS added"""
PASSAGES_PAGE = """\
MATCH (p:Passage)
WHERE p.corpus = $corpus AND p.seq > $after
RETURN p.pid AS id, p.title AS title, p.text AS text, p.seq AS seq
ORDER BY p.seq
LIMIT $limit"""
PASSAGE_FULLTEXT = """\
CALL db.index.fulltext.queryNodes('passage_text_ft', $query, {limit: $fetch}) YIELD node, score
WITH count(*) AS fetched,
     collect(CASE WHEN node.corpus = $corpus THEN {id: node.pid, title: node.title, text: node.text, score: score} END)
       AS hits
RETURN fetched, hits[..$k] AS hits"""
PASSAGE_VECTOR = """\
CALL db.index.vector.queryNodes('passage_embedding', $fetch, $vector) YIELD node, score
WITH count(*) AS fetched,
     collect(CASE WHEN node.corpus = $corpus THEN {id: node.pid, title: node.title, text: node.text, score: score} END)
       AS hits
RETURN fetched, hits[..$k] AS hits"""

ALL_STATEMENTS: dict[str, str] = {
    name: value for name, value in globals().items() if name.isupper() and isinstance(value, str) and name != "SEP"
}

# -- Lucene ------------------------------------------------------------------------------------
_LUCENE_SPECIAL = re.compile(r'([+\-&|!(){}\[\]^"~*?:\\/])')
_LUCENE_KEYWORD = re.compile(r"\b(AND|OR|NOT)\b")
_WORD = re.compile(r"\w", re.UNICODE)
MAX_TERMS = 256  # Lucene refuses boolean queries of more than 1024 clauses


def escape_lucene(text: str) -> str:
    """`text` as literal Lucene query text: special characters escaped, operator words lowercased."""
    return _LUCENE_KEYWORD.sub(lambda m: m.group(1).lower(), _LUCENE_SPECIAL.sub(r"\\\1", text))


def lucene_or_query(text: str) -> str | None:
    """An OR query of the distinct whitespace-separated terms of `text`; None if it has no words."""
    terms = dict.fromkeys(escape_lucene(t) for t in text.split() if _WORD.search(t))
    return " OR ".join(list(terms)[:MAX_TERMS]) or None
