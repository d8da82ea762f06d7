"""When a delayed RocketMQ message is due: the time fields of a send, read the same way by the
v1 and v2 front-ends (docs/rocketmq-v1.md, docs/rocketmq.md; the scheduling itself is the
topic publish's `deliver_at_ms`, docs/scheduled.md)."""

from __future__ import annotations

from typing import Any

from raftlog.base import limits
from raftlog.node.ops import schedule_layout


def timestamp_ms(stamp: Any) -> int:
    """A google.protobuf.Timestamp as unix ms. Some clients (rocketmq-python-client) put
    milliseconds in the seconds field: a seconds value past limits.rocketmq_seconds_max (the
    year 5138) is taken as milliseconds, which no real seconds value reaches."""
    if stamp.seconds > limits.rocketmq_seconds_max:
        return int(stamp.seconds)
    return int(stamp.seconds) * 1000 + int(stamp.nanos) // 1_000_000


def delay_level_due_ms(level: int, *, now_ms: int) -> int:
    """When a message sent now with RocketMQ delay level `level` (1..18) is due;
    INVALID_ARGUMENT for any other level."""
    return now_ms + schedule_layout.delay_level_ms(level)


def checked_due_ms(due_ms: int, *, now_ms: int) -> int:
    """`due_ms`, or 0 when it is not in the future (an ordinary send); INVALID_ARGUMENT when it
    is more than limits.scheduled_delay_ms_max ahead."""
    return due_ms if schedule_layout.is_future(due_ms, now_ms=now_ms) else 0
