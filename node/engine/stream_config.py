"""Validation of stream configs and updates: every rejection has a reason and a message."""

from __future__ import annotations

from raftlog.base import limits, subjects, topics
from raftlog.base.errors import RaftlogError, Reason
from raftlog.base.subject_transform import SubjectTransform
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
    if config.discard not in types_pb2.DiscardPolicy.values():
        raise _invalid(f"unknown discard policy {config.discard}")
    if config.max_msgs_per_s > limits.quota_msgs_per_s_max:
        raise _invalid(f"max_msgs_per_s may be at most {limits.quota_msgs_per_s_max}",
                       limit=limits.quota_msgs_per_s_max)
    if config.max_bytes_per_s > limits.quota_bytes_per_s_max:
        raise _invalid(f"max_bytes_per_s may be at most {limits.quota_bytes_per_s_max}",
                       limit=limits.quota_bytes_per_s_max)
    if len(config.description.encode()) > limits.description_bytes_max:
        raise _invalid(f"description is longer than {limits.description_bytes_max} bytes")
    validate_sources(config)
    validate_partition(config)
    filled = types_pb2.StreamConfig()
    filled.CopyFrom(config)
    if not filled.replicas:
        filled.replicas = limits.replicas_default
    return filled


def validate_partition(config: types_pb2.StreamConfig) -> None:
    """A name in the partition form (base/topics.py) only with a matching `partition`, and a
    `partition` only on the stream named after it: plain streams never collide with topics."""
    reserved = topics.is_reserved(config.name)
    if not config.HasField("partition"):
        if reserved:
            raise RaftlogError(Reason.INVALID_NAME, f"stream names starting with "
                               f"{topics.PARTITION_PREFIX!r} are kept for topic partitions",
                               stream=config.name)
        return
    part = config.partition
    topics.validate_topic(part.topic)
    topics.validate_partitions(part.count)
    if part.index >= part.count:
        raise _invalid(f"partition {part.index} of a topic with {part.count} partitions")
    expected = topics.partition_stream(part.topic, part.index)
    if config.name != expected:
        raise _invalid(f"partition {part.index} of topic {part.topic!r} is the stream "
                       f"{expected!r}, not {config.name!r}")


def source_transform(source: types_pb2.StreamSource) -> SubjectTransform | None:
    """The source's subject transform (INVALID_CONFIG if malformed); None without one. An
    empty pattern is the source's filter, or `>` without one."""
    spec = source.subject_transform
    if not spec.destination and not spec.source_pattern:
        return None
    return SubjectTransform.parse(pattern=spec.source_pattern or source.filter_subject or ">",
                                  destination=spec.destination)


def validate_sources(config: types_pb2.StreamConfig) -> None:
    """The sources of a config: named, not the stream itself nor twice, each setting sound.
    A source stream need not exist yet (its tail waits for it)."""
    if len(config.sources) > limits.sources_per_stream_max:
        raise _invalid(f"more than {limits.sources_per_stream_max} sources")
    seen: set[str] = set()
    for source in config.sources:
        name = source.stream
        try:
            subjects.validate_name(name, what="source stream")
            if source.dlq_stream:
                subjects.validate_name(source.dlq_stream, what="dead-letter stream")
            if source.filter_subject:
                subjects.validate_pattern(source.filter_subject)
        except RaftlogError as err:
            raise _invalid(f"source {name!r}: {err.message}", source=name) from None
        if name == config.name:
            raise _invalid(f"stream {name!r} cannot source from itself", source=name)
        if name in seen:
            raise _invalid(f"source {name!r} is listed twice", source=name)
        seen.add(name)
        if source.dlq_stream == config.name:
            raise _invalid(f"source {name!r}: the dead-letter stream cannot be the sourcing "
                           "stream itself", source=name)
        if source.start_seq and source.start_time_ms:
            raise _invalid(f"source {name!r}: start_seq and start_time_ms are exclusive",
                           source=name)
        if source.start_time_ms < 0:
            raise _invalid(f"source {name!r}: start_time_ms is negative", source=name)
        if source.on_drop not in types_pb2.SourceOnDrop.values():
            raise _invalid(f"source {name!r}: unknown on_drop {source.on_drop}", source=name)
        try:
            source_transform(source)
        except RaftlogError as err:
            raise _invalid(f"source {name!r}: {err.message}", source=name) from None


def apply_update(
    current: types_pb2.StreamConfig, update: streams_pb2.UpdateStreamRequest
) -> types_pb2.StreamConfig:
    """The config after `update` (validated); the stream name and retention never change."""
    changed = types_pb2.StreamConfig()
    changed.CopyFrom(current)
    for field in ("max_age_ms", "max_msgs", "max_bytes", "max_msgs_per_subject",
                  "max_msg_bytes", "dedupe_window_ms", "description", "replicas",
                  "max_msgs_per_s", "max_bytes_per_s", "discard", "max_subscriptions"):
        if update.HasField(field):
            setattr(changed, field, getattr(update, field))
    if update.HasField("subjects"):
        del changed.subjects[:]
        changed.subjects.extend(update.subjects.subjects)
    return validate_config(changed)
