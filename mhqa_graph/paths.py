"""Paths a user writes (in a model spec, a store URI, a config or the environment): `~` expanded, or a typed error."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from .errors import InvalidInput, MhqaError, shown


def expand_user_path(path: str | os.PathLike[str], error: type[MhqaError] = InvalidInput) -> Path:
    """`Path(path).expanduser()`; `error` (InvalidInput by default), in one line, where the path starts with `~user`
    of no such user or `~` with no home directory (pathlib raises RuntimeError)."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        head = str(path).split(os.sep)[0]
        raise error(f"{shown(str(path))}: {shown(head)} cannot be expanded: no such user or home directory") \
            from None


_remembered: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256, of `remember`ed files
_lock = threading.Lock()


def file_sha256(path: str | os.PathLike[str], remember: bool = False) -> str:
    """The sha256 of a file's bytes; of a folder, of its files' relative names and bytes. `remember`: computed once a
    process and version of the file (its size and modification time), for large files read often (model weights)."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    with _lock:
        if remember and key in _remembered:
            return _remembered[key]
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]:
        if file != path:
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    if remember:
        with _lock:
            _remembered[key] = digest.hexdigest()
    return digest.hexdigest()


def read_json_object(path: Path, what: str, error: type[MhqaError], advice: str) -> dict:
    """The JSON object the file at `path` holds; `error`, saying it is not `what` and `advice`, when it cannot be read
    or holds another JSON value."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise error(f"{path} cannot be read as {what} ({exc}); {advice}") from None
    if not isinstance(value, dict):
        raise error(f"{path} is not {what} (a JSON {type(value).__name__}, not an object); {advice}")
    return value


def is_file(path: Path) -> bool:
    """`path.is_file()`, False also for a name the file system cannot hold (too long: a name, not a file)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def is_dir(path: Path) -> bool:
    """`path.is_dir()`, False also for a name the file system cannot hold."""
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False
