"""The HTTP app `langgraph dev` (LangGraph Studio's server) mounts beside its own API (langgraph.json `http.app`).

Its middleware checks every request that starts a run or creates an assistant before the server
accepts it, as `make_context` does in Python: the question, unknown context keys (the server would
drop them silently), `role_llms` roles, model specs, value types, and that the store, corpus and
graph exist. An assistant is checked on the settings it has: one without `llm` may leave the model to
its runs. A failed check is HTTP 422 with our typed error, `{"error": "InvalidQuestion",
"message": "question is empty"}`, instead of an accepted run that fails later with "An internal
error occurred".
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import InvalidInput, MhqaError

RUN_PATH = re.compile(r"^(/threads/[^/]+)?/runs(/wait|/stream)?/?$")
BATCH_PATH = re.compile(r"^/runs/batch/?$")
ASSISTANTS_PATH = re.compile(r"^/assistants/?$")


def _known(agent: str) -> set[str]:
    from .graphs import context_schema

    return {f.name for f in dataclasses.fields(context_schema(agent))}


def check_context_keys(agent: str, context: Any) -> None:
    """InvalidInput for a context that is not an object or names a setting `agent` does not have."""
    if context is None:
        return
    if not isinstance(context, dict):
        raise InvalidInput(f"context must be a JSON object, got {type(context).__name__}")
    unknown = sorted(set(context) - _known(agent))
    if unknown:
        raise InvalidInput(f"{agent} has no setting(s) {', '.join(unknown)}; known: {', '.join(sorted(_known(agent)))}")


def _check_store(context: Any) -> None:
    """StoreNotFound for a store URI given in the settings where no store is (even with no corpus or graph
    named yet: a run would need one)."""
    from .store import check_store_exists

    if isinstance(context.store, str) and context.store:
        check_store_exists(context.store)


def check_run(agent: str, run_input: Any, context: dict[str, Any]) -> None:
    """Raise our typed error if a run of `agent` on `run_input` with `context` (all of it: the assistant's,
    the configurable's and the request's settings) would fail on its question or settings."""
    from .graphs import check_sources, make_context
    from .graphs.settings import check_question

    if isinstance(run_input, dict):  # None: resuming a thread
        check_question(run_input.get("question"))
    made = make_context(agent, **context)
    _check_store(made)
    check_sources(made)


def check_assistant(agent: str, context: dict[str, Any]) -> None:
    """Raise our typed error if an assistant of `agent` with `context` would refuse every run: unknown
    `role_llms` roles, model specs that cannot load, values of the wrong type, a store, corpus or graph
    that does not exist. Without `llm` (and no offline pack installed) the model is left to its runs."""
    from .graphs import check_sources, make_context
    from .models.factory import best_installed_chat_pack

    settings = dict(context)
    if settings.get("llm") in (None, "", "auto") and best_installed_chat_pack() is None:
        from .testing.fakes import FakeChatModel

        settings["llm"] = FakeChatModel()  # a stand-in: no spec to check
    made = make_context(agent, **settings)
    _check_store(made)
    check_sources(made)


async def _assistant(assistant_id: str) -> tuple[str, dict[str, Any]]:
    """The graph and the context of an assistant: a graph id is its own default assistant."""
    from .graphs import AGENTS

    if assistant_id in AGENTS:
        return assistant_id, {}
    from langgraph_sdk import get_client

    found = await get_client().assistants.get(assistant_id)  # in-process: the server's own API
    return found["graph_id"], dict(found.get("context") or {})


def _configurable(payload: dict) -> dict:
    """`config.configurable` of a request body ({} when it is absent or not an object)."""
    config = payload.get("config")
    configurable = config.get("configurable") if isinstance(config, dict) else None
    return configurable if isinstance(configurable, dict) else {}


async def check_payload(path: str, payload: Any) -> None:
    """Check one request body (see the module docstring); unknown assistants are left to the server."""
    if not isinstance(payload, dict):
        return
    if ASSISTANTS_PATH.match(path):
        from .graphs import AGENTS

        agent = payload.get("graph_id")
        if agent in AGENTS:
            check_context_keys(agent, payload.get("context"))
            known = _known(agent)
            context = {k: v for k, v in _configurable(payload).items() if k in known} | (payload.get("context") or {})
            await run_in_threadpool(check_assistant, agent, context)
        return
    assistant_id = payload.get("assistant_id")
    if not isinstance(assistant_id, str):
        return
    try:
        agent, context = await _assistant(assistant_id)
    except Exception:  # no such assistant: the server answers 404 itself
        return
    check_context_keys(agent, payload.get("context"))
    known = _known(agent)
    context |= {k: v for k, v in _configurable(payload).items() if k in known} | (payload.get("context") or {})
    await run_in_threadpool(check_run, agent, payload.get("input"), context)


class CheckRuns:
    """ASGI middleware: 422 with our typed error for a run or assistant request that cannot work."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope["method"] != "POST" or not (
                RUN_PATH.match(path) or BATCH_PATH.match(path) or ASSISTANTS_PATH.match(path)):
            return await self.app(scope, receive, send)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            payload = json.loads(body or b"null")
        except ValueError:
            payload = None  # the server answers malformed JSON itself
        try:
            for item in payload if BATCH_PATH.match(path) and isinstance(payload, list) else [payload]:
                await check_payload(path, item)
        except MhqaError as exc:
            response = JSONResponse({"error": type(exc).__name__, "message": str(exc)}, 422)
            return await response(scope, receive, send)
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


app = Starlette(middleware=[Middleware(CheckRuns)])
