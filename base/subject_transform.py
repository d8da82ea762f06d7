"""Subject transforms in NATS style: a pattern picks subjects, a destination rebuilds them.

The pattern is a subject pattern (`*` for one token, `>` for the rest). Its wildcards are
numbered from 1 in the order they appear; in the destination `{{wildcard(N)}}` (NATS also
spells it `{{Wildcard(N)}}`, and spaces inside the braces are allowed) stands for what the N-th
one matched: one token for `*`, the remaining tokens joined by dots for `>`.

    transform = SubjectTransform.parse(pattern="events.*.>", destination="audit.{{wildcard(1)}}.x")
    transform.apply("events.eu.a.b")  ->  "audit.eu.x"

`parse` checks everything that can be checked without a subject (INVALID_CONFIG); `apply`
raises TransformMismatch for a subject the pattern does not match. No I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from raftlog.base import subjects
from raftlog.base.errors import RaftlogError, Reason

_FUNCTION_RE = re.compile(r"\{\{\s*([A-Za-z_]+)\s*\(\s*([^)]*?)\s*\)\s*\}\}")
_WILDCARD_FUNCTION = "wildcard"


class TransformMismatch(Exception):
    """The subject does not match the transform's pattern."""


def _invalid(message: str) -> RaftlogError:
    return RaftlogError(Reason.INVALID_CONFIG, message)


@dataclass(frozen=True)
class SubjectTransform:
    pattern: str
    destination: str
    # The destination as literal text and wildcard numbers (1-based), in order.
    parts: tuple[str | int, ...]

    @classmethod
    def parse(cls, *, pattern: str, destination: str) -> SubjectTransform:
        """Checks the pattern and the destination; INVALID_CONFIG names what is wrong."""
        try:
            subjects.validate_pattern(pattern)
        except RaftlogError as err:
            raise _invalid(f"subject transform pattern: {err.message}") from None
        if not destination:
            raise _invalid("subject transform destination is empty")
        wildcards = sum(1 for token in pattern.split(".") if token in ("*", ">"))
        parts: list[str | int] = []
        position = 0
        for found in _FUNCTION_RE.finditer(destination):
            parts.append(destination[position:found.start()])
            parts.append(_wildcard_number(found, destination, wildcards=wildcards,
                                          pattern=pattern))
            position = found.end()
        parts.append(destination[position:])
        literal = "".join(part if isinstance(part, str) else "x" for part in parts)
        if "{{" in literal or "}}" in literal:
            raise _invalid(f"subject transform destination {destination!r}: unbalanced or "
                           "unknown '{{...}}'")
        try:
            subjects.validate_subject(literal)
        except RaftlogError as err:
            raise _invalid(f"subject transform destination {destination!r}: {err.message}"
                           ) from None
        return cls(pattern=pattern, destination=destination,
                   parts=tuple(part for part in parts if part != ""))

    def apply(self, subject: str) -> str:
        """The subject rewritten; TransformMismatch when the pattern does not match it."""
        captured = _capture(self.pattern, subject)
        if captured is None:
            raise TransformMismatch(f"subject {subject!r} does not match the transform "
                                    f"pattern {self.pattern!r}")
        return "".join(part if isinstance(part, str) else captured[part - 1]
                       for part in self.parts)


def _wildcard_number(found: re.Match[str], destination: str, *, wildcards: int,
                     pattern: str) -> int:
    name, argument = found.group(1), found.group(2)
    if name.lower() != _WILDCARD_FUNCTION:
        raise _invalid(f"subject transform destination {destination!r}: unsupported function "
                       f"{name!r} (only wildcard(N))")
    if not argument.isdigit():
        raise _invalid(f"subject transform destination {destination!r}: wildcard() takes a "
                       f"number, not {argument!r}")
    number = int(argument)
    if not 1 <= number <= wildcards:
        raise _invalid(f"subject transform destination {destination!r} refers to wildcard "
                       f"{number}, but the pattern {pattern!r} has {wildcards} wildcard(s)")
    return number


def _capture(pattern: str, subject: str) -> list[str] | None:
    """What each wildcard of `pattern` matched in `subject`, in order; None: no match."""
    pattern_tokens = pattern.split(".")
    subject_tokens = subject.split(".")
    captured: list[str] = []
    for index, token in enumerate(pattern_tokens):
        if token == ">":
            if len(subject_tokens) <= index:
                return None
            captured.append(".".join(subject_tokens[index:]))
            return captured
        if index >= len(subject_tokens):
            return None
        if token == "*":
            captured.append(subject_tokens[index])
        elif token != subject_tokens[index]:
            return None
    return captured if len(pattern_tokens) == len(subject_tokens) else None
