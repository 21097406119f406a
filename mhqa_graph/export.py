"""Training datasets from eval runs: `runs/NAME/results.jsonl` records (with their `trace`) become
Hugging Face datasets, each saved with `save_to_disk(out)` plus a JSONL copy in `out`. A trace JSON file
(`mhqa ask --trace FILE`, `TraceRecorder(...).trace(output).model_dump_json()`, or a JSON list of such
traces) is read as records too, without gold answers: it exports as sft or roles, with no reward
(`--min-reward`, mygo and grpo need an eval run's gold answers).

Formats:
- sft: one chat per conversation of a trajectory. LLM calls whose input extends an earlier call's
  messages and reply (Omne's tool loop, a JSON repair) continue that conversation, so an Omne run is one
  chat; OPERA and Mujica calls with fresh prompts are separate chats of the same trajectory.
  Every message is {role, content, weight, segments}; `segments` ([{text, weight}], concatenating to
  `content`) carry the loss weight per character span: assistant <think>…</think> blocks get
  `think_weight` (0.001, as Omne), the rest of an assistant turn (tool calls, answers) 1.0, system, user
  and tool-result messages 0. `tokenize_with_weights` turns this into per-token weights. A malformed reply
  that the agent had to repair (ask_json's "That reply could not be used" message, Omne's nudge or
  an answer Omne sent back, or Omne's forced answer after a reply with no action) is no target: the
  reply and the repair message are dropped, so the chat goes from the prompt straight to the reply
  that worked (`clean_turns`). A call whose text the trace did not keep whole (`clipped_chars`, see
  traces.MAX_TRACE_TEXT) is no target either, in any format.
- roles: a DatasetDict with one split per OPERA role (plan, analysis, rewrite): prompt/completion chats
  and the signals their rewards need (analysis and rewrite rows: the sub-goal, its 1-based `step` of the
  plan's `steps`, the query, the ids that query retrieved and the ids the analysis was shown: OPERA shows
  the passages of all the sub-goal's attempts so far). A role with no rows (a `rag` run, an OPERA run with no
  rewrites) is left out; its count is 0.
- grpo: one prompt per question with gold answers, topic entities and the corpus/graph to search.
- mygo: sft chats of trajectories whose reward >= the threshold, deduplicated.

Guards (graphs/guards/): a trajectory whose final answer an enforced guard replaced (a date comparison
settled in code, an answer mapped to an option, a worker's answer put in for "no answer") is no sft or mygo
target: its reward is the code's, not the model's. mygo also leaves out every trajectory an enforced guard
changed (a dropped sub-question, a send-back), since it selects by reward. Both stay in roles and grpo, whose
rows carry no guarded completion as a target.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .errors import InvalidInput, MhqaError
from .eval.health import guard_health
from .eval.runner import open_new
from .messages import FORCED_FINAL, HANDED_OVER, RETRIES, SEND_BACK, legacy_kind
from .text import normalize_answer
from .traces import LLMCall, Trace, TraceError, load_trace

FORMATS = ("sft", "roles", "grpo", "mygo")
OPERA_ROLES = ("plan", "analysis", "rewrite")
REWARDS = ("f1", "em")
THINK_WEIGHT = 0.001
MYGO_THRESHOLD = 1.0  # default --min-reward of mygo: keep fully correct trajectories

_THINK = re.compile(r"(<think>)(.*?)(</think>|$)", re.DOTALL | re.IGNORECASE)


class ExtraNotInstalled(MhqaError):
    """An optional dependency is missing; the message names the pip extra that brings it."""


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise ExtraNotInstalled("export needs Hugging Face datasets: pip install 'mhqa-graph[train]'") from exc
    return datasets


# -- reading runs --------------------------------------------------------------------------------
def trace_record(trace: Trace, n: int = 1) -> dict[str, Any]:
    """The record of a trace read from a trace file: its question, answer and trace; no gold answers, so
    no reward (`em`/`f1` None)."""
    return {"id": f"trace-{n}", "question": trace.question, "answers": [], "prediction": trace.answer,
            "em": None, "f1": None, "error": trace.error, "topic_entities": list(trace.topic_entities),
            "trace": trace.model_dump(mode="json"), "from_trace_file": True}


def _trace_file_records(path: Path, text: str) -> list[dict[str, Any]] | None:
    """Records of a trace file (one JSON trace, or a JSON list of them); None if `text` is not one."""
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # ValueError: JSONDecodeError, an integer too long to read
        return None  # JSONL: one record per line
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, dict) and "schema_version" in v and "llm_calls" in v for v in values):
        return None
    records = []
    for n, item in enumerate(values, start=1):
        try:
            records.append(trace_record(load_trace(item), n))
        except TraceError as exc:
            raise TraceError(f"{path}: trace {n}: {exc}") from None
    return records


def read_records(run: str | Path) -> list[dict[str, Any]]:
    """The records of a run folder (its results.jsonl), of a JSONL file, or of a trace JSON file (see the
    module docstring); a torn last line is ignored."""
    path = Path(run)
    path = path / "results.jsonl" if path.is_dir() else path
    if not path.is_file():
        raise TraceError(f"no results file at {path}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        last = raw.rfind(b"\n")
        if not 0 <= last < exc.start:
            raise TraceError(f"{path}: not UTF-8 at byte {exc.start}") from None
        text = raw[:last + 1].decode("utf-8")  # a last line torn inside a character: an interrupted writer's
    traces = _trace_file_records(path, text)
    if traces is not None:
        return traces
    lines = text.splitlines()
    records = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:
            if n == len(lines):  # an interrupted writer's last line
                break
            raise TraceError(f"{path}:{n}: not JSON ({exc})") from exc
        if not isinstance(record, dict):
            raise TraceError(f"{path}:{n}: a record must be a JSON object")
        records.append(record)
    return records


def reward_of(record: Mapping[str, Any], reward: str) -> float:
    value = record.get(reward)
    if record.get("from_trace_file"):
        raise TraceError("a trace file has no gold answers, so no reward: --min-reward, mygo and grpo need the "
                         "results of an eval run (mhqa eval --out DIR)")
    if not isinstance(value, (int, float)):
        raise TraceError(f"record {record.get('id')!r} has no numeric {reward!r}")
    return float(value)


def record_trace(record: Mapping[str, Any], need_calls: bool = True) -> Trace | None:
    """The record's Trace, None when it has none. With `need_calls`, a trace rebuilt from a plain run
    state (no LLM calls were recorded) is a TraceError."""
    if record.get("trace") is None:
        return None
    try:
        trace = load_trace(record["trace"], agent=str(record.get("agent") or "unknown"),
                           question=record.get("question"))
    except TraceError as exc:
        raise TraceError(f"record {record.get('id')!r}: {exc}") from exc
    if need_calls and trace.source == "state":
        raise TraceError(f"record {record.get('id')!r}: its trace is a plain run state without LLM calls; "
                         "re-run the eval with the trace recorder (mhqa_graph.traces), or export --format grpo")
    return trace


# -- chats with loss weights -----------------------------------------------------------------
def segments(text: str, think_weight: float = THINK_WEIGHT) -> list[dict[str, Any]]:
    """An assistant turn split into [{text, weight}]: the thinking inside <think> blocks at `think_weight`,
    the rest at 1.0, the tags included: whether a turn opens with a thought or with an answer is a decision
    the model must learn at full weight."""
    parts, pos = [], 0
    for m in _THINK.finditer(text):
        pieces = [(text[pos:m.start()], 1.0), (m.group(1), 1.0), (m.group(2), think_weight), (m.group(3), 1.0)]
        parts += [{"text": piece, "weight": weight} for piece, weight in pieces if piece]
        pos = m.end()
    if pos < len(text) or not parts:
        parts.append({"text": text[pos:], "weight": 1.0})
    return parts


def weighted_message(role: str, content: str, think_weight: float = THINK_WEIGHT,
                     kind: str | None = None) -> dict[str, Any]:
    """A chat message with its loss weights: the model's replies trained on, everything else (prompts, results,
    and a call the system wrote in the model's place: kind `handed_over`) context."""
    if role == "assistant" and kind != HANDED_OVER:
        return {"role": role, "content": content, "weight": 1.0, "segments": segments(content, think_weight)}
    return {"role": role, "content": content, "weight": 0.0, "segments": [{"text": content, "weight": 0.0}]}


