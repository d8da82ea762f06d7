"""The pure rules of KV buckets (node/ops/kv_entries.py, the Expiries of kv_watch.py): names,
keys and patterns, the bucket <-> stream mapping, how a stored message reads as an entry, and
when a value is live or expired."""

from __future__ import annotations

import pytest

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops import kv_entries as kv
from raftlog.node.ops.kv import kv_error
from raftlog.node.ops.kv_watch import Expiries
from raftlog.v1 import kv_pb2, types_pb2


@pytest.mark.parametrize("key", ["a", "a.b.c", "A-b_c/d=e", "0", "x" * 100, "a.b" * 10])
def test_valid_keys_are_accepted(key: str) -> None:
    assert kv.validate_key(key, bucket="b") == key


@pytest.mark.parametrize("key", ["", ".a", "a.", "a..b", "sp ace", "tab\t", "ü", "a*", "a>",
                                 "$x", "x" * 300, ".".join(["t"] * 31)])
def test_invalid_keys_are_refused_with_invalid_key(key: str) -> None:
    with pytest.raises(RaftlogError) as info:
        kv.validate_key(key, bucket="b")
    assert info.value.reason is Reason.INVALID_KEY


def test_a_key_fits_a_subject_whatever_the_bucket_name() -> None:
    bucket = "b" * limits.kv_bucket_name_bytes_max
    longest = "k" * (limits.subject_bytes_max - len(kv.subject_prefix(bucket)))
    assert len(kv.key_subject(bucket, kv.validate_key(longest, bucket=bucket))) \
        == limits.subject_bytes_max
    with pytest.raises(RaftlogError):
        kv.validate_key(longest + "k", bucket=bucket)


@pytest.mark.parametrize("pattern", ["", "a", "a.*", "*.b", ">", "a.>", "*.*"])
def test_key_patterns(pattern: str) -> None:
    assert kv.validate_filter(pattern, bucket="b") == pattern


@pytest.mark.parametrize("pattern", ["a.>.b", "a*", "a.*x", "..", "a..*"])
def test_bad_key_patterns(pattern: str) -> None:
    with pytest.raises(RaftlogError) as info:
        kv.validate_filter(pattern, bucket="b")
    assert info.value.reason is Reason.INVALID_KEY


@pytest.mark.parametrize(("pattern", "prefix"), [
    ("", "$KV.b."), ("a", "$KV.b.a"), ("a.b", "$KV.b.a.b"), ("a.*", "$KV.b.a."),
    ("a.*.c", "$KV.b.a."), (">", "$KV.b."), ("*.b", "$KV.b."),
])
def test_listing_prefix_is_the_literal_head_of_the_pattern(pattern: str, prefix: str) -> None:
    assert kv.listing_prefix("b", pattern) == prefix


@pytest.mark.parametrize("bucket", ["", "a.b", "a b", "x" * (limits.kv_bucket_name_bytes_max + 1)])
def test_bad_bucket_names(bucket: str) -> None:
    with pytest.raises(RaftlogError) as info:
        kv.validate_bucket(bucket)
    assert info.value.reason is Reason.INVALID_NAME


def test_bucket_config_maps_to_a_stream_and_back() -> None:
    config = kv_pb2.KvBucketConfig(bucket="cfg", description="d", history=5, max_bytes=10_000,
                                   max_value_size=100, max_age_ms=60_000, replicas=3)
    stream = kv.stream_config(config)
    assert (stream.name, list(stream.subjects), stream.max_msgs_per_subject) == (
        "KV_cfg", ["$KV.cfg.>"], 5)
    assert stream.max_msg_bytes == 100 + limits.kv_entry_overhead_bytes
    assert kv.is_bucket_stream(stream)
    info = kv.bucket_info(types_pb2.StreamInfo(config=stream, state=types_pb2.StreamState(
        messages=7, bytes=70, num_subjects=2, last_seq=9)))
    assert info.config == config
    assert (info.state.entries, info.state.keys, info.state.last_revision) == (7, 2, 9)


def test_bucket_defaults_and_limits() -> None:
    stream = kv.stream_config(kv_pb2.KvBucketConfig(bucket="b"))
    assert (stream.max_msgs_per_subject, stream.max_msg_bytes) == (1, 0)
    for field, value in (("history", limits.kv_history_max + 1),
                         ("max_value_size", limits.kv_value_bytes_max + 1)):
        with pytest.raises(RaftlogError) as info:
            kv.stream_config(kv_pb2.KvBucketConfig(bucket="b", **{field: value}))
        assert info.value.reason is Reason.INVALID_CONFIG


