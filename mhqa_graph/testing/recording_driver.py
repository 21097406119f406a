"""A stand-in for a `neo4j.Driver` that records every query and answers from a responder.

It covers the subset of the driver API that `Neo4jStore` uses: `session(database=..., bookmark_manager=...)`,
`Session.execute_read/execute_write(fn, ...)`, `ManagedTransaction.run(query, parameters)`
returning a result with iteration, `.data()`, `.single()` and `.consume()`,
`verify_connectivity()` and `close()`.

    driver = RecordingDriver(lambda query, params: [{"added": 1}] if "MERGE" in query else [])
    store = Neo4jStore(driver, embedder="hash:256")
    ...
    [call.query for call in driver.calls if call.access_mode == "WRITE"]

Where a live server would see what the code gets wrong, the driver behaves like one rather than
answering in the shape the code expects:

- Schema statements (`SHOW INDEXES`, `SHOW VECTOR INDEXES`, `SHOW CONSTRAINTS`, `CREATE ... IF NOT
  EXISTS`, `db.awaitIndex`) work on `driver.schema`, a `RecordedSchema`. `IF NOT EXISTS` does
  nothing when an index of that name or on that label and property exists, whatever its dimension,
  as on the server. Without schema rights, DDL raises `Forbidden`.
- Index queries check what the server checks: the index exists and is ONLINE, a query vector has
  the index's dimension, and a full-text query has at most `max_clauses` Lucene clauses (counted
  with an analyser of its own: one token per CJK character, one per other run of word characters,
  times the index's properties for unfielded terms).
- A write that MERGEs a node on a string over `RANGE_VALUE_LIMIT` bytes (a row's `key`, `$collection`, `$graph`,
  `$corpus`: range-indexed properties) fails its whole transaction, as the server's range index does.
- Every transaction starts from its session's bookmarks (from the session's bookmark manager, if
  any), and commits with a new bookmark, as `driver.transactions` records; so a read that could
  miss an earlier write on a cluster shows up as a transaction that did not start from it.

A responder may raise (e.g. `neo4j.exceptions.ServiceUnavailable`, or `server_error(code, message)`)
to simulate failures.
"""

from __future__ import annotations

import itertools
import re
import threading
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from neo4j.exceptions import Neo4jError

Responder = Callable[[str, dict[str, Any]], list[dict[str, Any]]]
Row = dict[str, Any]
RANGE_VALUE_LIMIT = 8164  # bytes: Neo4j 5 refuses a longer string in a range index (neo4j/neo4j#13967)


def server_error(code: str, message: str) -> Neo4jError:
    """The exception the driver raises for a server failure `code`, e.g. Neo.ClientError.Security.Forbidden."""
    return Neo4jError._hydrate_neo4j(code=code, message=message)


@dataclass(frozen=True)
class Call:
    query: str
    parameters: dict[str, Any]
    access_mode: str  # "READ" or "WRITE", as neo4j.READ_ACCESS / neo4j.WRITE_ACCESS
    database: str | None


@dataclass
class RecordedTransaction:
    access_mode: str
    bookmarks: frozenset[str]  # what it started from: a cluster member waits until it has these
    bookmark: str | None = None  # what it committed as; None if it failed


# -- the schema catalogue ---------------------------------------------------------------------------
_CONSTRAINT = re.compile(r"CREATE CONSTRAINT (\w+) IF NOT EXISTS FOR \(\w+:(\w+)\) REQUIRE \w+\.(\w+) IS UNIQUE")
_INDEX = re.compile(r"CREATE (?:(FULLTEXT|VECTOR) )?INDEX (\w+) IF NOT EXISTS\s+FOR \(\w+:(\w+)\) ON (?:EACH )?"
                    r"[\[(]([^\])]*)[\])]")
_DIMENSIONS = re.compile(r"`vector\.dimensions`: (\$\w+|\d+)")
_YIELD = re.compile(r"YIELD (.*)$")