def _continues(sent: list[tuple[str, str]], turns: list[tuple[str, str]]) -> bool:
    """Whether a call's input `sent` starts with the conversation `turns`, whose last reply may reach it
    cut (Omne keeps a reply only through its last tool call)."""
    n = len(turns)
    if len(sent) < n or sent[:n - 1] != turns[:n - 1]:
        return False
    (role, text), (sent_role, sent_text) = turns[-1], sent[n - 1]
    return role == sent_role and (text == sent_text or (role == "assistant" and text.startswith(sent_text)))


KindOf = Callable[[str, str], "str | None"]  # (speaker, text) -> the message's kind (mhqa_graph.messages)


def legacy_kinds(role: str, text: str) -> str | None:
    """The kind of a message of a trace or row written before messages said their kind: by its text."""
    return legacy_kind(text) if role == "user" else None


def trace_kinds(trace: Trace) -> KindOf:
    """What kind each message of `trace` is: its tag, or for an older trace (user messages) its text."""
    if not trace.kinds:
        return legacy_kinds
    kinds = {(m.role, m.content): m.kind for c in trace.llm_calls for m in c.messages if m.kind}
    return lambda role, text: kinds.get((role, text))


def clean_turns(turns: list[tuple[str, str]], kind_of: KindOf = legacy_kinds) -> list[tuple[str, str]]:
    """The conversation without its repairs: a reply followed by a repair message, a nudge or a send-back is
    dropped with that message, and a reply followed by the forced-answer message is dropped (the message stays:
    the forced answer replies to it). What remains goes from each prompt to the reply that worked."""
    out: list[tuple[str, str]] = []
    for role, text in turns:
        after_reply = bool(out) and out[-1][0] == "assistant"
        kind = kind_of(role, text) if after_reply else None
        if kind in RETRIES or kind == FORCED_FINAL:
            out.pop()
            if kind in RETRIES:
                continue
        out.append((role, text))
    return out