def test_a_stream_named_like_a_bucket_is_not_one() -> None:
    assert not kv.is_bucket_stream(types_pb2.StreamConfig(name="KV_x", subjects=["x.>"]))
    assert not kv.is_bucket_stream(types_pb2.StreamConfig(name="orders",
                                                          subjects=["$KV.orders.>"]))


def _message(seq: int, key: str, *, value: bytes = b"v", headers: dict[str, str] | None = None
             ) -> types_pb2.Message:
    return types_pb2.Message(seq=seq, subject=kv.key_subject("b", key), ts_ms=1_000,
                             payload=value, headers=[types_pb2.Header(key=k, value=v)
                                                     for k, v in (headers or {}).items()])


def test_values_markers_and_ttls_read_from_messages() -> None:
    value = _message(3, "a.b", headers={kv.EXPIRES_HEADER: "5000"})
    entry = kv.to_entry("b", value)
    assert (entry.key, entry.revision, entry.value, entry.operation, entry.expires_ms) == (
        "a.b", 3, b"v", kv_pb2.KV_OPERATION_PUT, 5000)
    stored = kv.read_headers(value)
    assert stored.live(4_999) and not stored.live(5_000) and stored.expired(5_000)
    for operation in (kv_pb2.KV_OPERATION_DELETE, kv_pb2.KV_OPERATION_PURGE):
        marker = types_pb2.Message(seq=4, subject=kv.key_subject("b", "a"),
                                   headers=kv.marker_headers(operation))
        assert kv.read_headers(marker).operation == operation
        assert not kv.read_headers(marker).live(0) and not kv.read_headers(marker).expired(10**15)
    plain = kv.read_headers(_message(5, "k", headers={"other": "x"}))
    assert plain.live(10**15)  # a message published directly to the stream is a value


def test_expiry_is_the_write_time_plus_the_ttl() -> None:
    assert kv.expires_ms(ttl=0, now_ms=1_000) == 0
    assert kv.expires_ms(ttl=500, now_ms=1_000) == 1_500
    assert kv.value_headers(expires=0) == []
    with pytest.raises(RaftlogError):
        kv.ttl_ms(limits.kv_ttl_ms_max + 1)


def test_stream_errors_read_as_bucket_errors() -> None:
    wrong = kv_error(RaftlogError(Reason.WRONG_LAST_SUBJECT_SEQ, "x", last_subject_seq=7),
                     bucket="b", key="k")
    assert (wrong.reason, wrong.metadata["revision"]) == (Reason.WRONG_REVISION, "7")
    for stream_reason, bucket_reason in ((Reason.STREAM_NOT_FOUND, Reason.BUCKET_NOT_FOUND),
                                         (Reason.STREAM_EXISTS, Reason.BUCKET_EXISTS),
                                         (Reason.MESSAGE_NOT_FOUND, Reason.KEY_NOT_FOUND),
                                         (Reason.MESSAGE_TOO_LARGE, Reason.VALUE_TOO_LARGE),
                                         (Reason.NO_QUORUM, Reason.NO_QUORUM)):
        assert kv_error(RaftlogError(stream_reason, "x"), bucket="b").reason is bucket_reason


def _entry(key: str, revision: int, expires_ms: int,
           operation: kv_pb2.KvOperation.ValueType = kv_pb2.KV_OPERATION_PUT) -> kv_pb2.KvEntry:
    return kv_pb2.KvEntry(key=key, revision=revision, expires_ms=expires_ms,
                          operation=operation)


def test_an_expiry_is_due_once_and_only_for_the_latest_revision() -> None:
    expiries = Expiries()
    expiries.sent(_entry("a", 1, 100))
    expiries.sent(_entry("b", 2, 150))
    expiries.sent(_entry("a", 3, 300))  # replaces a@1: its expiry never comes due
    expiries.sent(_entry("c", 4, 120))
    expiries.sent(_entry("c", 5, 0, kv_pb2.KV_OPERATION_DELETE))  # c deleted: nothing due
    assert expiries.next_ms() == 100
    assert [(e.key, e.revision) for e in expiries.due(200)] == [("b", 2)]
    assert expiries.due(200) == []
    assert [(e.key, e.revision) for e in expiries.due(300)] == [("a", 3)]
    assert expiries.next_ms() is None


def test_expiries_stay_bounded_by_the_keys_tracked() -> None:
    expiries = Expiries()
    for revision in range(1, 10_000):
        expiries.sent(_entry("hot", revision, 10**12 + revision))
    assert len(expiries._due) <= 2 + 64  # the bound is the point
    assert [e.revision for e in expiries.due(10**13)] == [9_999]
