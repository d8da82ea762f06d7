"""What a user's rules allow (docs/auth.md): pure functions over a `UserRules` protobuf.

A pattern is a NATS subject pattern. Publishing one literal subject needs an allow pattern that
matches it and no deny pattern that matches it. Subscribing names a pattern (a consumer's filter,
or each subject pattern of the stream when the consumer has none): it needs an allow pattern that
covers every subject the pattern can match, and no deny pattern that can match any of them. Deny
always wins; empty allow lists allow nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from raftlog.base.subjects import matches, patterns_overlap
from raftlog.internal import raft_pb2


def covers(allow: str, pattern: str) -> bool:
    """True when every subject `pattern` matches is matched by `allow` too."""
    allow_tokens, tokens = allow.split("."), pattern.split(".")
    for index, token in enumerate(allow_tokens):
        if token == ">":
            return len(tokens) > index
        if index >= len(tokens) or tokens[index] == ">":
            return False
        if token != "*" and (tokens[index] == "*" or tokens[index] != token):
            return False
    return len(allow_tokens) == len(tokens)


def may_publish(rules: raft_pb2.UserRules, subject: str) -> bool:
    if any(matches(deny, subject) for deny in rules.publish_deny):
        return False
    return any(matches(allow, subject) for allow in rules.publish_allow)


def may_subscribe(rules: raft_pb2.UserRules, patterns: Iterable[str]) -> bool:
    """True when the user may read every subject of every pattern (no pattern: False)."""
    wanted = list(patterns)
    if not wanted:
        return False
    for pattern in wanted:
        if any(patterns_overlap(deny, pattern) for deny in rules.subscribe_deny):
            return False
        if not any(covers(allow, pattern) for allow in rules.subscribe_allow):
            return False
    return True
