"""Every Cypher statement the Neo4j backend sends, the schema it expects, and Lucene query building.

Model:
    (:Collection {key, kind: 'graph'|'corpus', namespace, name, scope, embedder, dim, gid, size, next_seq,
                  file_sha256})
    (:Entity {key, graph, gid, name, folded, embedding})-[:REL {relation}]->(:Entity)
    (:Passage {key, corpus, gid, pid, seq, title, text, embedding})
A collection's `scope` is its name, prefixed by its namespace if it has one; entities and passages
store it as `graph`/`corpus`. Keys join parts with "\\u001f" (see `key`): Collection `kind, scope`,
Entity `scope, name`, Passage `scope, pid`. `gid` (see `collection_gid`) is one Lucene token per
collection, indexed with the text so full-text queries filter inside the index. `size` counts the
collection's entities or passages; `file_sha256` the file it was last built from in full, where one was
recorded (`KnowledgeStore.set_file_sha256`). Embeddings are 32-bit float arrays (`db.create.setNodeVectorProperty`),
absent when the embedding is all zeros. User data only ever travels in parameters; the statements
below are the complete, fixed query text (index names, too, are parameters).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from .base import KEY_SEPARATOR

SEP = KEY_SEPARATOR  # names holding it are refused (store/base.py), so keys are unambiguous


def key(scope: str, name: str) -> str:
    """Two key parts joined by SEP, e.g. key(graph scope, entity name)."""
    return f"{scope}{SEP}{name}"


def collection_gid(collection_key: str) -> str:
    """The collection's full-text key: a letter and hex digits, so the standard analyser keeps it one token."""
    return "g" + hashlib.sha256(collection_key.encode("utf-8", "surrogatepass")).hexdigest()[:24]


# -- schema (also in neo4j/schema.cypher, with the dimensions fixed at 384) -------------------
CREATE_COLLECTION_KEY = "CREATE CONSTRAINT collection_key IF NOT EXISTS FOR (c:Collection) REQUIRE c.key IS UNIQUE"
CREATE_ENTITY_KEY = "CREATE CONSTRAINT entity_key IF NOT EXISTS FOR (e:Entity) REQUIRE e.key IS UNIQUE"
CREATE_PASSAGE_KEY = "CREATE CONSTRAINT passage_key IF NOT EXISTS FOR (p:Passage) REQUIRE p.key IS UNIQUE"
CREATE_ENTITY_GRAPH_INDEX = "CREATE INDEX entity_graph IF NOT EXISTS FOR (e:Entity) ON (e.graph)"
CREATE_ENTITY_FOLDED_INDEX = "CREATE INDEX entity_folded IF NOT EXISTS FOR (e:Entity) ON (e.graph, e.folded)"
CREATE_PASSAGE_CORPUS_INDEX = "CREATE INDEX passage_corpus IF NOT EXISTS FOR (p:Passage) ON (p.corpus)"
CREATE_PASSAGE_ORDER_INDEX = "CREATE INDEX passage_order IF NOT EXISTS FOR (p:Passage) ON (p.corpus, p.seq)"
CREATE_ENTITY_FULLTEXT = "CREATE FULLTEXT INDEX entity_name_ft IF NOT EXISTS FOR (e:Entity) ON EACH [e.gid, e.name]"
CREATE_PASSAGE_FULLTEXT = (
    "CREATE FULLTEXT INDEX passage_text_ft IF NOT EXISTS FOR (p:Passage) ON EACH [p.gid, p.title, p.text]"
)
# Index OPTIONS are an expression map, so the dimension is a parameter like any other value. Quantization
# (on by default from 5.23) moves the index's scores up to 0.01 from the exact cosine and caps recall@10 near
# 0.97, so it is turned off; servers before 5.23 refuse the key and get the *_BEFORE_5_23 statements.
CREATE_ENTITY_VECTOR = """\
CREATE VECTOR INDEX entity_embedding IF NOT EXISTS
FOR (e:Entity) ON (e.embedding)
OPTIONS {indexConfig: {`vector.dimensions`: $dimensions, `vector.similarity_function`: 'cosine',
                       `vector.quantization.enabled`: false}}"""
