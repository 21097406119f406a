"""A stand-in for a `neo4j.Driver` that records every query and answers from a responder.

It covers the subset of the driver API that `Neo4jStore` uses: `session(database=...)`,
`Session.execute_read/execute_write(fn, ...)`, `ManagedTransaction.run(query, parameters)`
returning a result with iteration, `.data()`, `.single()` and `.consume()`,
`verify_connectivity()` and `close()`.

    driver = RecordingDriver(lambda query, params: [{"added": 1}] if "MERGE" in query else [])
    store = Neo4jStore(driver, embedder="hash:256")
    ...
    [call.query for call in driver.calls if call.access_mode == "WRITE"]

A responder may raise (e.g. `neo4j.exceptions.ServiceUnavailable`) to simulate failures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

Responder = Callable[[str, dict[str, Any]], list[dict[str, Any]]]


@dataclass(frozen=True)
class Call:
    query: str
    parameters: dict[str, Any]
    access_mode: str  # "READ" or "WRITE", as neo4j.READ_ACCESS / neo4j.WRITE_ACCESS
    database: str | None


class RecordedResult:
    def __init__(self, records: list[dict[str, Any]]) -> None:
        self._records = records

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._records)

    def data(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._records]

    def single(self) -> dict[str, Any] | None:
        return self._records[0] if self._records else None

    def consume(self) -> None:
        self._records = []


class RecordingTransaction:
    def __init__(self, session: RecordingSession, access_mode: str) -> None:
        self._session = session
        self._access_mode = access_mode

    def run(self, query: str, parameters: dict[str, Any] | None = None, **kwparameters: Any) -> RecordedResult:
        params = {**(parameters or {}), **kwparameters}
        driver = self._session.driver
        driver.calls.append(Call(query, params, self._access_mode, self._session.database))
        return RecordedResult(list(driver.responder(query, params)))


class RecordingSession:
    def __init__(self, driver: RecordingDriver, database: str | None) -> None:
        self.driver = driver
        self.database = database

    def execute_read(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(RecordingTransaction(self, "READ"), *args, **kwargs)

    def execute_write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(RecordingTransaction(self, "WRITE"), *args, **kwargs)

    def close(self) -> None:
        pass

    def __enter__(self) -> RecordingSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RecordingDriver:
    """Records `calls`; `responder(query, params)` gives each query's records (default: none)."""

    def __init__(self, responder: Responder | None = None, connect_error: Exception | None = None) -> None:
        self.responder: Responder = responder or (lambda query, params: [])
        self.connect_error = connect_error
        self.calls: list[Call] = []
        self.closed = False

    def session(self, database: str | None = None, **config: Any) -> RecordingSession:
        return RecordingSession(self, database)

    def verify_connectivity(self, **config: Any) -> None:
        if self.connect_error is not None:
            raise self.connect_error

    def close(self) -> None:
        self.closed = True
