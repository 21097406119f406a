// mhqa-graph schema for Neo4j 5. Neo4jStore.ensure_schema() runs the same statements on open,
// with the vector dimensions of the store's embedder; this file fixes them at 384
// (all-minilm-l6-v2) and turn quantization off (5.23+; on 5.18 to 5.22 delete that option).
// See neo4j/README.md for how to apply it.

CREATE CONSTRAINT collection_key IF NOT EXISTS FOR (c:Collection) REQUIRE c.key IS UNIQUE;
CREATE CONSTRAINT entity_key IF NOT EXISTS FOR (e:Entity) REQUIRE e.key IS UNIQUE;
CREATE CONSTRAINT passage_key IF NOT EXISTS FOR (p:Passage) REQUIRE p.key IS UNIQUE;

CREATE INDEX entity_graph IF NOT EXISTS FOR (e:Entity) ON (e.graph);
CREATE INDEX entity_folded IF NOT EXISTS FOR (e:Entity) ON (e.graph, e.folded);
CREATE INDEX passage_corpus IF NOT EXISTS FOR (p:Passage) ON (p.corpus);
CREATE INDEX passage_order IF NOT EXISTS FOR (p:Passage) ON (p.corpus, p.seq);

CREATE FULLTEXT INDEX entity_name_ft IF NOT EXISTS FOR (e:Entity) ON EACH [e.gid, e.name];
CREATE FULLTEXT INDEX passage_text_ft IF NOT EXISTS FOR (p:Passage) ON EACH [p.gid, p.title, p.text];

CREATE VECTOR INDEX entity_embedding IF NOT EXISTS
FOR (e:Entity) ON (e.embedding)
OPTIONS {indexConfig: {`vector.dimensions`: 384, `vector.similarity_function`: 'cosine',
                       `vector.quantization.enabled`: false}};

CREATE VECTOR INDEX passage_embedding IF NOT EXISTS
FOR (p:Passage) ON (p.embedding)
OPTIONS {indexConfig: {`vector.dimensions`: 384, `vector.similarity_function`: 'cosine',
                       `vector.quantization.enabled`: false}};
