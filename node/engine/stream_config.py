"""Validation of stream configs and updates: every rejection has a reason and a message."""

from __future__ import annotations

from raftlog.base import limits, subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.v1 import streams_pb2, types_pb2


def _invalid(message: str, **metadata: object) -> RaftlogError:
    return RaftlogError(Reason.INVALID_CONFIG, message, **metadata)


def validate_config(config: types_pb2.StreamConfig) -> types_pb2.StreamConfig:
    """Checks a full config (create, or after an update); returns it with defaults filled in."""
    subjects.validate_name(config.name, what="stream")
    if len(config.subjects) > limits.subjects_per_stream_max:
        raise _invalid(f"more than {limits.subjects_per_stream_max} subject patterns")
    for pattern in config.subjects:
        subjects.validate_pattern(pattern)
    if len(set(config.subjects)) != len(config.subjects):
        raise _invalid("subject patterns repeat")
    if config.retention not in types_pb2.RetentionPolicy.values():
        raise _invalid(f"unknown retention policy {config.retention}")
    if config.max_age_ms > limits.max_age_ms_max:
        raise _invalid(f"max_age_ms may be at most {limits.max_age_ms_max}")
    if config.max_msg_bytes > limits.message_bytes_max:
        raise _invalid(
            f"max_msg_bytes may be at most {limits.message_bytes_max}",
            limit=limits.message_bytes_max,
        )
    if config.max_bytes and config.max_msg_bytes > config.max_bytes:
        raise _invalid("max_msg_bytes is larger than max_bytes")
    if config.dedupe_window_ms > limits.dedupe_window_ms_max:
        raise _invalid(f"dedupe_window_ms may be at most {limits.dedupe_window_ms_max}")
    if config.max_age_ms and config.dedupe_window_ms > config.max_age_ms:
        raise _invalid("dedupe_window_ms is longer than max_age_ms")
    if config.max_msgs and config.max_msgs_per_subject > config.max_msgs:
        raise _invalid("max_msgs_per_subject is larger than max_msgs")
    if config.replicas > limits.replicas_max:
        raise _invalid(f"replicas may be at most {limits.replicas_max}")
    if len(config.description.encode()) > limits.description_bytes_max:
        raise _invalid(f"description is longer than {limits.description_bytes_max} bytes")
    filled = types_pb2.StreamConfig()
    filled.CopyFrom(config)
    if not filled.replicas:
        filled.replicas = limits.replicas_default
    return filled


def apply_update(
    current: types_pb2.StreamConfig, update: streams_pb2.UpdateStreamRequest
) -> types_pb2.StreamConfig:
    """The config after `update` (validated); the stream name and retention never change."""
    changed = types_pb2.StreamConfig()
    changed.CopyFrom(current)
    for field in ("max_age_ms", "max_msgs", "max_bytes", "max_msgs_per_subject",
                  "max_msg_bytes", "dedupe_window_ms", "description", "replicas"):
        if update.HasField(field):
            setattr(changed, field, getattr(update, field))
    if update.HasField("subjects"):
        del changed.subjects[:]
        changed.subjects.extend(update.subjects.subjects)
    return validate_config(changed)
