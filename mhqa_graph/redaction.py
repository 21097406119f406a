"""Secrets kept out of what a run records: model specs and store URIs in `run.json`, `summary.json` and
`mhqa report`, and error messages in records, traces and `ask --json`.

`redact` hides the password of a URL's userinfo, the values of secret-looking query parameters
(`api_key=`, `token=`, ...), the credentials of `Authorization: Bearer …`/`Basic …` that a server may echo,
and the literal values of the secret environment variables (`SECRET_ENV`) wherever they appear.
"""

from __future__ import annotations

import os
import re

MASK = "***"
SECRET_ENV = ("OPENAI_API_KEY", "MHQA_NEO4J_PASSWORD", "NEO4J_PASSWORD")  # their values never reach a record
SECRET_PARAM = re.compile(r"(?i)^(api[_-]?key|key|token|access[_-]?token|secret|password|passwd|pwd|auth|sig)$")
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<info>[^/?#@\s]+)@")
_QUERY_PARAM = re.compile(r"(?P<sep>[?&])(?P<name>[^=&#\s]+)=(?P<value>[^&#\s]*)")
_AUTH = re.compile(r"(?i)\b(?P<kind>bearer|basic)(?P<gap>\s+)(?P<value>[A-Za-z0-9._~+/=-]{4,})")


def _userinfo(match: re.Match[str]) -> str:
    user, colon, _ = match["info"].partition(":")
    return f"{match['scheme']}{user}:{MASK}@" if colon else f"{match['scheme']}{MASK}@"


def _param(match: re.Match[str]) -> str:
    if not SECRET_PARAM.match(match["name"]):
        return match[0]
    return f"{match['sep']}{match['name']}={MASK}"


def redact(text: str) -> str:
    """`text` with its secrets masked (see the module docstring); text without any is returned unchanged."""
    if not isinstance(text, str) or not text:
        return text
    for name in SECRET_ENV:
        value = os.environ.get(name, "")
        if len(value) >= 4:
            text = text.replace(value, MASK)
    text = _USERINFO.sub(_userinfo, text)
    text = _QUERY_PARAM.sub(_param, text)
    return _AUTH.sub(lambda m: f"{m['kind']}{m['gap']}{MASK}", text)


def secret_params(url: str) -> list[str]:
    """The names of `url`'s query parameters that look like secrets (`api_key`, `token`, ...)."""
    return [m["name"] for m in _QUERY_PARAM.finditer(url) if SECRET_PARAM.match(m["name"])]
