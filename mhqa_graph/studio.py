"""The HTTP app `langgraph dev` (LangGraph Studio's server) mounts beside its own API (langgraph.json `http.app`).

Its middleware sees every request the server gets.

- **Who may call.** A request from a web page other than LangGraph Studio (`Origin`), or addressed to a host name
  that is not the server's own loopback name (DNS rebinding), is HTTP 403 `Forbidden`, whatever its path: a page
  the developer visits cannot drive the server, even with a request the browser sends without a preflight. The
  operator adds origins in langgraph.json's `http.cors.allow_origins` (or `MHQA_SERVE_ORIGINS`), host names in
  `MHQA_SERVE_HOSTS`.
- **What a request may name.** The server's own model and store are the operator's (its environment). A run,
  assistant or cron may name `fake:` scripts and the installed packs by name (`llamacpp:<pack>`, a shipped
  adapter by name), and the server's store; any other model spec (an `openai:` URL, a file, `hf:`) or store only if
  it matches the operator's `MHQA_SERVE_LLMS` or `MHQA_SERVE_STORES` (comma-separated, `fnmatch` patterns).
  A request names no call cache (`llm_cache`: a file the server would write).
  Otherwise HTTP 403 `Forbidden`: a request cannot send the server's `OPENAI_API_KEY`, questions and passages to a
  URL of its choosing, nor read another store.
- **Runs that cannot work.** Every request that starts a run or creates an assistant is checked before the server
  accepts it, as `make_context` does in Python: the question, unknown context keys (the server would drop them
  silently), `role_llms` roles, model specs, value types, and that the store, corpus and graph exist. An
  assistant is checked on the settings it has: one without `llm` may leave the model to its runs. A failed check
  is HTTP 422 with our typed error, `{"error": "InvalidQuestion", "message": "question is empty"}`, instead of an
  accepted run that fails later with "An internal error occurred".
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import sys
from fnmatch import fnmatchcase
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import Forbidden, InvalidInput, MhqaError, shown

RUN_PATH = re.compile(r"^(/threads/[^/]+)?/runs(/wait|/stream|/crons)?/?$")
BATCH_PATH = re.compile(r"^/runs/batch/?$")
ASSISTANTS_PATH = re.compile(r"^/assistants/?$")
ASSISTANT_PATH = re.compile(r"^/assistants/[^/]+/?$")  # PATCH: an assistant's new settings
STUDIO_ORIGIN = "https://smith.langchain.com"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
ORIGINS_ENV, HOSTS_ENV, LLMS_ENV, STORES_ENV = ("MHQA_SERVE_ORIGINS", "MHQA_SERVE_HOSTS", "MHQA_SERVE_LLMS",
                                                "MHQA_SERVE_STORES")
INTERNAL_HEADER, INTERNAL_TOKEN = "x-mhqa-internal", secrets.token_urlsafe(32)  # this process's requests to itself
SCHEMES = ("fake", "openai", "hf", "llamacpp")  # of the model specs that load something (models.factory)


def _listed(name: str) -> list[str]:
    """The comma-separated entries of environment variable `name`."""
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


def _host(value: str) -> str:
    """The host name of a `Host` header or an origin's authority, without its port or brackets."""
    return (urlsplit(f"//{value}").hostname or "") if value else ""


def _cors_origins() -> list[str]:
    """The origins langgraph.json's `http.cors.allow_origins` grants (never "*"), where the server has read it."""
    config = sys.modules.get("langgraph_api.config")
    cors = getattr(config, "CORS_CONFIG", None) or {}
    return [o.rstrip("/") for o in cors.get("allow_origins") or () if isinstance(o, str) and o != "*"]


def check_client(headers: dict[str, str]) -> None:
    """Forbidden for a request addressed to a host name other than a loopback one or `MHQA_SERVE_HOSTS` (DNS
    rebinding), or sent by a web page whose `Origin` is neither Studio's, the server's own, nor listed in
    `MHQA_SERVE_ORIGINS`. Clients that are not browsers send no `Origin`."""
    if headers.get(INTERNAL_HEADER) == INTERNAL_TOKEN:
        return  # this process's own request (`_assistant`)
    host = headers.get("host", "")
    hosts = _listed(HOSTS_ENV)
    if "*" not in hosts and _host(host) not in {*LOOPBACK_HOSTS, *hosts}:
        raise Forbidden(f"host {shown(host)} is not this server's; an operator serving other names lists "
                        f"them in {HOSTS_ENV}")
    origin = headers.get("origin")
    if origin is None:
        return
    same = origin in (f"http://{host}", f"https://{host}") and _host(host) in LOOPBACK_HOSTS
    if not same and origin.rstrip("/") not in {STUDIO_ORIGIN, *_listed(ORIGINS_ENV), *_cors_origins()}:
        raise Forbidden(f"requests from the web page {shown(origin)} are refused; LangGraph Studio "
                        f"({STUDIO_ORIGIN}) and the origins in {ORIGINS_ENV} may call this server")


