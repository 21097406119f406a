"""Reading OPERA's Analysis-Answer, Rewrite and synthesis replies (as their models, or tolerantly when no backend
held them to their formats); the analysis guards (`analysis_refusal`, `analysis_grounded`;
`guard_rules.analysis_flag`) judge the answer before its sufficiency counts."""

from __future__ import annotations

import re
from typing import Any

from langchain_core.messages import BaseMessage

from mhqa_graph.parsing import extract_json, final_answer, strip_think
from mhqa_graph.replies import held

from ..calls import clean_answer
from . import prompts as P
from .guard_rules import NO_ANSWER, analysis_flag
from .replies import Analysis


def _truthy(flag: Any) -> bool:
    if isinstance(flag, str):
        return flag.strip().lower() in ("true", "yes", "y", "1", "sufficient")
    return bool(flag)


def read_analysis(reply: Analysis, passages: list[str] | None = None, ctx: Any = None,
                  log: list[dict] | None = None) -> dict[str, Any]:
    """{"reasoning", "sufficient", "answer", "flag"} from an Analysis-Answer reply. Not sufficient: a reply that does
    not say so, and with their guards on (`ctx.guards`, firings appended to `log`), a refusal or "not found" answer
    (then "", `analysis_refusal`) or a short answer that none of `passages` contains (`analysis_grounded`); `flag`
    says which, or that a prompted reply left its sufficiency out, or is None."""
    log = [] if log is None else log
    answer = clean_answer(reply.answer)
    sufficient = bool(reply.sufficient)
    flag = analysis_flag(ctx, answer, sufficient, passages, log) if answer else None
    if flag == NO_ANSWER:
        answer = ""
    elif not flag and answer and reply.sufficient is None:
        flag = "no sufficiency given"
    sufficient = sufficient and bool(answer) and flag is None
    return {"reasoning": reply.reasoning, "sufficient": sufficient, "answer": answer, "flag": flag}


def check_analysis(value: Any, passages: list[str] | None = None, ctx: Any = None,
                   log: list[dict] | None = None) -> dict[str, Any]:
    """An Analysis-Answer reply read tolerantly (`read_analysis`): keys in any case, the {"status": "yes"|"no",
    "analysis": ...} form, sufficiency written as text or left out."""
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    v = {str(k).lower(): x for k, x in value.items()}
    if not any(k in v for k in ("sufficient", "status", "answer")):
        raise ValueError(f'expected the keys "sufficient" and "answer", got {sorted(v)}')
    stated = v.get("sufficient", v.get("status"))
    reply = Analysis.model_construct(reasoning=str(v.get("reasoning") or v.get("analysis") or ""),
                                     sufficient=None if stated is None else _truthy(stated),
                                     answer=str(v.get("answer") or ""))
    return read_analysis(reply, passages, ctx, log)


_QUERY_FIELD = re.compile(r'"query"\s*:\s*"([^"]*)', re.IGNORECASE)


def read_rewrite(message: BaseMessage) -> str:
    """The query of a Rewrite agent reply: the model's when the backend held the reply to its format, else read
    tolerantly (`parse_rewrite`); "" when it has none."""
    try:
        reply = held(message, P.REWRITE_FORMAT)
    except ValueError:
        return ""
    return " ".join(reply.query.split()) if reply is not None else parse_rewrite(message.text)


def parse_rewrite(text: str) -> str:
    """The query of a Rewrite agent reply: JSON {"query": ...} (even cut off) or the first line of plain text."""
    value = extract_json(text, dict)
    if value is not None:
        query = next((v for k, v in value.items() if str(k).lower() == "query"), "")
        return " ".join(str(query).split())
    text = strip_think(text)
    if match := _QUERY_FIELD.search(text):
        return " ".join(match.group(1).split())
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = re.sub(r"^(new |rewritten |search )?query\s*:\s*", "", line, flags=re.IGNORECASE)
    return line.strip(" \"'`*")


def parse_final(text: str) -> str:
    value = extract_json(text, dict)
    if value is not None and value.get("answer") is not None:
        return clean_answer(str(value["answer"]))
    return clean_answer(final_answer(text))
