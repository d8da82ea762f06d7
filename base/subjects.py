"""Names and subjects: validation and NATS-style wildcard matching.

A subject is dot-separated tokens (`orders.eu.created`). A pattern may use `*` for exactly one
token and `>` (last token only) for one or more tokens. Names of streams and consumers are
1-128 characters from [A-Za-z0-9_-], so they are safe in keys, paths and URLs.
"""

from __future__ import annotations

import re

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason

_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")
_TOKEN_FORBIDDEN = re.compile(r"[\s\x00-\x1f\x7f]")


def validate_name(name: str, *, what: str) -> str:
    """Checks a stream, consumer or node name; returns it or raises INVALID_NAME."""
    if not name:
        raise RaftlogError(Reason.INVALID_NAME, f"{what} name is empty")
    if len(name.encode()) > limits.name_bytes_max:
        raise RaftlogError(
            Reason.INVALID_NAME,
            f"{what} name is longer than {limits.name_bytes_max} bytes",
            limit=limits.name_bytes_max,
        )
    if not _NAME_RE.fullmatch(name):
        raise RaftlogError(
            Reason.INVALID_NAME,
            f"{what} name {name!r} may only contain letters, digits, '_' and '-'",
        )
    return name


def _tokens(subject: str, *, what: str) -> list[str]:
    if not subject:
        raise RaftlogError(Reason.INVALID_SUBJECT, f"{what} is empty")
    if len(subject.encode()) > limits.subject_bytes_max:
        raise RaftlogError(
            Reason.INVALID_SUBJECT,
            f"{what} is longer than {limits.subject_bytes_max} bytes",
            limit=limits.subject_bytes_max,
        )
    tokens = subject.split(".")
    if len(tokens) > limits.subject_tokens_max:
        raise RaftlogError(
            Reason.INVALID_SUBJECT,
            f"{what} has more than {limits.subject_tokens_max} tokens",
        )
    for token in tokens:
        if not token:
            raise RaftlogError(Reason.INVALID_SUBJECT, f"{what} {subject!r} has an empty token")
        if _TOKEN_FORBIDDEN.search(token):
            raise RaftlogError(
                Reason.INVALID_SUBJECT, f"{what} {subject!r} contains whitespace or control chars"
            )
    return tokens


def validate_subject(subject: str) -> str:
    """A literal subject, as published: no wildcards."""
    for token in _tokens(subject, what="subject"):
        if token in ("*", ">") or "*" in token or ">" in token:
            raise RaftlogError(
                Reason.INVALID_SUBJECT, f"subject {subject!r} may not contain wildcards"
            )
    return subject


def validate_pattern(pattern: str) -> str:
    """A subject pattern: `*` and `>` only as whole tokens, `>` only last."""
    tokens = _tokens(pattern, what="subject pattern")
    for index, token in enumerate(tokens):
        if token == ">" and index != len(tokens) - 1:
            raise RaftlogError(
                Reason.INVALID_SUBJECT, f"pattern {pattern!r}: '>' must be the last token"
            )
        if token not in ("*", ">") and ("*" in token or ">" in token):
            raise RaftlogError(
                Reason.INVALID_SUBJECT,
                f"pattern {pattern!r}: wildcards must be whole tokens",
            )
    return pattern


def is_literal(pattern: str) -> bool:
    return not any(token in ("*", ">") for token in pattern.split("."))


def matches(pattern: str, subject: str) -> bool:
    """True when the literal `subject` matches `pattern`."""
    if pattern == subject:
        return True
    pattern_tokens = pattern.split(".")
    subject_tokens = subject.split(".")
    for index, token in enumerate(pattern_tokens):
        if token == ">":
            return len(subject_tokens) > index
        if index >= len(subject_tokens):
            return False
        if token != "*" and token != subject_tokens[index]:
            return False
    return len(pattern_tokens) == len(subject_tokens)


def matches_any(patterns: list[str] | tuple[str, ...], subject: str) -> bool:
    """An empty pattern list matches every subject."""
    return not patterns or any(matches(pattern, subject) for pattern in patterns)


def patterns_overlap(a: str, b: str) -> bool:
    """True when some literal subject matches both patterns."""
    a_tokens, b_tokens = a.split("."), b.split(".")
    for index in range(max(len(a_tokens), len(b_tokens))):
        a_token = a_tokens[index] if index < len(a_tokens) else None
        b_token = b_tokens[index] if index < len(b_tokens) else None
        if a_token == ">" or b_token == ">":
            return a_token is not None and b_token is not None
        if a_token is None or b_token is None:
            return False
        if a_token != "*" and b_token != "*" and a_token != b_token:
            return False
    return True