@dataclass
class RecordedSchema:
    """Indexes and constraints as `SHOW INDEXES` / `SHOW CONSTRAINTS` list them."""

    indexes: list[Row] = field(default_factory=list)
    constraints: list[Row] = field(default_factory=list)
    schema_rights: bool = True
    new_index_state: str = "ONLINE"  # the state of indexes created from now on
    awaited_indexes_come_online: bool = True  # False: db.awaitIndex times out on a POPULATING index

    def add_index(self, name: str, type: str, label: str, properties: list[str], *, dimensions: int | None = None,
                  state: str = "ONLINE", percent: float = 100.0) -> None:
        """An index as a server would list it; a VECTOR index has `dimensions` and cosine similarity."""
        options: Row = {"indexProvider": {"VECTOR": "vector-2.0", "FULLTEXT": "fulltext-1.0"}.get(type, "range-1.0"),
                        "indexConfig": {}}
        if type == "VECTOR":
            options["indexConfig"] = {"vector.dimensions": dimensions, "vector.similarity_function": "COSINE"}
        self.indexes.append({"name": name, "type": type, "labelsOrTypes": [label], "properties": list(properties),
                             "options": options, "state": state,
                             "populationPercent": percent if state != "ONLINE" else 100.0})

    def index(self, name: str) -> Row | None:
        return next((i for i in self.indexes if i["name"] == name), None)

    def answer(self, query: str, params: Row) -> list[Row] | None:
        """The records of a schema statement; None if `query` is not one."""
        if query.startswith("SHOW "):
            columns = [c.strip() for c in _YIELD.search(query).group(1).split(",")]  # type: ignore[union-attr]
            if query.startswith("SHOW CONSTRAINTS"):
                rows = self.constraints
            elif query.startswith("SHOW VECTOR INDEXES"):
                rows = [i for i in self.indexes if i["type"] == "VECTOR"]
            else:
                rows = self.indexes
            return [{c: row[c] for c in columns} for row in rows]
        if query.startswith("CREATE "):
            self._create(query, params)
            return []
        if query.startswith("CALL db.awaitIndex("):
            index = self.index(params["name"])
            if index is not None and index["state"] == "POPULATING":
                if not self.awaited_indexes_come_online:
                    raise server_error("Neo.ClientError.Procedure.ProcedureCallFailed",
                                       f"Failed to invoke procedure `db.awaitIndex`: Caused by: "
                                       f"java.lang.IllegalStateException: Index '{params['name']}' did not come "
                                       f"online within {params['seconds']} seconds.")
                index.update(state="ONLINE", populationPercent=100.0)
            return []
        return None

    def _create(self, query: str, params: Row) -> None:
        if not self.schema_rights:
            raise server_error("Neo.ClientError.Security.Forbidden",
                               "Schema operations are not allowed for user 'reader' with roles [PUBLIC, reader].")
        if m := _CONSTRAINT.match(query):
            name, label, prop = m.groups()
            if not any(c["name"] == name or (c["labelsOrTypes"], c["properties"]) == ([label], [prop])
                       for c in self.constraints):
                self.constraints.append({"name": name, "type": "UNIQUENESS", "labelsOrTypes": [label],
                                         "properties": [prop]})
                self.add_index(name, "RANGE", label, [prop])
            return
        m = _INDEX.match(query)
        if m is None:
            raise AssertionError(f"the recording driver does not know this DDL: {query}")
        type, name, label, props = m.group(1) or "RANGE", m.group(2), m.group(3), re.findall(r"\w+\.(\w+)", m.group(4))
        if any(i["name"] == name or (i["type"], i["labelsOrTypes"], i["properties"]) == (type, [label], props)
               for i in self.indexes):
            return  # IF NOT EXISTS: nothing happens, whatever the existing index's configuration
        dimensions = None
        if d := _DIMENSIONS.search(query):
            dimensions = params[d.group(1)[1:]] if d.group(1).startswith("$") else int(d.group(1))
        self.add_index(name, type, label, props, dimensions=dimensions, state=self.new_index_state,
                       percent=0.0 if self.new_index_state == "POPULATING" else 100.0)


# -- what the server checks when an index is queried -----------------------------------------------
_OPERATORS = {"AND", "OR", "NOT", "and", "or", "not"}


def _ideographic(char: str) -> bool:
    return unicodedata.name(char, "").startswith(("CJK", "HIRAGANA", "KATAKANA", "HANGUL"))


def lucene_clauses(query: str, fields: int) -> int:
    """Clauses of a Lucene query over `fields` properties: a fielded term (`gid:x`) is one, an
    unfielded one is one per analysed token per field."""
    clauses = 0
    for term in re.sub(r"\\(.)", lambda m: " " if m.group(1) in "+-&|!(){}[]^\"~*?:\\/" else m.group(1),
                       re.sub(r"(?<!\\)[+()]", " ", query)).split():
        if term in _OPERATORS:
            continue
        if re.match(r"^\w+:\S", term):
            clauses += 1
            continue
        tokens, run = 0, False
        for char in term:
            if _ideographic(char):
                tokens, run = tokens + 1, False
            elif char.isalnum() or char == "_":
                tokens, run = tokens + (not run), True
            else:
                run = False
        clauses += tokens * fields
    return clauses


class RecordedResult:
    def __init__(self, records: list[Row]) -> None:
        self._records = records

    def __iter__(self) -> Iterator[Row]:
        return iter(self._records)

    def data(self) -> list[Row]:
        return [dict(r) for r in self._records]

    def single(self) -> Row | None:
        return self._records[0] if self._records else None

    def consume(self) -> None:
        self._records = []


class RecordingTransaction:
    def __init__(self, session: RecordingSession, access_mode: str) -> None:
        self._session = session
        self._access_mode = access_mode

    def run(self, query: str, parameters: Row | None = None, **kwparameters: Any) -> RecordedResult:
        params = {**(parameters or {}), **kwparameters}
        driver = self._session.driver
        driver.calls.append(Call(query, params, self._access_mode, self._session.database))
        schema_rows = driver.schema.answer(query, params)
        if schema_rows is not None:
            return RecordedResult(schema_rows)
        driver.check_index_query(query, params)
        driver.check_index_values(query, params)
        return RecordedResult(list(driver.responder(query, params)))


