"""How scheduled (delayed) messages are laid out: pure functions only.

A message published with a future `deliver_at_ms` waits in the schedule stream of its target,

    SCHED_<target>       (a target too long for that: SCHED_<prefix>-h<16 hex of its sha256>)

an ordinary stream whose description names the target (DESCRIPTION_PREFIX + target); only a
stream with that description is taken for a schedule, so a user's stream that happens to be
called SCHED_x is never written to or drained. The waiting copy keeps the subject, payload,
headers and msg_id of the original and adds the header DELIVER_AT_HEADER (the due time, Unix
ms). Its seq in the schedule stream is its schedule seq. A cancel appends a marker (subject
CANCEL_SUBJECT, header CANCEL_SEQ_HEADER naming the schedule seq) before it removes the waiting
copy: the marker is majority-committed, the removal is not, so a primary that takes over
before the removal reached it still knows the copy was cancelled.

When due, the copy is appended to the target with the headers SCHEDULED_AT_HEADER (the due
time) and SCHEDULE_SEQ_HEADER, and with the original msg_id, or `sched:<schedule seq>` when it
had none, so an append repeated after a failover is absorbed by the target's dedupe window
(schedule_runner.py also looks for such copies on takeover).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.v1 import streams_pb2, types_pb2

SCHEDULE_PREFIX = "SCHED_"
DESCRIPTION_PREFIX = "raftlog schedule of stream "
DELIVER_AT_HEADER = "Raftlog-Deliver-At-Ms"
SCHEDULED_AT_HEADER = "Raftlog-Scheduled-At"
SCHEDULE_SEQ_HEADER = "Raftlog-Schedule-Seq"
CANCEL_SUBJECT = "raftlog.cancel"
CANCEL_SEQ_HEADER = "Raftlog-Cancel-Seq"
MSG_ID_PREFIX = "sched:"
_HASH_HEX = 16
_OWN_HEADERS = frozenset(name.lower() for name in (
    DELIVER_AT_HEADER, SCHEDULED_AT_HEADER, SCHEDULE_SEQ_HEADER, CANCEL_SEQ_HEADER))

# RocketMQ's delay levels 1..18 (messageDelayLevel's default), in seconds.
_DELAY_LEVELS_S = (1, 5, 10, 30, 60, 2 * 60, 3 * 60, 4 * 60, 5 * 60, 6 * 60, 7 * 60, 8 * 60,
                   9 * 60, 10 * 60, 20 * 60, 30 * 60, 3600, 2 * 3600)


def schedule_stream(target: str) -> str:
    """The name of `target`'s schedule stream (target checked by the caller)."""
    name = SCHEDULE_PREFIX + target
    if len(name.encode()) <= limits.name_bytes_max:
        return name
    digest = hashlib.sha256(target.encode()).hexdigest()[:_HASH_HEX]
    keep = limits.name_bytes_max - len(SCHEDULE_PREFIX) - len(digest) - 2
    return f"{SCHEDULE_PREFIX}{target[:keep]}-h{digest}"


def schedule_config(target: types_pb2.StreamConfig) -> types_pb2.StreamConfig:
    """The config of a target's schedule stream: any subject, the target's replicas."""
    return types_pb2.StreamConfig(name=schedule_stream(target.name),
                                  description=DESCRIPTION_PREFIX + target.name,
                                  replicas=target.replicas)


def target_of(config: types_pb2.StreamConfig) -> str | None:
    """The target whose schedule this stream is, or None for any other stream."""
    if not (config.name.startswith(SCHEDULE_PREFIX)
            and config.description.startswith(DESCRIPTION_PREFIX)):
        return None
    target = config.description[len(DESCRIPTION_PREFIX):]
    return target if target and schedule_stream(target) == config.name else None


def delay_level_ms(level: int) -> int:
    """RocketMQ's delay level (1..18: 1s 5s 10s 30s 1m..10m 20m 30m 1h 2h) in ms."""
    if not 1 <= level <= len(_DELAY_LEVELS_S):
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"a delay level is 1 to "
                           f"{len(_DELAY_LEVELS_S)}, not {level}", field="delay_level")
    return _DELAY_LEVELS_S[level - 1] * 1000


def is_future(deliver_at_ms: int, *, now_ms: int) -> bool:
    """Whether a publish must wait; INVALID_ARGUMENT when it is too far ahead."""
    if deliver_at_ms > now_ms + limits.scheduled_delay_ms_max:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"deliver_at_ms {deliver_at_ms} is more than "
                           f"{limits.scheduled_delay_ms_max} ms ahead", field="deliver_at_ms",
                           limit=limits.scheduled_delay_ms_max)
    return deliver_at_ms > now_ms


def _without_own(headers: Iterable[types_pb2.Header]) -> list[types_pb2.Header]:
    return [types_pb2.Header(key=h.key, value=h.value) for h in headers
            if h.key.lower() not in _OWN_HEADERS]


def waiting_copy(request: streams_pb2.PublishRequest, *, schedule: str
                 ) -> streams_pb2.PublishRequest:
    """What the schedule stream stores for a publish due at request.deliver_at_ms."""
    headers = _without_own(request.headers)
    headers.append(types_pb2.Header(key=DELIVER_AT_HEADER, value=str(request.deliver_at_ms)))
    return streams_pb2.PublishRequest(stream=schedule, subject=request.subject,
                                      payload=request.payload, headers=headers,
                                      msg_id=request.msg_id)


def due_ms(headers: Sequence[tuple[str, str]]) -> int | None:
    """The due time a waiting copy's headers carry, or None (not a waiting copy)."""
    for key, value in headers:
        if key == DELIVER_AT_HEADER:
            return int(value) if value.isdigit() else None
    return None


def cancel_marker(seq: int) -> streams_pb2.PublishEntry:
    """The record of a cancel of schedule seq `seq`, kept in the schedule stream."""
    return streams_pb2.PublishEntry(subject=CANCEL_SUBJECT, headers=[
        types_pb2.Header(key=CANCEL_SEQ_HEADER, value=str(seq))])


def cancelled_seq(headers: Sequence[tuple[str, str]]) -> int | None:
    """The schedule seq a cancel marker's headers name, or None (not a marker)."""
    for key, value in headers:
        if key == CANCEL_SEQ_HEADER:
            return int(value) if value.isdigit() else None
    return None


def header_pairs(message: types_pb2.Message) -> tuple[tuple[str, str], ...]:
    return tuple((h.key, h.value) for h in message.headers)


def delivered_copy(message: types_pb2.Message, *, due: int) -> streams_pb2.PublishEntry:
    """What the target gets for a waiting copy (schedule seq = message.seq)."""
    headers = _without_own(message.headers)
    headers.append(types_pb2.Header(key=SCHEDULED_AT_HEADER, value=str(due)))
    headers.append(types_pb2.Header(key=SCHEDULE_SEQ_HEADER, value=str(message.seq)))
    return streams_pb2.PublishEntry(subject=message.subject, payload=message.payload,
                                    headers=headers,
                                    msg_id=message.msg_id or f"{MSG_ID_PREFIX}{message.seq}")


def schedule_seq_of(message: types_pb2.Message) -> int | None:
    """The schedule seq a target message was delivered from, if it was."""
    for header in message.headers:
        if header.key == SCHEDULE_SEQ_HEADER and header.value.isdigit():
            return int(header.value)
    return None


def size_bytes(message: types_pb2.Message) -> int:
    return len(message.payload) + sum(len(h.key.encode()) + len(h.value.encode())
                                      for h in message.headers)