def clean_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`clean_turns` over chat messages ({role, content, ...}), e.g. rows exported before it existed."""
    kept, out = clean_turns([(m["role"], m["content"]) for m in messages]), []
    for m in messages:
        if len(out) < len(kept) and (m["role"], m["content"]) == kept[len(out)]:
            out.append(m)
    return out


def conversations(trace: Trace) -> list[tuple[list[str], list[tuple[str, str]]]]:
    """The trace's LLM calls merged into conversations: (roles, [(speaker, text)]). A call whose input
    starts with a conversation so far (its messages and replies, the last one possibly cut as the agent
    kept it) continues it, and so does a send-back that left the reply out (`SentBack.hide_reply`: the prompt of a
    conversation whose reply was not shown, then the send-back); failed calls and calls the trace clipped are left
    out."""
    convs: list[tuple[list[str], list[tuple[str, str]]]] = []
    last_sent: dict[int, list[tuple[str, str]]] = {}  # a conversation's last call as it was sent (hidden replies out)
    for call in trace.llm_calls:
        if call.error or call.clipped_chars:
            continue
        sent = [(m.role, m.content) for m in call.messages]
        as_sent = sent
        prior = max((c for c in convs if _continues(sent, c[1])), key=lambda c: len(c[1]), default=None)
        if prior is None and call.messages and call.messages[-1].kind == SEND_BACK:
            prior = next((c for c in reversed(convs) if last_sent[id(c)] == sent[:-1]), None)
            sent = [*prior[1], sent[-1]] if prior is not None else sent
        turns = [*sent, ("assistant", call.output)]
        if prior is None:
            prior = ([call.role], turns)
            convs.append(prior)
        else:
            prior[1][:] = turns
            if call.role not in prior[0]:
                prior[0].append(call.role)
        last_sent[id(prior)] = as_sent
    return convs


def _base(record: Mapping[str, Any], reward: str) -> dict[str, Any]:
    return {"id": str(record.get("id", "")), "question": str(record.get("question", "")),
            "answers": [str(a) for a in record.get("answers") or []], "prediction": str(record.get("prediction") or ""),
            "reward": None if record.get("from_trace_file") else reward_of(record, reward)}


def chat_rows(record: Mapping[str, Any], trace: Trace, reward: str, think_weight: float) -> list[dict[str, Any]]:
    base = _base(record, reward) | {"agent": trace.agent}
    kinds = trace_kinds(trace)
    return [base | {"conversation": i, "roles": roles, "messages": [
                weighted_message(who, text, think_weight, kinds(who, text)) for who, text in clean_turns(turns, kinds)]}
            for i, (roles, turns) in enumerate(conversations(trace))]


def _selected(records: list[dict], reward: str, min_reward: float | None) -> Iterator[dict]:
    for record in records:
        if min_reward is None or reward_of(record, reward) >= min_reward:
            yield record


def guarded(trace: Trace, any_change: bool = False) -> bool:
    """Whether an enforced guard replaced the trajectory's answer (or, with `any_change`, changed it at all)."""
    found = guard_health(trace.design.get("guards"))
    return found["guard_changed"] if any_change else found["answer_guard"]


