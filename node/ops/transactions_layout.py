"""How transactions are laid out on streams (docs/transactions.md). Pure functions only: the
half stream of a target, transaction ids, the half message and the decision records, and what
the janitor does with an open transaction.

A target stream T has one half stream, `TXN_<T>` (a longer name is cut and ends in `_h` and
the FNV-1a hash of T, so it still fits a stream name; its description names T). In it:

    txn.half.<token>   one prepared message: the client's payload and headers, plus the
                       Raftlog-Txn-* headers naming its target, subject, msg_id and timeout
    txn.end.<seq>      the decision on the prepared message at <seq>: first `commit` or
                       `rollback` (written only if the subject is empty, so one decision
                       wins), then for a commit `landed` (with the target seq) or `failed`

A transaction id is `<half stream>:<seq>`: any node routes it to the half stream's primary.
The prepared message is purged once its transaction ended; the decision records stay until the
half stream's max_age (limits.txn_record_age_ms) drops them.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

from raftlog.base import limits, subjects, topics
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.stream_core import stored_size
from raftlog.v1 import streams_pb2, transactions_pb2, types_pb2

HALF_PREFIX = "TXN_"
HALF_SUBJECTS = ("txn.>",)
HALF_SUBJECT_PREFIX = "txn.half."
HALF_FILTER = "txn.half.*"
END_SUBJECT_PREFIX = "txn.end."
DESCRIPTION_PREFIX = "transactions of stream "

TARGET_HEADER = "Raftlog-Txn-Stream"
SUBJECT_HEADER = "Raftlog-Txn-Subject"
MSG_ID_HEADER = "Raftlog-Txn-Msg-Id"
TIMEOUT_HEADER = "Raftlog-Txn-Timeout-Ms"
ID_HEADER = "Raftlog-Txn-Id"  # on the committed message in the target: which transaction
_OWN_HEADERS = frozenset(name.lower() for name in (
    TARGET_HEADER, SUBJECT_HEADER, MSG_ID_HEADER, TIMEOUT_HEADER, ID_HEADER))

_HASH_SUFFIX_BYTES = 10  # "_h" + 8 hex digits


class Decision(enum.Enum):
    COMMIT = "commit"  # decided; the message may not be in the target yet
    LANDED = "landed"  # in the target at `target_seq`
    FAILED = "failed"  # the target refused it for good (`reason`, `text`)
    ROLLBACK = "rollback"


class JanitorAction(enum.Enum):
    FINISH_COMMIT = "finish_commit"
    PURGE = "purge"  # ended; only the prepared message is left to remove
    ROLLBACK_TIMEOUT = "rollback_timeout"
    ROLLBACK_CHECKS = "rollback_checks"


@dataclass(frozen=True)
class Record:
    """One decision record, as read back from `txn.end.<seq>` (stored at `record_seq`)."""

    decision: Decision
    record_seq: int
    target_seq: int = 0
    stream: str = ""  # the target, on a `landed` record
    by: str = ""
    reason: str = ""
    text: str = ""


@dataclass(frozen=True)
class Prepared:
    """A prepared message as the half stream holds it."""

    txn_id: str
    half_seq: int
    half_subject: str
    target: str
    subject: str
    msg_id: str
    timeout_ms: int
    prepared_ms: int
    payload_bytes: int


# ---------------------------------------------------------------------- names and ids


def half_stream(target: str) -> str:
    """The half stream of target stream `target` (a valid stream name)."""
    name = HALF_PREFIX + target
    if len(name.encode()) <= limits.name_bytes_max:
        return name
    kept = limits.name_bytes_max - len(HALF_PREFIX) - _HASH_SUFFIX_BYTES
    return f"{HALF_PREFIX}{target[:kept]}_h{topics.fnv1a_32(target.encode()):08x}"


def is_half_config(config: types_pb2.StreamConfig) -> bool:
    """True for a stream made by `half_config` (a user stream named TXN_... is not one)."""
    return (config.name.startswith(HALF_PREFIX) and tuple(config.subjects) == HALF_SUBJECTS
            and config.description.startswith(DESCRIPTION_PREFIX))


def half_config(target: types_pb2.StreamConfig) -> types_pb2.StreamConfig:
    """The half stream of `target`, with as many copies."""
    return types_pb2.StreamConfig(
        name=half_stream(target.name), subjects=HALF_SUBJECTS, replicas=target.replicas,
        max_age_ms=limits.txn_record_age_ms, description=DESCRIPTION_PREFIX + target.name)


def txn_id(*, half: str, seq: int) -> str:
    return f"{half}:{seq}"


def parse_txn_id(text: str) -> tuple[str, int]:
    """(half stream, seq) of a transaction id; INVALID_ARGUMENT when it is not one."""
    half, sep, seq = text.rpartition(":")
    if not sep or not half.startswith(HALF_PREFIX) or not seq.isdigit() or int(seq) < 1 \
            or seq != str(int(seq)):
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"{text!r} is not a transaction id "
                           "(Prepare answers one)", field="txn_id")
    subjects.validate_name(half, what="stream")
    return half, int(seq)


def end_subject(seq: int) -> str:
    return f"{END_SUBJECT_PREFIX}{seq}"


def default_topic_subject(topic: str) -> str:
    """The subject of a topic message that names none (as PublishToTopic picks it)."""
    try:
        return subjects.validate_subject(topic)
    except RaftlogError:
        return topics.partition_stream(topic, 0)


# ---------------------------------------------------------------------- messages


def half_entry(request: transactions_pb2.PrepareRequest, *, half: str, target: str,
               subject: str, token: str, timeout_ms: int,
               extra: list[types_pb2.Header]) -> streams_pb2.PublishRequest:
    """The prepared message for the half stream (`token` makes its subject unique)."""
    headers = [h for h in request.headers if h.key.lower() not in _OWN_HEADERS]
    headers.extend(extra)
    headers.append(types_pb2.Header(key=TARGET_HEADER, value=target))
    headers.append(types_pb2.Header(key=SUBJECT_HEADER, value=subject))
    headers.append(types_pb2.Header(key=TIMEOUT_HEADER, value=str(timeout_ms)))
    if request.msg_id:
        headers.append(types_pb2.Header(key=MSG_ID_HEADER, value=request.msg_id))
    return streams_pb2.PublishRequest(
        stream=half, subject=HALF_SUBJECT_PREFIX + token, payload=request.payload,
        headers=headers, msg_id=f"prep:{request.msg_id}" if request.msg_id else "")


def _header(message: types_pb2.Message, key: str) -> str | None:
    for header in message.headers:
        if header.key == key:
            return header.value
    return None


def prepared(message: types_pb2.Message, *, half: str) -> Prepared | None:
    """The prepared message stored at `message` (None: not a prepared message)."""
    target = _header(message, TARGET_HEADER)
    timeout = _header(message, TIMEOUT_HEADER) or ""
    if not message.subject.startswith(HALF_SUBJECT_PREFIX) or target is None \
            or not timeout.isdigit():
        return None
    return Prepared(txn_id=txn_id(half=half, seq=message.seq), half_seq=message.seq,
                    half_subject=message.subject, target=target,
                    subject=_header(message, SUBJECT_HEADER) or "",
                    msg_id=_header(message, MSG_ID_HEADER) or "", timeout_ms=int(timeout),
                    prepared_ms=message.ts_ms, payload_bytes=len(message.payload))


def landing_entry(message: types_pb2.Message, txn: Prepared) -> streams_pb2.PublishRequest:
    """What a commit appends to the target: the client's message, marked with its
    transaction; its msg_id the client's, else one derived from the transaction id (so the
    target's dedupe window absorbs a repeated append)."""
    headers = [h for h in message.headers if h.key.lower() not in _OWN_HEADERS]
    headers.append(types_pb2.Header(key=ID_HEADER, value=txn.txn_id))
    return streams_pb2.PublishRequest(
        stream=txn.target, subject=txn.subject, payload=message.payload, headers=headers,
        msg_id=txn.msg_id or f"txn:{txn.txn_id}")