CREATE_PASSAGE_VECTOR = """\
CREATE VECTOR INDEX passage_embedding IF NOT EXISTS
FOR (p:Passage) ON (p.embedding)
OPTIONS {indexConfig: {`vector.dimensions`: $dimensions, `vector.similarity_function`: 'cosine',
                       `vector.quantization.enabled`: false}}"""
CREATE_ENTITY_VECTOR_BEFORE_5_23 = """\
CREATE VECTOR INDEX entity_embedding IF NOT EXISTS
FOR (e:Entity) ON (e.embedding)
OPTIONS {indexConfig: {`vector.dimensions`: $dimensions, `vector.similarity_function`: 'cosine'}}"""
CREATE_PASSAGE_VECTOR_BEFORE_5_23 = """\
CREATE VECTOR INDEX passage_embedding IF NOT EXISTS
FOR (p:Passage) ON (p.embedding)
OPTIONS {indexConfig: {`vector.dimensions`: $dimensions, `vector.similarity_function`: 'cosine'}}"""

SCHEMA = (
    CREATE_COLLECTION_KEY, CREATE_ENTITY_KEY, CREATE_PASSAGE_KEY, CREATE_ENTITY_GRAPH_INDEX,
    CREATE_ENTITY_FOLDED_INDEX, CREATE_PASSAGE_CORPUS_INDEX, CREATE_PASSAGE_ORDER_INDEX, CREATE_ENTITY_FULLTEXT,
    CREATE_PASSAGE_FULLTEXT,
)
VECTOR_SCHEMA = (CREATE_ENTITY_VECTOR, CREATE_PASSAGE_VECTOR)  # take $dimensions

SHOW_CONSTRAINTS = "SHOW CONSTRAINTS YIELD name, type, labelsOrTypes, properties"
SHOW_INDEXES = "SHOW INDEXES YIELD name, type, labelsOrTypes, properties, state, populationPercent"
SHOW_VECTOR_INDEXES = "SHOW VECTOR INDEXES YIELD name, labelsOrTypes, properties, options, state, populationPercent"
AWAIT_INDEX = "CALL db.awaitIndex($name, $seconds)"


@dataclass(frozen=True)
class SchemaItem:
    """One constraint or index the backend needs; `role` names the indexes that queries use."""

    name: str
    type: str  # "UNIQUENESS" (a constraint), "RANGE", "FULLTEXT" or "VECTOR", as SHOW INDEXES/CONSTRAINTS say
    label: str
    properties: tuple[str, ...]
    create: str
    role: str = ""
    fallback: str = ""  # for servers that refuse `create` (an index option they do not know)


SCHEMA_ITEMS = (
    SchemaItem("collection_key", "UNIQUENESS", "Collection", ("key",), CREATE_COLLECTION_KEY),
    SchemaItem("entity_key", "UNIQUENESS", "Entity", ("key",), CREATE_ENTITY_KEY),
    SchemaItem("passage_key", "UNIQUENESS", "Passage", ("key",), CREATE_PASSAGE_KEY),
    SchemaItem("entity_graph", "RANGE", "Entity", ("graph",), CREATE_ENTITY_GRAPH_INDEX),
    SchemaItem("entity_folded", "RANGE", "Entity", ("graph", "folded"), CREATE_ENTITY_FOLDED_INDEX),
    SchemaItem("passage_corpus", "RANGE", "Passage", ("corpus",), CREATE_PASSAGE_CORPUS_INDEX),
    SchemaItem("passage_order", "RANGE", "Passage", ("corpus", "seq"), CREATE_PASSAGE_ORDER_INDEX),
    SchemaItem("entity_name_ft", "FULLTEXT", "Entity", ("gid", "name"), CREATE_ENTITY_FULLTEXT, "entity_text"),
    SchemaItem("passage_text_ft", "FULLTEXT", "Passage", ("gid", "title", "text"), CREATE_PASSAGE_FULLTEXT,
               "passage_text"),
    SchemaItem("entity_embedding", "VECTOR", "Entity", ("embedding",), CREATE_ENTITY_VECTOR, "entity_vector",
               CREATE_ENTITY_VECTOR_BEFORE_5_23),
    SchemaItem("passage_embedding", "VECTOR", "Passage", ("embedding",), CREATE_PASSAGE_VECTOR, "passage_vector",
               CREATE_PASSAGE_VECTOR_BEFORE_5_23),
)

