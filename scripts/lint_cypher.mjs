// Lints Cypher statements with Neo4j's official linter (@neo4j-cypher/language-support).
// Input on stdin: JSON {name: statement}. Prints every diagnostic; exits 1 if there is any.
import { readFileSync } from 'node:fs';
import { lintCypherQuery, parseParameters, testData } from '@neo4j-cypher/language-support';

// The package's mock schema (built-in procedures and functions) plus our graph model, so that
// our labels, relationship type and property keys are known rather than reported as undeclared
// (the linter also takes the keys of our `row` maps for property keys, so they are listed too).
const mock = testData.mockSchema;
const schema = {
  ...mock,
  labels: [...mock.labels, 'Collection', 'Entity', 'Passage'],
  relationshipTypes: [...mock.relationshipTypes, 'REL'],
  propertyKeys: [
    ...mock.propertyKeys,
    'key', 'kind', 'namespace', 'name', 'scope', 'embedder', 'dim', 'gid', 'size', 'next_seq', 'graph', 'folded',
    'file_sha256',
    'embedding',
    'relation',
    'corpus', 'pid', 'seq', 'title', 'text', 'subject', 'object', 'i',
  ],
};

const statements = JSON.parse(readFileSync(0, 'utf8'));
let failures = 0;
for (const [name, query] of Object.entries(statements)) {
  // Parameters are bound by the driver at run time: declare the ones each statement uses.
  const parameters = Object.fromEntries(parseParameters(query).map((p) => [p, null]));
  const { diagnostics } = lintCypherQuery(query, { ...schema, parameters });
  for (const d of diagnostics) {
    const { line, character } = d.range.start;
    console.log(`${name}:${line + 1}:${character + 1}: severity ${d.severity}: ${d.message}`);
    failures += 1;
  }
}
console.log(`${Object.keys(statements).length} statements, ${failures} diagnostics`);
process.exit(failures ? 1 : 0);