def _local_spec(spec: str) -> bool:
    """Whether a model spec reaches no network and reads no file the operator did not install: `fake:` scripts,
    a pack by name, `llamacpp:<pack>` with its options and a shipped adapter by name."""
    from .models.factory import FILE_PREFIX
    from .models.packs import PACKS

    scheme, _, rest = spec.partition(":")
    if spec in PACKS or scheme == "fake":
        return True
    if scheme != "llamacpp":
        return False
    ref, _, query = rest.partition("?")
    lora = [value for key, value in parse_qsl(query, keep_blank_values=True) if key == "lora"]
    return ref in PACKS and not any("/" in value or value.endswith(".gguf") or value.startswith(("~", FILE_PREFIX))
                                    for value in lora)


def check_served(context: dict[str, Any]) -> None:
    """Forbidden for a model spec (`llm`, `role_llms`) or store a served run may not name (the module docstring)."""
    from .store import default_store_uri, store_key

    specs = [("llm", context.get("llm"))]
    role_llms = context.get("role_llms")
    if isinstance(role_llms, dict):
        specs += [(f"role_llms[{role!r}]", spec) for role, spec in role_llms.items()]
    for where, spec in specs:
        if spec in (None, "", "auto") or not isinstance(spec, str) or spec.partition(":")[0] not in SCHEMES or (
                _local_spec(spec) or any(fnmatchcase(spec, p) for p in _listed(LLMS_ENV))):
            continue  # allowed, or not a spec at all: the checks after this one say why it cannot load
        raise Forbidden(f"{where}: this server runs no model a request names by {shown(spec)}; it runs "
                        f"fake: scripts and the installed packs by name, and the specs its operator lists in "
                        f"{LLMS_ENV}")
    if context.get("llm_cache"):
        raise Forbidden("llm_cache: a request names no file for the server to write; its operator sets the cache")
    store = context.get("store")
    if store in (None, ""):
        return
    if isinstance(store, str):
        try:
            key = store_key(store)
        except MhqaError:
            key = store  # a malformed URI is refused below, or by the checks after this one
        if key == store_key(default_store_uri()) or any(fnmatchcase(u, p) for p in _listed(STORES_ENV)
                                                         for u in (store, key)):
            return
    raise Forbidden(f"store: this server opens its own store and those its operator lists in {STORES_ENV}, not "
                    f"{shown(store)}")


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
    made = make_context(agent, require_source=False, **settings)
    _check_store(made)
    check_sources(made)


async def _assistant(assistant_id: str) -> tuple[str, dict[str, Any]]:
    """The graph and the context of an assistant: a graph id is its own default assistant."""
    from .graphs import SPECS

    if assistant_id in SPECS:
        return assistant_id, {}
    from langgraph_sdk import get_client

    client = get_client(headers={INTERNAL_HEADER: INTERNAL_TOKEN})  # in-process: the server's own API
    found = await client.assistants.get(assistant_id)
    return found["graph_id"], dict(found.get("context") or {})


def _configurable(payload: dict) -> dict:
    """`config.configurable` of a request body ({} when it is absent or not an object)."""
    config = payload.get("config")
    configurable = config.get("configurable") if isinstance(config, dict) else None
    return configurable if isinstance(configurable, dict) else {}


def _context(payload: dict) -> dict:
    """`context` of a request body ({} when it is absent or not an object)."""
    context = payload.get("context")
    return context if isinstance(context, dict) else {}


async def check_payload(path: str, payload: Any) -> None:
    """Check one request body (see the module docstring); unknown assistants are left to the server."""
    if not isinstance(payload, dict):
        return
    if ASSISTANT_PATH.match(path) and not ASSISTANTS_PATH.match(path):  # PATCH: new settings of an assistant
        check_served(_configurable(payload) | _context(payload))
        return
    if ASSISTANTS_PATH.match(path):
        from .graphs import SPECS

        check_served(_configurable(payload) | _context(payload))
        agent = payload.get("graph_id")
        if agent in SPECS:
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
    except Exception as exc:
        if getattr(getattr(exc, "response", None), "status_code", None) == 404:
            return  # no such assistant: the server answers 404 itself
        raise Forbidden(f"the settings of assistant {shown(assistant_id)} cannot be checked: "
                        f"{type(exc).__name__}") from None
    check_context_keys(agent, payload.get("context"))
    known = _known(agent)
    context |= {k: v for k, v in _configurable(payload).items() if k in known} | _context(payload)
    check_served(context)  # the assistant's settings too: a request may have set them
    await run_in_threadpool(check_run, agent, payload.get("input"), context)


class CheckRuns:
    """ASGI middleware: 403 for a request from a foreign page or host, or naming a model or store the operator did
    not allow; 422 with our typed error for a run or assistant request that cannot work."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            check_client({k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])})
        except Forbidden as exc:
            return await _refusal(exc, 403)(scope, receive, send)
        path, method = scope.get("path", ""), scope["method"]
        if not ((method == "POST" and (RUN_PATH.match(path) or BATCH_PATH.match(path) or ASSISTANTS_PATH.match(path)))
                or (method == "PATCH" and ASSISTANT_PATH.match(path))):
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
            return await _refusal(exc, 403 if isinstance(exc, Forbidden) else 422)(scope, receive, send)
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _refusal(exc: MhqaError, status: int) -> JSONResponse:
    return JSONResponse({"error": type(exc).__name__, "message": str(exc)}, status)


app = Starlette(middleware=[Middleware(CheckRuns)])
