"""Consumer configuration: validation against its stream, defaults, and filter overlap rules.

`validate_config` is pure: it takes a `ConsumerConfig` as a client sent it plus the stream's
subject patterns and returns a normalised copy (defaults filled in, so two configs that mean
the same thing compare equal) or raises INVALID_NAME / INVALID_SUBJECT / INVALID_CONFIG with
`field=` metadata naming the offending field.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from raftlog.base import limits, subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.v1 import consumers_pb2

_POLICY = consumers_pb2.DeliverPolicy


def validate_config(
    config: consumers_pb2.ConsumerConfig, *, stream_subjects: Sequence[str]
) -> consumers_pb2.ConsumerConfig:
    """The normalised config, or raises with a message that names the rule broken."""
    subjects.validate_name(config.name, what="consumer")
    _check_filter(config.filter_subject, stream_subjects=stream_subjects)
    _check_start(config)
    _check_acks(config)
    _check_dead_letter(config, stream_subjects=stream_subjects)
    _check_description(config.description)
    normalised = consumers_pb2.ConsumerConfig()
    normalised.CopyFrom(config)
    normalised.ack_wait_ms = config.ack_wait_ms or limits.ack_wait_ms_default
    normalised.max_ack_pending = config.max_ack_pending or limits.max_ack_pending_default
    return normalised


def filters_overlap(a: str, b: str) -> bool:
    """True when some subject passes both consumer filters (an empty filter passes all)."""
    return not a or not b or subjects.patterns_overlap(a, b)


def check_work_queue_filter(name: str, filter_subject: str, *,
                            others: Iterable[consumers_pb2.ConsumerConfig]) -> None:
    """A work queue hands each message to one consumer: filters may not overlap."""
    for other in others:
        if other.name != name and filters_overlap(filter_subject, other.filter_subject):
            raise RaftlogError(
                Reason.WORK_QUEUE_OVERLAP,
                f"filter {filter_subject or '(all subjects)'!r} overlaps the filter "
                f"{other.filter_subject or '(all subjects)'!r} of consumer {other.name!r}; "
                "consumers of a work-queue stream must have disjoint filters",
                consumer=other.name,
            )


def _invalid(field: str, message: str, **metadata: object) -> RaftlogError:
    return RaftlogError(Reason.INVALID_CONFIG, message, field=field, **metadata)


def _check_filter(filter_subject: str, *, stream_subjects: Sequence[str]) -> None:
    if not filter_subject:
        return
    subjects.validate_pattern(filter_subject)
    if stream_subjects and not any(
        subjects.patterns_overlap(filter_subject, pattern) for pattern in stream_subjects
    ):
        raise _invalid(
            "filter_subject",
            f"filter_subject {filter_subject!r} matches none of the stream's subjects "
            f"{list(stream_subjects)}",
        )


def _check_start(config: consumers_pb2.ConsumerConfig) -> None:
    policy = config.deliver_policy
    if policy not in _POLICY.values():
        raise _invalid("deliver_policy", f"unknown deliver_policy {policy}")
    if policy == _POLICY.DELIVER_POLICY_BY_START_SEQ:
        if config.opt_start_seq == 0:
            raise _invalid("opt_start_seq", "DELIVER_POLICY_BY_START_SEQ needs opt_start_seq > 0")
    elif config.opt_start_seq != 0:
        raise _invalid("opt_start_seq",
                       "opt_start_seq is only allowed with DELIVER_POLICY_BY_START_SEQ")
    if policy == _POLICY.DELIVER_POLICY_BY_START_TIME:
        if config.opt_start_time_ms <= 0:
            raise _invalid("opt_start_time_ms",
                           "DELIVER_POLICY_BY_START_TIME needs opt_start_time_ms > 0")
    elif config.opt_start_time_ms != 0:
        raise _invalid("opt_start_time_ms",
                       "opt_start_time_ms is only allowed with DELIVER_POLICY_BY_START_TIME")


def _check_acks(config: consumers_pb2.ConsumerConfig) -> None:
    if config.ack_wait_ms > limits.ack_wait_ms_max:
        raise _invalid("ack_wait_ms", f"ack_wait_ms may be at most {limits.ack_wait_ms_max}",
                       limit=limits.ack_wait_ms_max)
    if len(config.backoff_ms) > limits.backoff_steps_max:
        raise _invalid("backoff_ms", f"backoff_ms may have at most {limits.backoff_steps_max} "
                       "entries", limit=limits.backoff_steps_max)
    for step_ms in config.backoff_ms:
        if not 0 < step_ms <= limits.ack_wait_ms_max:
            raise _invalid("backoff_ms", f"every backoff_ms entry must be in "
                           f"1..{limits.ack_wait_ms_max}, not {step_ms}",
                           limit=limits.ack_wait_ms_max)
    if config.max_ack_pending > limits.max_ack_pending_max:
        raise _invalid("max_ack_pending", "max_ack_pending may be at most "
                       f"{limits.max_ack_pending_max}", limit=limits.max_ack_pending_max)


def _check_dead_letter(config: consumers_pb2.ConsumerConfig, *,
                       stream_subjects: Sequence[str]) -> None:
    subject = config.dead_letter_subject
    if not subject:
        return
    subjects.validate_subject(subject)
    if not subjects.matches_any(tuple(stream_subjects), subject):
        raise _invalid("dead_letter_subject",
                       f"dead_letter_subject {subject!r} is not accepted by the stream's "
                       f"subjects {list(stream_subjects)}")
    if not config.filter_subject or subjects.matches(config.filter_subject, subject):
        raise _invalid("dead_letter_subject",
                       f"dead_letter_subject {subject!r} passes the consumer's own filter "
                       f"{config.filter_subject or '(all subjects)'!r}: dead letters would "
                       "be delivered to it again")


def _check_description(description: str) -> None:
    if len(description.encode()) > limits.description_bytes_max:
        raise _invalid("description", "description may be at most "
                       f"{limits.description_bytes_max} bytes",
                       limit=limits.description_bytes_max)