def sft_rows(records: list[dict], reward: str = "f1", min_reward: float | None = None,
             think_weight: float = THINK_WEIGHT, any_guard: bool = False) -> list[dict[str, Any]]:
    """Chats of the records' trajectories (reward >= `min_reward` if given), but those whose answer a guard
    replaced (or, with `any_guard`, that a guard changed at all)."""
    rows = []
    for record in _selected(records, reward, min_reward):
        if (trace := record_trace(record)) is not None and not guarded(trace, any_guard):
            rows += chat_rows(record, trace, reward, think_weight)
    return rows


def mygo_rows(records: list[dict], reward: str = "f1", min_reward: float | None = None,
              think_weight: float = THINK_WEIGHT) -> list[dict[str, Any]]:
    """sft rows of trajectories with reward >= `min_reward` (default MYGO_THRESHOLD), one per
    (question id, normalised prediction, message contents)."""
    threshold = MYGO_THRESHOLD if min_reward is None else min_reward
    rows, seen = [], set()
    for row in sft_rows(records, reward, threshold, think_weight, any_guard=True):
        content = json.dumps([[m["role"], m["content"]] for m in row["messages"]], ensure_ascii=False)
        key = (row["id"], normalize_answer(row["prediction"]), hashlib.sha256(content.encode()).hexdigest())
        if key not in seen:
            seen.add(key)
            rows.append(row)
    return rows


# -- OPERA roles -------------------------------------------------------------------------------
def _supporting(record: Mapping[str, Any]) -> dict[str, list[str]]:
    return {"supporting_ids": [str(x) for x in record.get("supporting_ids") or []],
            "supporting_titles": [str(x) for x in record.get("supporting_titles") or []]}


def _chat(call: LLMCall) -> dict[str, Any]:
    return {"prompt": [{"role": m.role, "content": m.content} for m in call.messages],
            "completion": [{"role": "assistant", "content": call.output}]}


def _replies(attempts: list[tuple[int, dict]], key: str) -> list[tuple[int, str]]:
    """(attempt index, raw reply) for every reply under `key` (analysis_raw, rewrite_raw), in run order."""
    out = []
    for i, (_, attempt) in enumerate(attempts):
        raw = attempt.get(key)
        out += [(i, text) for text in (raw if isinstance(raw, list) else [raw] if raw is not None else [])]
    return out


def role_rows(records: list[dict], reward: str = "f1",
              min_reward: float | None = None) -> dict[str, list[dict[str, Any]]]:
    """Prompt/completion rows per OPERA role. Each LLM call is matched, in order, to the raw reply it gave
    in a sub-goal attempt, which gives the query, the retrieved ids and the outcome of that attempt."""
    rows: dict[str, list[dict[str, Any]]] = {role: [] for role in OPERA_ROLES}
    for record in _selected(records, reward, min_reward):
        trace = record_trace(record)
        if trace is None or trace.agent != "opera":
            continue
        base = _base(record, reward) | _supporting(record)
        attempts = [(i, a) for i, s in enumerate(trace.design.get("steps") or []) for a in s.get("attempts", [])]
        subgoals = [s.get("subgoal", "") for s in trace.design.get("steps") or []]
        replies = {key: _replies(attempts, key) for key in ("analysis_raw", "rewrite_raw")}
        cursor = {key: 0 for key in replies}
        for call in trace.llm_calls:
            if call.error or call.clipped_chars or call.role not in OPERA_ROLES:
                continue
            if call.role == "plan":
                rows["plan"].append(base | _chat(call) | {"plan": [p.question for p in trace.plan]})
                continue
            key = f"{call.role}_raw"
            at = next((n for n in range(cursor[key], len(replies[key])) if replies[key][n][1] == call.output), None)
            if at is None:
                continue
            cursor[key] = at + 1
            found = replies[key][at][0]
            step, attempt = attempts[found]
            hits = attempt.get("hits") or []
            signals = {"subgoal": subgoals[step], "step": step + 1, "steps": len(trace.plan) or len(subgoals),
                       "query": str(attempt.get("query", "")),
                       "retrieved_ids": [str(h.get("id")) for h in hits],
                       "retrieved_titles": [str(h.get("title")) for h in hits],
                       "shown_ids": [str(i) for i in attempt.get("shown") or [h.get("id") for h in hits]]}
            if call.role == "analysis":
                analysis = attempt.get("analysis") or {}
                rows["analysis"].append(base | _chat(call) | signals | {
                    "sufficient": bool(analysis.get("sufficient")), "step_answer": str(analysis.get("answer") or "")})
            else:
                later = attempts[found + 1][1] if found + 1 < len(attempts) and attempts[found + 1][0] == step else {}
                rows["rewrite"].append(base | _chat(call) | signals | {
                    "rewrite": str(attempt.get("rewrite") or ""),
                    "next_retrieved_ids": [str(h.get("id")) for h in later.get("hits") or []]})
    return rows


