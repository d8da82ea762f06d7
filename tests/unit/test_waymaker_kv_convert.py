"""The pure parts of the Waymaker KV and collections front-ends (node/api/waymaker_kv.py,
waymaker_collections.py) and their result codes (waymaker_codes.py, Family.KV and
Family.COLLECTIONS). Each test is named after the rule it checks.
"""

from __future__ import annotations

import pytest

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.compat import waymaker_streams_pb2 as wm
from raftlog.node.api.waymaker_codes import Family, result_code
from raftlog.node.api.waymaker_collections import key_error
from raftlog.node.api.waymaker_kv import bucket_config_in, history_entry_out, watch_event_out
from raftlog.v1 import kv_pb2


def test_a_seed_bucket_keeps_its_limits_and_the_most_history() -> None:
    config = bucket_config_in(wm.KvCreateBucketRequest(
        bucket="b", max_bytes=1000, max_value_size=10, max_age_ms=60_000, ephemeral=True))
    assert config == kv_pb2.KvBucketConfig(bucket="b", history=limits.kv_history_max,
                                           max_bytes=1000, max_value_size=10, max_age_ms=60_000)


@pytest.mark.parametrize(("operation", "deleted"), [
    (kv_pb2.KV_OPERATION_PUT, False),
    (kv_pb2.KV_OPERATION_DELETE, True),
    (kv_pb2.KV_OPERATION_PURGE, True),
])
def test_history_flags_markers_as_deleted_without_a_value(operation: int,
                                                          deleted: bool) -> None:
    entry = kv_pb2.KvEntry(key="k", value=b"" if deleted else b"v", revision=7, ts_ms=5,
                           operation=operation)  # type: ignore[arg-type]
    assert history_entry_out(entry) == wm.KvHistoryEntry(
        value=b"" if deleted else b"v", revision=7, ts_ms=5, deleted=deleted)


def test_a_watched_value_is_a_put_event() -> None:
    event = kv_pb2.KvWatchEvent(entry=kv_pb2.KvEntry(
        bucket="b", key="k", value=b"v", revision=3, ts_ms=10, expires_ms=99))
    assert watch_event_out(event) == wm.KvWatchEvent(
        put=wm.KvPutEvent(key="k", value=b"v", revision=3, ts_ms=10))


@pytest.mark.parametrize("operation", [kv_pb2.KV_OPERATION_DELETE, kv_pb2.KV_OPERATION_PURGE])
def test_a_watched_marker_is_a_delete_event_at_its_revision(operation: int) -> None:
    event = kv_pb2.KvWatchEvent(entry=kv_pb2.KvEntry(
        key="k", revision=4, ts_ms=11, operation=operation))  # type: ignore[arg-type]
    assert watch_event_out(event) == wm.KvWatchEvent(
        delete=wm.KvDeleteEvent(key="k", revision=4, ts_ms=11))


def test_a_passed_ttl_is_a_delete_event_stamped_with_the_expiry() -> None:
    event = kv_pb2.KvWatchEvent(entry=kv_pb2.KvEntry(
        key="k", revision=5, ts_ms=12, expires_ms=500, operation=kv_pb2.KV_OPERATION_EXPIRED))
    assert watch_event_out(event) == wm.KvWatchEvent(
        delete=wm.KvDeleteEvent(key="k", revision=5, ts_ms=500))


def test_caught_up_has_no_seed_event() -> None:
    assert watch_event_out(kv_pb2.KvWatchEvent(
        caught_up=kv_pb2.KvWatchCaughtUp(revision=9))) is None


@pytest.mark.parametrize("field", ["key", "field", "member"])
def test_a_bad_key_field_or_member_is_an_invalid_key(field: str) -> None:
    err = key_error(RaftlogError(Reason.INVALID_ARGUMENT, f"{field} is empty", field=field))
    assert (err.reason, err.message, err.metadata) == (Reason.INVALID_KEY, f"{field} is empty",
                                                       {"field": field})


def test_other_errors_stay_as_they_are() -> None:
    limit = RaftlogError(Reason.INVALID_ARGUMENT, "limit may be at most 5", field="limit")
    missing = RaftlogError(Reason.COLLECTION_NOT_FOUND, "no hash 'h'")
    assert key_error(limit) is limit
    assert key_error(missing) is missing


@pytest.mark.parametrize(("family", "reason", "code"), [
    (Family.KV, Reason.BUCKET_NOT_FOUND, "no_such_bucket"),
    (Family.KV, Reason.BUCKET_EXISTS, "already_exists"),
    (Family.KV, Reason.KEY_EXISTS, "already_exists"),
    (Family.KV, Reason.WRONG_REVISION, "wrong_revision"),
    (Family.KV, Reason.INVALID_KEY, "invalid_key"),
    (Family.KV, Reason.INVALID_NAME, "invalid_config"),
    (Family.KV, Reason.INVALID_CONFIG, "invalid_config"),
    (Family.KV, Reason.VALUE_TOO_LARGE, "oversize"),
    (Family.KV, Reason.KEY_NOT_FOUND, "no_such_key"),
    (Family.KV, Reason.INTERNAL, "internal"),
    (Family.COLLECTIONS, Reason.COLLECTION_NOT_FOUND, "no_such_bucket"),
    (Family.COLLECTIONS, Reason.COLLECTION_EXISTS, "already_exists"),
    (Family.COLLECTIONS, Reason.INVALID_KEY, "invalid_key"),
    (Family.COLLECTIONS, Reason.INVALID_NAME, "invalid_config"),
    (Family.COLLECTIONS, Reason.INVALID_ARGUMENT, "invalid_config"),
    (Family.COLLECTIONS, Reason.COLLECTION_FULL, "full"),  # RESOURCE_EXHAUSTED, yet a code
    (Family.COLLECTIONS, Reason.COLLECTION_CONFLICT, "conflict"),
])
def test_kv_and_collection_reasons_have_a_result_code(family: Family, reason: Reason,
                                                      code: str) -> None:
    assert result_code(family, reason) == code


@pytest.mark.parametrize("family", [Family.KV, Family.COLLECTIONS])
@pytest.mark.parametrize("reason", [Reason.NOT_PRIMARY, Reason.CATCHING_UP, Reason.TIMEOUT,
                                    Reason.TOO_MANY_SUBSCRIPTIONS])
def test_retryable_conditions_stay_grpc_statuses(family: Family, reason: Reason) -> None:
    assert result_code(family, reason) is None