PING = "RETURN 1 AS ok"  # is the server there, and are the credentials good

# -- collections -------------------------------------------------------------------------------
EMBEDDERS = "MATCH (c:Collection) RETURN DISTINCT c.embedder AS embedder, c.dim AS dim"
COLLECTION = """\
MATCH (c:Collection {key: $collection})
RETURN c.embedder AS embedder, c.dim AS dim, c.size AS size, c.file_sha256 AS file_sha256"""
SET_FILE_SHA256 = """\
MATCH (c:Collection {key: $collection})
SET c.file_sha256 = $sha256
RETURN count(c) AS updated"""
MERGE_COLLECTION = """\
MERGE (c:Collection {key: $collection})
  ON CREATE SET c.kind = $kind, c.namespace = $namespace, c.name = $name, c.scope = $scope,
                c.embedder = $embedder, c.dim = $dim, c.gid = $gid, c.size = 0, c.next_seq = 0
RETURN c.embedder AS embedder, c.dim AS dim, c.size AS size"""
# The dummy write locks the collection before its size is read, so concurrent writers add up.
GROW_COLLECTION = """\
MATCH (c:Collection {key: $collection})
SET c._lock = true
WITH c
SET c.size = coalesce(c.size, 0) + $added
REMOVE c._lock"""
COLLECTION_NAMES = "MATCH (c:Collection {namespace: $namespace, kind: $kind}) RETURN c.name AS name ORDER BY name"
# Triples are counted from each subject's degree: no far-end label, so Neo4j reads degrees, not edges.
STATS = """\
MATCH (c:Collection {namespace: $namespace})
OPTIONAL MATCH (s:Entity) WHERE c.kind = 'graph' AND s.graph = c.scope
WITH c, s, COUNT { (s)-[:REL]->() } AS degree
WITH c, count(s) AS entities, sum(degree) AS triples
RETURN c.kind AS kind, c.name AS name, entities, triples,
  CASE c.kind WHEN 'corpus' THEN COUNT { MATCH (p:Passage) WHERE p.corpus = c.scope } ELSE 0 END AS passages"""
ENTITY_TOTAL = "MATCH (e:Entity) RETURN count(e) AS total"
PASSAGE_TOTAL = "MATCH (p:Passage) RETURN count(p) AS total"
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

# -- upgrading collections written before `gid` and `size` existed ------------------------------
COLLECTIONS_WITHOUT_GID = (
    "MATCH (c:Collection) WHERE c.gid IS NULL RETURN c.key AS collection, c.kind AS kind, c.scope AS scope"
)
# Pages in key / seq order (both indexed), so every page costs the same however large the collection.
TAG_ENTITIES = """\
MATCH (e:Entity)
WHERE e.key STARTS WITH $prefix AND e.key > $after AND e.graph = $scope
WITH e ORDER BY e.key LIMIT $limit
SET e.gid = $gid
RETURN count(e) AS tagged, max(e.key) AS last"""
TAG_PASSAGES = """\
MATCH (p:Passage)
WHERE p.corpus = $scope AND p.seq > $after
WITH p ORDER BY p.seq LIMIT $limit
SET p.gid = $gid
RETURN count(p) AS tagged, max(p.seq) AS last"""
FINISH_UPGRADE = "MATCH (c:Collection {key: $collection}) SET c.gid = $gid, c.size = $size"