# -- GRPO prompts --------------------------------------------------------------------------------
def grpo_rows(records: list[dict], reward: str = "f1", min_reward: float | None = None) -> list[dict[str, Any]]:
    """One prompt per question id; the trace (if any, even a plain run state) gives topic entities,
    corpus and graph, the record's own fields take precedence."""
    rows, seen = [], set()
    for record in _selected(records, reward, min_reward):
        if record.get("from_trace_file"):
            reward_of(record, reward)  # TraceError: no gold answers to reward against
        qid = str(record.get("id", ""))
        if qid in seen:
            continue
        seen.add(qid)
        trace = record_trace(record, need_calls=False)
        rows.append({"id": qid, "question": str(record.get("question", "")),
                     "answers": [str(a) for a in record.get("answers") or []],
                     "topic_entities": [str(e) for e in record.get("topic_entities") or
                                        (trace.topic_entities if trace else [])],
                     "corpus": record.get("corpus") or (trace.corpus if trace else None),
                     "graph": record.get("graph") or (trace.graph if trace else None),
                     "type": str(record.get("type") or ""), "hops": record.get("hops"),
                     "prompt": [{"role": "user", "content": str(record.get("question", ""))}]}
                    | _supporting(record))
    return rows


# -- writing -----------------------------------------------------------------------------------
def _features(kind: str) -> Any:
    d = _datasets()
    text, num = d.Value("string"), d.Value("float64")
    chat = d.List({"role": text, "content": text})
    base = {"id": text, "question": text, "answers": d.List(text), "prediction": text, "reward": num}
    if kind in ("sft", "mygo"):
        message = {"role": text, "content": text, "weight": num, "segments": d.List({"text": text, "weight": num})}
        return d.Features(base | {"agent": text, "conversation": d.Value("int32"), "roles": d.List(text),
                                  "messages": d.List(message)})
    if kind == "grpo":
        return d.Features({"id": text, "question": text, "answers": d.List(text), "topic_entities": d.List(text),
                           "corpus": text, "graph": text, "type": text, "hops": d.Value("int32"), "prompt": chat,
                           "supporting_ids": d.List(text), "supporting_titles": d.List(text)})
    role = base | {"supporting_ids": d.List(text), "supporting_titles": d.List(text), "prompt": chat,
                   "completion": chat}
    if kind == "plan":
        return d.Features(role | {"plan": d.List(text)})
    step = role | {"subgoal": text, "step": d.Value("int32"), "steps": d.Value("int32"), "query": text,
                   "retrieved_ids": d.List(text), "retrieved_titles": d.List(text), "shown_ids": d.List(text)}
    if kind == "analysis":
        return d.Features(step | {"sufficient": d.Value("bool"), "step_answer": text})
    return d.Features(step | {"rewrite": text, "next_retrieved_ids": d.List(text)})


def _refuse_links(out: Path) -> None:
    """InvalidInput naming the first symbolic link in the dataset folder `out`: an export writes no file through one
    (a link planted at `<out>/sft.jsonl` would have it overwrite the link's target)."""
    for root, dirs, files in os.walk(out):  # a linked folder is listed here, not entered
        for name in (*dirs, *files):
            if (Path(root) / name).is_symlink():
                raise InvalidInput(f"{Path(root) / name} is a symbolic link; an export writes no file through one: "
                                   "remove it, or use another --out")


