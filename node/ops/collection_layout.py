"""How a hash, set or queue is laid out on its stream: names, subjects, the settings recorded in
the stream's description, and reading liveness off a list of subjects. Pure: no I/O.

- A collection `NAME` of kind hash, set or queue is the stream `HASH_NAME`, `SET_NAME` or
  `QUEUE_NAME`; its settings (kind, max_bytes, max_messages, ephemeral) are the stream's
  description, `raftlog collection {json}`, so they replicate and fail over with the stream.
- A hash field is two subjects, each holding at most one message (max_msgs_per_subject = 1):
  `h.<key>.<field>.v` holds the value, or a tombstone (header TOMBSTONE) once the field is
  deleted; `h.<key>.<field>.d` holds the delete mark, which a delete publishes before its
  tombstone and purges after it has purged the tombstone. A set member is the same under `s.`,
  its value an empty payload.
- So a subject listing of `h.<key>.` tells most fields apart without reading a message: a value
  subject without a mark is live, no value subject is absent, and only a value subject beside a
  mark (a delete under way, or one cut short) needs its message read (`Slot`).
- `<key>`, `<field>` and `<member>` are tokens: the UTF-8 bytes in unpadded base64url, which
  never holds `.`, `*`, `>` or whitespace and maps distinct strings to distinct tokens. A token
  decodes back to its string, and tokens sort like their encoded text.
- A queue's values are messages at the one subject `q` of a work-queue stream, handed out by the
  queue's one consumer `pop`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from dataclasses import dataclass

from raftlog.base import limits, subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.v1 import collections_pb2, consumers_pb2, streams_pb2, types_pb2

Kind = collections_pb2.CollectionKind
HASH = collections_pb2.COLLECTION_KIND_HASH
SET = collections_pb2.COLLECTION_KIND_SET
QUEUE = collections_pb2.COLLECTION_KIND_QUEUE

STREAM_PREFIX: dict[int, str] = {HASH: "HASH_", SET: "SET_", QUEUE: "QUEUE_"}
WORD: dict[int, str] = {HASH: "hash", SET: "set", QUEUE: "queue"}
_ROOT: dict[int, str] = {HASH: "h", SET: "s"}
QUEUE_SUBJECT = "q"
POP_CONSUMER = "pop"
VALUE_TOKEN = "v"
MARK_TOKEN = "d"
TOMBSTONE = types_pb2.Header(key="raftlog-collection", value="deleted")
DESCRIPTION_PREFIX = "raftlog collection "
# Every character a subject below a key prefix may hold next, in ASCII order: listing a key
# page by page narrows its prefix by one of these at a time.
PREFIX_ALPHABET = "".join(sorted(
    "-._0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))


@dataclass(frozen=True)
class Settings:
    kind: int
    max_bytes: int = 0
    max_messages: int = 0
    ephemeral: bool = False

    @property
    def bounded(self) -> bool:
        return bool(self.max_bytes or self.max_messages)


@dataclass(frozen=True)
class Target:
    """One collection: what the caller named it and the stream that holds it."""

    kind: int
    name: str
    stream: str

    @property
    def word(self) -> str:
        return WORD[self.kind]


@dataclass(frozen=True)
class Slot:
    """One field or member as its subjects show it: the seq of the message at its value subject
    and of its delete mark (0: none)."""

    token: str
    value_seq: int = 0
    mark_seq: int = 0

    @property
    def live(self) -> bool:
        """Certainly live: a value and no delete under way."""
        return bool(self.value_seq) and not self.mark_seq

    @property
    def doubtful(self) -> bool:
        """Its value subject may hold a tombstone: only its message tells."""
        return bool(self.value_seq) and bool(self.mark_seq)


# ------------------------------------------------------------------------------------ names


def check_kind(kind: int) -> int:
    if kind not in STREAM_PREFIX:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"kind must be hash, set or queue, not {kind}",
                           field="kind")
    return kind


def target(kind: int, name: str) -> Target:
    """The collection `name` of `kind`, its name checked (INVALID_NAME)."""
    check_kind(kind)
    subjects.validate_name(name, what=f"{WORD[kind]} name")
    if len(name.encode()) > limits.collection_name_bytes_max:
        raise RaftlogError(Reason.INVALID_NAME, f"{WORD[kind]} name is longer than "
                           f"{limits.collection_name_bytes_max} bytes",
                           limit=limits.collection_name_bytes_max)
    return Target(kind=kind, name=name, stream=STREAM_PREFIX[kind] + name)


def target_of_stream(stream: str) -> Target | None:
    """The collection a stream's name says it holds, or None."""
    for kind, prefix in STREAM_PREFIX.items():
        if stream.startswith(prefix) and len(stream) > len(prefix):
            return Target(kind=kind, name=stream[len(prefix):], stream=stream)
    return None


# ----------------------------------------------------------------------------------- tokens