# -- graphs ------------------------------------------------------------------------------------
EXISTING_ENTITIES = "UNWIND $keys AS k MATCH (e:Entity {key: k}) RETURN e.key AS key"
ADD_ENTITIES = """\
UNWIND $rows AS row
MERGE (e:Entity {key: row.key})
  ON CREATE SET e.graph = $graph, e.gid = $gid, e.name = row.name, e.folded = row.folded, e._new = true
WITH e WHERE e._new
REMOVE e._new
RETURN count(e) AS added"""
SET_ENTITY_VECTORS = """\
UNWIND $rows AS row
MATCH (e:Entity {key: row.key})
WHERE e.embedding IS NULL
CALL db.create.setNodeVectorProperty(e, 'embedding', row.embedding)
RETURN count(e) AS updated"""
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
# The first $limit facts each way in (relation, other name) order, as the embedded store's, so a hub entity
# costs a top-N sort and $limit rows; `degree` tells what was left out. Neo4j orders strings by UTF-16 code unit,
# SQLite by code point: the two differ only where one string has a character above U+FFFF and the other one of
# U+E000-U+FFFF at the first place they differ, and so may cut a hub's facts differently there.
NODE_INFO = """\
MATCH (n:Entity {key: $key})
RETURN COLLECT { MATCH (n)-[r:REL]->(m) WITH r, m ORDER BY r.relation, m.name LIMIT $limit
                 RETURN {relation: r.relation, other: m.name, direction: 'out'} }
     + COLLECT { MATCH (n)<-[r:REL]-(m) WITH r, m ORDER BY r.relation, m.name LIMIT $limit
                 RETURN {relation: r.relation, other: m.name, direction: 'in'} }
       AS facts,
       COUNT { (n)-[:REL]->() } + COUNT { (n)<-[:REL]-() } AS degree"""
# Full-text: `$query` carries `+gid:<collection>`, so Lucene returns this collection's best $k.
ENTITY_FULLTEXT = """\
CALL db.index.fulltext.queryNodes($index, $query, {limit: $k}) YIELD node, score
WITH node, score WHERE node.graph = $graph
WITH count(*) AS fetched, collect({name: node.name, score: score}) AS hits
RETURN fetched, hits"""
# Vectors: the index covers every graph, so fetch $fetch neighbours and keep this graph's.
ENTITY_VECTOR = """\
CALL db.index.vector.queryNodes($index, $fetch, $vector) YIELD node, score
WITH count(*) AS fetched, collect(CASE WHEN node.graph = $graph THEN {name: node.name, score: score} END) AS hits
RETURN fetched, hits[..$k] AS hits"""
# Exact nearest neighbours over one collection (its index seek), for small collections and capped fetches.
ENTITY_EXACT = """\
MATCH (e:Entity)
WHERE e.graph = $graph AND e.embedding IS NOT NULL AND any(x IN e.embedding WHERE x <> 0.0)
WITH e, vector.similarity.cosine(e.embedding, $vector) AS score
ORDER BY score DESC
LIMIT $k
WITH count(*) AS fetched, collect({name: e.name, score: score}) AS hits
RETURN fetched, hits"""