def _write_jsonl(rows: list[dict], path: Path) -> None:
    with open_new(path) as f:  # made afresh (O_EXCL, O_NOFOLLOW): a link put there meanwhile is not followed
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def export(run: str | Path, fmt: str, out: str | Path, min_reward: float | None = None, reward: str = "f1",
           think_weight: float = THINK_WEIGHT) -> dict[str, int]:
    """Export a run as `fmt` into `out` (a dataset folder, or for roles a DatasetDict folder with the
    splits plan/analysis/rewrite that have rows) plus `out/<fmt or role>.jsonl`. Returns the row count
    per dataset (0 for a role left out); TraceError if there is no row at all, InvalidInput for a symbolic link in
    `out`."""
    if fmt not in FORMATS:
        raise TraceError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    d = _datasets()
    records = read_records(run)
    if reward not in REWARDS:
        raise TraceError(f"unknown reward {reward!r}; choose one of {', '.join(REWARDS)}")
    if fmt == "roles":
        tables = role_rows(records, reward, min_reward)
    elif fmt == "grpo":
        tables = {fmt: grpo_rows(records, reward, min_reward)}
    elif fmt == "mygo":
        tables = {fmt: mygo_rows(records, reward, min_reward, think_weight)}
    else:
        tables = {fmt: sft_rows(records, reward, min_reward, think_weight)}
    if not any(tables.values()):
        raise TraceError(f"nothing to export as {fmt} from {run}: no record has the calls or reward it needs"
                         + (f" (min reward {min_reward})" if min_reward is not None else ""))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _refuse_links(out)
    built = {name: d.Dataset.from_list(rows, features=_features(name)) for name, rows in tables.items() if rows}
    shown = d.is_progress_bar_enabled()
    d.disable_progress_bars()  # a save is seconds: no bar per split and shard
    try:
        if fmt == "roles":
            d.DatasetDict(built).save_to_disk(str(out))
        else:
            built[fmt].save_to_disk(str(out))
    finally:
        if shown:
            d.enable_progress_bars()
    for name, rows in tables.items():
        if rows:
            _write_jsonl(rows, out / f"{name}.jsonl")
    return {name: len(rows) for name, rows in tables.items()}


# -- tokenising ----------------------------------------------------------------------------------
def tokenize_with_weights(tokenizer: Any, messages: list[dict[str, Any]],
                          end_token: str | None = None) -> tuple[list[int], list[float]]:
    """Token ids of the chat (the tokenizer's chat template over the whole conversation) and a loss weight
    per token. Each message's content is found in the rendered text in order and its segments' weights
    (or its `weight`) are laid over its characters; the template's own text weighs 0, except `end_token`
    (default: the tokenizer's eos token) right after an assistant turn, which gets 1.0 so the model learns
    to stop. A token spanning characters of several weights takes the largest. Needs a fast tokenizer
    (offset mapping); ValueError if the template alters a message so it cannot be found."""
    end = tokenizer.eos_token if end_token is None else end_token
    text = tokenizer.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in messages],
                                         tokenize=False)
    weights = [0.0] * len(text)
    cursor = 0
    for n, m in enumerate(messages):
        pos = text.find(m["content"], cursor)
        if pos < 0:
            raise ValueError(f"message {n} ({m['role']}) is not in the templated text; the chat template alters it")
        parts = m.get("segments") or [{"text": m["content"], "weight": m.get("weight", 0.0)}]
        if "".join(p["text"] for p in parts) != m["content"]:
            raise ValueError(f"message {n}: its segments do not add up to its content")
        at = pos
        for p in parts:
            weights[at:at + len(p["text"])] = [float(p["weight"])] * len(p["text"])
            at += len(p["text"])
        cursor = pos + len(m["content"])
        if m["role"] == "assistant" and end and text.startswith(end, cursor):
            weights[cursor:cursor + len(end)] = [1.0] * len(end)
            cursor += len(end)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    token_weights = [max(weights[s:e], default=0.0) for s, e in enc["offset_mapping"]]
    return list(enc["input_ids"]), token_weights