def encode_token(text: str, *, what: str, bytes_max: int) -> str:
    """`text` as a subject token (unpadded base64url of its UTF-8 bytes); INVALID_ARGUMENT when
    it is empty or longer than `bytes_max` bytes."""
    raw = text.encode()
    if not raw:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"{what} is empty", field=what)
    if len(raw) > bytes_max:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"{what} is longer than {bytes_max} bytes",
                           field=what, limit=bytes_max)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_token(token: str) -> str:
    """The string `encode_token` made `token` from; ValueError when it is not one."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not a collection token: {token!r}") from exc
    if encode_token_raw(raw) != token:
        raise ValueError(f"not a collection token: {token!r}")
    return raw.decode()


def encode_token_raw(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def key_token(key: str) -> str:
    return encode_token(key, what="key", bytes_max=limits.collection_key_bytes_max)


def item_token(item: str, *, what: str) -> str:
    return encode_token(item, what=what, bytes_max=limits.collection_field_bytes_max)


# --------------------------------------------------------------------------------- subjects


def key_prefix(kind: int, key: str) -> str:
    """The prefix of every subject of one hash or set key."""
    return f"{_ROOT[kind]}.{key_token(key)}."


def item_prefix(kind: int, key: str, item: str, *, what: str) -> str:
    """The prefix of one field's or member's two subjects."""
    return f"{key_prefix(kind, key)}{item_token(item, what=what)}."


def value_subject(prefix: str) -> str:
    return prefix + VALUE_TOKEN


def mark_subject(prefix: str) -> str:
    return prefix + MARK_TOKEN


def slots(summaries: Iterable[streams_pb2.SubjectSummary], prefix: str) -> list[Slot]:
    """The fields or members below a key `prefix`, in token order, from its subjects. A subject
    of another shape (published to the stream by hand) is passed over."""
    found: dict[str, tuple[int, int]] = {}
    for summary in summaries:
        rest = summary.subject[len(prefix):] if summary.subject.startswith(prefix) else ""
        token, dot, role = rest.partition(".")
        if not token or not dot or role not in (VALUE_TOKEN, MARK_TOKEN):
            continue
        value_seq, mark_seq = found.get(token, (0, 0))
        if role == VALUE_TOKEN:
            value_seq = summary.last_seq
        else:
            mark_seq = summary.last_seq
        found[token] = (value_seq, mark_seq)
    return [Slot(token, value_seq=v, mark_seq=d) for token, (v, d) in sorted(found.items())]


def slot(summaries: Iterable[streams_pb2.SubjectSummary], prefix: str) -> Slot:
    """One field or member from the subjects under its own `item_prefix`."""
    seqs = {summary.subject: summary.last_seq for summary in summaries}
    token = prefix[:-1].rpartition(".")[2]
    return Slot(token, value_seq=seqs.get(value_subject(prefix), 0),
                mark_seq=seqs.get(mark_subject(prefix), 0))


def is_tombstone(message: types_pb2.Message) -> bool:
    return any(h.key == TOMBSTONE.key and h.value == TOMBSTONE.value for h in message.headers)


# ---------------------------------------------------------------------------- sizes, settings


def stored_bytes(subject: str, payload: bytes, headers: Iterable[types_pb2.Header] = ()) -> int:
    """What a message counts for in its stream's bytes: the engine's rule (engine/stream_core.py
    `stored_size`): subject, payload and every header's key and value."""
    return len(subject.encode()) + len(payload) + sum(
        len(h.key.encode()) + len(h.value.encode()) for h in headers)


def message_bytes(message: types_pb2.Message) -> int:
    return stored_bytes(message.subject, message.payload, message.headers)


def describe(settings: Settings) -> str:
    return DESCRIPTION_PREFIX + json.dumps({
        "kind": WORD[settings.kind], "max_bytes": settings.max_bytes,
        "max_messages": settings.max_messages, "ephemeral": settings.ephemeral},
        sort_keys=True)


def settings_of(description: str, *, kind: int) -> Settings | None:
    """The settings a collection stream of `kind` recorded, or None when the description is
    not one (a stream made by hand that merely has a collection's name)."""
    if not description.startswith(DESCRIPTION_PREFIX):
        return None
    try:
        fields = json.loads(description[len(DESCRIPTION_PREFIX):])
        if fields.get("kind") != WORD[kind]:
            return None
        return Settings(kind=kind, max_bytes=int(fields["max_bytes"]),
                        max_messages=int(fields["max_messages"]),
                        ephemeral=bool(fields["ephemeral"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def settings_from_request(request: collections_pb2.CreateCollectionRequest) -> Settings:
    kind = check_kind(request.kind)
    if request.max_messages and kind != QUEUE:
        raise RaftlogError(Reason.INVALID_ARGUMENT, "max_messages applies to queues only",
                           field="max_messages")
    return Settings(kind=kind, max_bytes=request.max_bytes, max_messages=request.max_messages,
                    ephemeral=request.ephemeral)


def stream_config(collection: Target, settings: Settings) -> types_pb2.StreamConfig:
    """The stream that holds a new collection. Its own max_bytes stays 0: a stream over its
    limit drops its oldest messages, a collection refuses the write instead (ops/collections.py
    checks it)."""
    config = types_pb2.StreamConfig(name=collection.stream, description=describe(settings))
    if collection.kind == QUEUE:
        config.subjects.append(QUEUE_SUBJECT)
        config.retention = types_pb2.RETENTION_POLICY_WORK_QUEUE
    else:
        config.subjects.append(f"{_ROOT[collection.kind]}.>")
        config.max_msgs_per_subject = 1
    return config


def pop_consumer() -> consumers_pb2.ConsumerConfig:
    """The consumer every pop of a queue fetches from: unlimited deliveries (a value is never
    dropped), a short ack wait (a value whose pop died comes back soon)."""
    return consumers_pb2.ConsumerConfig(
        name=POP_CONSUMER, ack_wait_ms=limits.queue_pop_ack_wait_ms,
        description="the pops of this queue (raftlog collections)")


def info(collection: Target, settings: Settings,
         stream: types_pb2.StreamInfo) -> collections_pb2.CollectionInfo:
    return collections_pb2.CollectionInfo(
        kind=collection.kind, name=collection.name, stream=collection.stream,  # type: ignore[arg-type]
        max_bytes=settings.max_bytes, max_messages=settings.max_messages,
        ephemeral=settings.ephemeral, durable=True, bytes=stream.state.bytes,
        messages=stream.state.messages, created_ms=stream.created_ms)