def landing_size_max(request: transactions_pb2.PrepareRequest, *, half: str, subject: str,
                     extra: list[types_pb2.Header]) -> int:
    """The most bytes the committed message can count for in the target's limits (its
    transaction id taken at its longest)."""
    headers = [h for h in request.headers if h.key.lower() not in _OWN_HEADERS]
    headers.extend(extra)
    headers.append(types_pb2.Header(key=ID_HEADER, value=txn_id(half=half, seq=2**64 - 1)))
    return stored_size(streams_pb2.PublishEntry(subject=subject, payload=request.payload,
                                                headers=headers))


def is_landing_of(message: types_pb2.Message, txn_id_text: str) -> bool:
    return _header(message, ID_HEADER) == txn_id_text


def record_entry(seq: int, record: Record, *, half: str,
                 expected_subject_seq: int) -> streams_pb2.PublishRequest:
    """A decision record for the prepared message at `seq`, stored only when the last record
    at its subject is `expected_subject_seq` (0: none yet)."""
    body = {"decision": record.decision.value}
    if record.target_seq:
        body["target_seq"] = str(record.target_seq)
    for key in ("stream", "by", "reason", "text"):
        if getattr(record, key):
            body[key] = getattr(record, key)
    return streams_pb2.PublishRequest(stream=half, subject=end_subject(seq),
                                      payload=json.dumps(body, sort_keys=True).encode(),
                                      expected_last_subject_seq=expected_subject_seq)


def parse_record(message: types_pb2.Message) -> Record:
    """The decision record stored at `message`; INTERNAL when it is not one."""
    try:
        body = json.loads(message.payload)
        return Record(decision=Decision(body["decision"]), record_seq=message.seq,
                      target_seq=int(body.get("target_seq", 0)),
                      stream=body.get("stream", ""), by=body.get("by", ""),
                      reason=body.get("reason", ""), text=body.get("text", ""))
    except (ValueError, KeyError, TypeError) as err:
        raise RaftlogError(Reason.INTERNAL, f"the decision record at seq {message.seq} of "
                           f"{message.stream!r} does not parse: {err}") from None


# ---------------------------------------------------------------------- the janitor's rule


def janitor_action(txn: Prepared, record: Record | None, *, now_ms: int, checks: int
                   ) -> JanitorAction | None:
    """What the half stream's primary does with a prepared message still stored: finish a
    decided commit, purge an ended one, roll back one past its timeout or asked about
    limits.txn_checks_max times; None leaves it open."""
    if record is not None:
        if record.decision is Decision.COMMIT:
            return JanitorAction.FINISH_COMMIT
        return JanitorAction.PURGE
    if now_ms - txn.prepared_ms >= txn.timeout_ms:
        return JanitorAction.ROLLBACK_TIMEOUT
    if checks >= limits.txn_checks_max:
        return JanitorAction.ROLLBACK_CHECKS
    return None


def info(txn: Prepared, *, now_ms: int, checks: int, committing: bool
         ) -> transactions_pb2.TransactionInfo:
    return transactions_pb2.TransactionInfo(
        txn_id=txn.txn_id, stream=txn.target, subject=txn.subject, msg_id=txn.msg_id,
        payload_bytes=txn.payload_bytes, prepared_ms=txn.prepared_ms,
        age_ms=max(now_ms - txn.prepared_ms, 0), timeout_ms=txn.timeout_ms, checks=checks,
        committing=committing)