class RecordingSession:
    def __init__(self, driver: RecordingDriver, database: str | None, config: Row) -> None:
        self.driver = driver
        self.database = database
        self.config = config
        self.bookmark_manager = config.get("bookmark_manager")
        self._bookmarks: frozenset[str] = frozenset(config.get("bookmarks") or ())

    def _transaction(self, access_mode: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        manager = self.bookmark_manager
        start = frozenset(manager.get_bookmarks()) if manager is not None else self._bookmarks
        record = RecordedTransaction(access_mode, start)
        self.driver.transactions.append(record)
        result = fn(RecordingTransaction(self, access_mode), *args, **kwargs)
        record.bookmark = self.driver.commit()
        if manager is not None:
            manager.update_bookmarks(start, [record.bookmark])
        self._bookmarks = frozenset([record.bookmark])
        return result

    def execute_read(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._transaction("READ", fn, *args, **kwargs)

    def execute_write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._transaction("WRITE", fn, *args, **kwargs)

    def close(self) -> None:
        pass

    def __enter__(self) -> RecordingSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RecordingDriver:
    """Records `calls`, `sessions` and `transactions`; `responder(query, params)` gives each data query's
    records (default: none)."""

    def __init__(self, responder: Responder | None = None, connect_error: Exception | None = None,
                 schema: RecordedSchema | None = None, max_clauses: int = 1024) -> None:
        self.responder: Responder = responder or (lambda query, params: [])
        self.connect_error = connect_error
        self.schema = schema or RecordedSchema()
        self.max_clauses = max_clauses
        self.calls: list[Call] = []
        self.sessions: list[RecordingSession] = []
        self.transactions: list[RecordedTransaction] = []
        self.closed = False
        self._commits = itertools.count(1)
        self._lock = threading.Lock()

    def session(self, database: str | None = None, **config: Any) -> RecordingSession:
        session = RecordingSession(self, database, config)
        self.sessions.append(session)
        return session

    def commit(self) -> str:
        """A new bookmark, as the server returns one for each committed transaction."""
        with self._lock:
            return f"bookmark:{next(self._commits)}"

    def check_index_query(self, query: str, params: Row) -> None:
        """Fail an index query as the server would: unknown or offline index, wrong dimension, too many clauses."""
        if "db.index.fulltext.queryNodes" in query:
            kind = "fulltext"
        elif "db.index.vector.queryNodes" in query:
            kind = "vector"
        else:
            return
        index = self.schema.index(params["index"])
        if index is None or index["type"] != kind.upper():
            raise server_error("Neo.ClientError.Procedure.ProcedureCallFailed",
                               f"There is no such {kind} schema index: {params['index']}")
        if index["state"] != "ONLINE":
            raise server_error("Neo.ClientError.Procedure.ProcedureCallFailed",
                               f"Expected index '{params['index']}' to come online within a reasonable time.")
        if kind == "vector":
            dimensions = index["options"]["indexConfig"]["vector.dimensions"]
            if dimensions is not None and len(params["vector"]) != dimensions:
                raise server_error("Neo.ClientError.Procedure.ProcedureCallFailed",
                                   f"Index query vector has {len(params['vector'])} dimensions, but indexed vectors "
                                   f"have {dimensions}.")
        elif lucene_clauses(params["query"], len(index["properties"])) > self.max_clauses:
            raise server_error("Neo.ClientError.Procedure.ProcedureCallFailed",
                               "Failed to invoke procedure `db.index.fulltext.queryNodes`: Caused by: "
                               "org.apache.lucene.search.IndexSearcher$TooManyNestedClauses: Query contains too "
                               f"many nested clauses; maxClauseCount is set to {self.max_clauses}")

    def check_index_values(self, query: str, params: Row) -> None:
        """Fail a MERGE of a range-indexed string over RANGE_VALUE_LIMIT bytes as the server does (an internal
        error that rolls back the whole transaction): a row's `key`, `$collection`, `$graph` or `$corpus`."""
        if "MERGE" not in query:
            return
        rows = params.get("rows") if isinstance(params.get("rows"), list) else []
        values = [row.get("key") for row in rows if isinstance(row, dict)]
        values += [params.get(name) for name in ("collection", "graph", "corpus")]
        for value in values:
            if isinstance(value, str) and len(value.encode("utf-8", "surrogatepass")) > RANGE_VALUE_LIMIT:
                raise server_error("Neo.DatabaseError.Statement.ExecutionFailed",
                                   "general processing exception - internal error. Internal exception raised "
                                   "CypherExecution: Property value is too large to index, please see index "
                                   "documentation for limitations.")

    def verify_connectivity(self, **config: Any) -> None:
        if self.connect_error is not None:
            raise self.connect_error

    def close(self) -> None:
        self.closed = True
