"""Consumer config validation (node/consumers/config.py): every rejection, the defaults, and the
work-queue filter overlap rule. Each case is named after the rule it checks."""

from __future__ import annotations

from typing import Any

import pytest

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.consumers.config import check_work_queue_filter, filters_overlap, validate_config
from raftlog.v1 import consumers_pb2

P = consumers_pb2.DeliverPolicy
STREAM_SUBJECTS = ("orders.>", "dlq.>")


def config(**fields: Any) -> consumers_pb2.ConsumerConfig:
    fields.setdefault("name", "c1")
    return consumers_pb2.ConsumerConfig(**fields)


REJECTIONS = [
    # (rule, config fields, stream subjects, reason, field metadata)
    ("name_is_required", {"name": ""}, STREAM_SUBJECTS, Reason.INVALID_NAME, None),
    ("name_charset", {"name": "a.b"}, STREAM_SUBJECTS, Reason.INVALID_NAME, None),
    ("name_length", {"name": "n" * (limits.name_bytes_max + 1)}, STREAM_SUBJECTS,
     Reason.INVALID_NAME, None),
    ("filter_is_a_pattern", {"filter_subject": "orders..x"}, STREAM_SUBJECTS,
     Reason.INVALID_SUBJECT, None),
    ("filter_full_wildcard_last", {"filter_subject": "orders.>.x"}, STREAM_SUBJECTS,
     Reason.INVALID_SUBJECT, None),
    ("filter_overlaps_stream", {"filter_subject": "invoices.*"}, STREAM_SUBJECTS,
     Reason.INVALID_CONFIG, "filter_subject"),
    ("unknown_deliver_policy", {"deliver_policy": 99}, STREAM_SUBJECTS,
     Reason.INVALID_CONFIG, "deliver_policy"),
    ("by_start_seq_needs_seq", {"deliver_policy": P.DELIVER_POLICY_BY_START_SEQ},
     STREAM_SUBJECTS, Reason.INVALID_CONFIG, "opt_start_seq"),
    ("start_seq_only_with_by_start_seq", {"opt_start_seq": 5}, STREAM_SUBJECTS,
     Reason.INVALID_CONFIG, "opt_start_seq"),
    ("by_start_time_needs_time", {"deliver_policy": P.DELIVER_POLICY_BY_START_TIME},
     STREAM_SUBJECTS, Reason.INVALID_CONFIG, "opt_start_time_ms"),
    ("by_start_time_needs_positive_time",
     {"deliver_policy": P.DELIVER_POLICY_BY_START_TIME, "opt_start_time_ms": -5},
     STREAM_SUBJECTS, Reason.INVALID_CONFIG, "opt_start_time_ms"),
    ("start_time_only_with_by_start_time",
     {"deliver_policy": P.DELIVER_POLICY_NEW, "opt_start_time_ms": 5},
     STREAM_SUBJECTS, Reason.INVALID_CONFIG, "opt_start_time_ms"),
    ("ack_wait_max", {"ack_wait_ms": limits.ack_wait_ms_max + 1}, STREAM_SUBJECTS,
     Reason.INVALID_CONFIG, "ack_wait_ms"),
    ("backoff_steps_max", {"backoff_ms": [1] * (limits.backoff_steps_max + 1)},
     STREAM_SUBJECTS, Reason.INVALID_CONFIG, "backoff_ms"),
    ("backoff_step_positive", {"backoff_ms": [1000, 0]}, STREAM_SUBJECTS,
     Reason.INVALID_CONFIG, "backoff_ms"),
    ("backoff_step_max", {"backoff_ms": [limits.ack_wait_ms_max + 1]}, STREAM_SUBJECTS,
     Reason.INVALID_CONFIG, "backoff_ms"),
    ("max_ack_pending_max", {"max_ack_pending": limits.max_ack_pending_max + 1},
     STREAM_SUBJECTS, Reason.INVALID_CONFIG, "max_ack_pending"),
    ("dead_letter_is_literal", {"filter_subject": "orders.*", "dead_letter_subject": "dlq.*"},
     STREAM_SUBJECTS, Reason.INVALID_SUBJECT, None),
    ("dead_letter_in_stream", {"filter_subject": "orders.*", "dead_letter_subject": "other.x"},
     STREAM_SUBJECTS, Reason.INVALID_CONFIG, "dead_letter_subject"),
    ("dead_letter_not_in_own_filter",
     {"filter_subject": "orders.*", "dead_letter_subject": "orders.dead"},
     STREAM_SUBJECTS, Reason.INVALID_CONFIG, "dead_letter_subject"),
    ("dead_letter_needs_a_filter_it_escapes", {"dead_letter_subject": "dlq.x"},
     STREAM_SUBJECTS, Reason.INVALID_CONFIG, "dead_letter_subject"),
    ("description_max", {"description": "é" * (limits.description_bytes_max // 2 + 1)},
     STREAM_SUBJECTS, Reason.INVALID_CONFIG, "description"),
]


@pytest.mark.parametrize(("rule", "fields", "stream_subjects", "reason", "field"), REJECTIONS,
                         ids=[case[0] for case in REJECTIONS])
def test_config_rejection(rule: str, fields: dict[str, Any], stream_subjects: tuple[str, ...],
                          reason: Reason, field: str | None) -> None:
    with pytest.raises(RaftlogError) as caught:
        validate_config(config(**fields), stream_subjects=stream_subjects)
    assert caught.value.reason == reason, caught.value
    if field is not None:
        assert caught.value.metadata["field"] == field
    assert caught.value.message


ACCEPTED = [
    ("defaults", {}, ()),
    ("any_filter_when_stream_takes_any_subject", {"filter_subject": "x.*"}, ()),
    ("filter_overlapping_a_stream_pattern", {"filter_subject": "*.eu"}, STREAM_SUBJECTS),
    ("by_start_seq", {"deliver_policy": P.DELIVER_POLICY_BY_START_SEQ, "opt_start_seq": 3},
     STREAM_SUBJECTS),
    ("by_start_time", {"deliver_policy": P.DELIVER_POLICY_BY_START_TIME,
                       "opt_start_time_ms": 1}, STREAM_SUBJECTS),
    ("limits_inclusive", {"ack_wait_ms": limits.ack_wait_ms_max,
                          "backoff_ms": [limits.ack_wait_ms_max] * limits.backoff_steps_max,
                          "max_ack_pending": limits.max_ack_pending_max,
                          "description": "d" * limits.description_bytes_max}, STREAM_SUBJECTS),
    ("dead_letter_outside_filter", {"filter_subject": "orders.*",
                                    "dead_letter_subject": "dlq.orders"}, STREAM_SUBJECTS),
]


@pytest.mark.parametrize(("rule", "fields", "stream_subjects"), ACCEPTED,
                         ids=[case[0] for case in ACCEPTED])
def test_config_accepted(rule: str, fields: dict[str, Any],
                         stream_subjects: tuple[str, ...]) -> None:
    normalised = validate_config(config(**fields), stream_subjects=stream_subjects)
    assert normalised.name == "c1"


def test_defaults_are_filled_so_equal_meaning_compares_equal() -> None:
    implicit = validate_config(config(), stream_subjects=())
    explicit = validate_config(config(ack_wait_ms=limits.ack_wait_ms_default,
                                      max_ack_pending=limits.max_ack_pending_default),
                               stream_subjects=())
    assert implicit.ack_wait_ms == limits.ack_wait_ms_default
    assert implicit.max_ack_pending == limits.max_ack_pending_default
    assert implicit == explicit


def test_validation_does_not_modify_the_callers_config() -> None:
    given = config()
    validate_config(given, stream_subjects=())
    assert given.ack_wait_ms == 0


OVERLAPS = [
    ("", "orders.x", True),
    ("orders.*", "", True),
    ("orders.*", "orders.eu", True),
    ("orders.>", "orders.eu.x", True),
    ("orders.*", "orders.eu.x", False),
    ("orders.*", "invoices.*", False),
    ("orders.eu", "orders.us", False),
]


@pytest.mark.parametrize(("a", "b", "overlap"), OVERLAPS)
def test_work_queue_filters_may_not_overlap(a: str, b: str, overlap: bool) -> None:
    assert filters_overlap(a, b) is overlap
    others = [consumers_pb2.ConsumerConfig(name="other", filter_subject=a)]
    if overlap:
        with pytest.raises(RaftlogError) as caught:
            check_work_queue_filter("new", b, others=others)
        assert caught.value.reason == Reason.WORK_QUEUE_OVERLAP
        assert caught.value.metadata["consumer"] == "other"
    else:
        check_work_queue_filter("new", b, others=others)


def test_work_queue_overlap_ignores_the_consumer_itself() -> None:
    check_work_queue_filter("same", "", others=[consumers_pb2.ConsumerConfig(name="same")])