# -- corpora -----------------------------------------------------------------------------------
EXISTING_PASSAGES = "UNWIND $keys AS k MATCH (p:Passage {key: k}) RETURN p.key AS key"
# The dummy write locks the collection, so concurrent writers get disjoint `seq` ranges and sizes add up.
ADD_PASSAGES = """\
MATCH (c:Collection {key: $collection})
SET c._lock = true
WITH c, c.next_seq AS base
SET c.next_seq = base + size($rows)
REMOVE c._lock
WITH base
UNWIND $rows AS row
MERGE (p:Passage {key: row.key})
  ON CREATE SET p.corpus = $corpus, p.gid = $gid, p.pid = row.pid, p.seq = base + row.i, p.title = row.title,
                p.text = row.text, p._new = true
WITH p WHERE p._new
REMOVE p._new
WITH count(p) AS added
MATCH (c:Collection {key: $collection})
SET c.size = coalesce(c.size, 0) + added
RETURN added"""
SET_PASSAGE_VECTORS = """\
UNWIND $rows AS row
MATCH (p:Passage {key: row.key})
WHERE p.embedding IS NULL
CALL db.create.setNodeVectorProperty(p, 'embedding', row.embedding)
RETURN count(p) AS updated"""
PASSAGES_PAGE = """\
MATCH (p:Passage)
WHERE p.corpus = $corpus AND p.seq > $after
RETURN p.pid AS id, p.title AS title, p.text AS text, p.seq AS seq
ORDER BY p.seq
LIMIT $limit"""
PASSAGE_FULLTEXT = """\
CALL db.index.fulltext.queryNodes($index, $query, {limit: $k}) YIELD node, score
WITH node, score WHERE node.corpus = $corpus
WITH count(*) AS fetched, collect({id: node.pid, title: node.title, text: node.text, score: score}) AS hits
RETURN fetched, hits"""
PASSAGE_VECTOR = """\
CALL db.index.vector.queryNodes($index, $fetch, $vector) YIELD node, score
WITH count(*) AS fetched,
     collect(CASE WHEN node.corpus = $corpus THEN {id: node.pid, title: node.title, text: node.text, score: score} END)
       AS hits
RETURN fetched, hits[..$k] AS hits"""
PASSAGE_EXACT = """\
MATCH (p:Passage)
WHERE p.corpus = $corpus AND p.embedding IS NOT NULL AND any(x IN p.embedding WHERE x <> 0.0)
WITH p, vector.similarity.cosine(p.embedding, $vector) AS score
ORDER BY score DESC
LIMIT $k
WITH count(*) AS fetched, collect({id: p.pid, title: p.title, text: p.text, score: score}) AS hits
RETURN fetched, hits"""

ALL_STATEMENTS: dict[str, str] = {
    name: value for name, value in globals().items() if name.isupper() and isinstance(value, str) and name != "SEP"
}

# -- Lucene ------------------------------------------------------------------------------------
_LUCENE_SPECIAL = re.compile(r'([+\-&|!(){}\[\]^"~*?:\\/])')
_LUCENE_KEYWORD = re.compile(r"\b(AND|OR|NOT)\b")
# Lucene's standard analyser makes one token of each CJK ideograph, kana or hangul character and
# one of each run of other word characters; counting the same way bounds the query's clauses.
_CJK = "\u1100-\u11ff\u2e80-\u2fdf\u3040-\u30ff\u3100-\u31ff\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7ff" \
       "\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f"
_TOKEN = re.compile(f"[{_CJK}]|[^\\W{_CJK}]+")
# Lucene refuses queries of more than 1024 clauses; every token is one clause per indexed property
# (3 for passages), plus the collection's `+gid:` clause.
MAX_TOKENS = 256


def escape_lucene(text: str) -> str:
    """`text` as literal Lucene query text: special characters escaped, operator words lowercased."""
    return _LUCENE_KEYWORD.sub(lambda m: m.group(1).lower(), _LUCENE_SPECIAL.sub(r"\\\1", text))


def analysed_tokens(text: str) -> int:
    """How many tokens Lucene's standard analyser makes of `text` (CJK characters count one each)."""
    return len(_TOKEN.findall(text))


def lucene_or_query(text: str, max_tokens: int = MAX_TOKENS) -> str | None:
    """An OR query of the distinct whitespace-separated terms of `text`, cut to `max_tokens` analysed
    tokens (a long term, e.g. a CJK sentence without spaces, is cut inside); None if it has no words."""
    terms: list[str] = []
    budget = max_tokens
    for term in dict.fromkeys(text.split()):
        tokens = list(_TOKEN.finditer(term))
        if not tokens:
            continue
        if budget <= 0:
            break
        if len(tokens) > budget:
            term, tokens = term[:tokens[budget - 1].end()], tokens[:budget]
        terms.append(escape_lucene(term))
        budget -= len(tokens)
    return " OR ".join(dict.fromkeys(terms)) or None


def in_collection(gid: str, query: str) -> str:
    """`query` restricted, inside the index, to the collection whose full-text key is `gid`."""
    return f"+gid:{gid} +({query})"
