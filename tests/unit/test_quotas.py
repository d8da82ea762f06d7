"""Token buckets and the quota book (node/ops/quotas.py) on a fake clock."""

from __future__ import annotations

import math

import pytest

from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops.quotas import (
    QuotaBook,
    Rates,
    TokenBucket,
    admit_caller,
    message_bytes,
    stream_key,
    user_key,
)
from raftlog.node.transport.auth import SYSTEM, Identity
from raftlog.node.transport.connections import ConnectionCounts
from raftlog.v1 import streams_pb2, types_pb2


def entry(payload: bytes = b"x", subject: str = "a") -> streams_pb2.PublishEntry:
    return streams_pb2.PublishEntry(subject=subject, payload=payload)


def test_bucket_starts_full_and_refills_at_its_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_per_s=10, clock=clock)
    assert bucket.wait_s(10) == 0
    bucket.take(10)
    assert bucket.wait_s(1) == pytest.approx(0.1)
    clock.advance(0.5)
    assert bucket.tokens() == pytest.approx(5)
    clock.advance(60)
    assert bucket.tokens() == pytest.approx(10)  # never above one second of its rate


def test_bucket_cost_above_capacity_never_fits() -> None:
    assert math.isinf(TokenBucket(rate_per_s=10, clock=FakeClock()).wait_s(11))


def test_book_refuses_past_the_rate_with_a_retry_hint_then_recovers() -> None:
    clock = FakeClock()
    book = QuotaBook(clock)
    rates = Rates(msgs_per_s=20)
    admitted = 0
    for _ in range(100):
        try:
            book.admit("stream:s", rates, msgs=1, bytes_total=1)
            admitted += 1
        except RaftlogError as err:
            assert err.reason is Reason.RATE_LIMITED
            assert err.metadata["retry_after_ms"] == "50"
            assert err.metadata["measure"] == "msgs"
    assert admitted == 20
    clock.advance(0.05)
    book.admit("stream:s", rates, msgs=1, bytes_total=1)


def test_book_refuses_a_request_whole_and_charges_nothing() -> None:
    clock = FakeClock()
    book = QuotaBook(clock)
    rates = Rates(msgs_per_s=100, bytes_per_s=1000)
    book.admit("k", rates, msgs=1, bytes_total=900)
    with pytest.raises(RaftlogError) as info:
        book.admit("k", rates, msgs=5, bytes_total=200)
    assert info.value.reason is Reason.RATE_LIMITED and info.value.metadata["measure"] == "bytes"
    assert info.value.metadata["retry_after_ms"] == "100"
    book.admit("k", rates, msgs=99, bytes_total=100)  # the refused 5 msgs were not charged


def test_book_request_larger_than_a_bucket_is_refused_without_hint() -> None:
    book = QuotaBook(FakeClock())
    with pytest.raises(RaftlogError) as info:
        book.admit("k", Rates(bytes_per_s=100), msgs=1, bytes_total=101)
    assert info.value.reason is Reason.BATCH_TOO_LARGE
    assert "retry_after_ms" not in info.value.metadata


def test_book_new_rate_starts_a_new_full_bucket() -> None:
    book = QuotaBook(FakeClock())
    book.admit("k", Rates(msgs_per_s=2), msgs=2, bytes_total=0)
    with pytest.raises(RaftlogError):
        book.admit("k", Rates(msgs_per_s=2), msgs=1, bytes_total=0)
    book.admit("k", Rates(msgs_per_s=3), msgs=3, bytes_total=0)


def test_book_keeps_at_most_keys_max_buckets() -> None:
    book = QuotaBook(FakeClock(), keys_max=3)
    for index in range(10):
        book.admit(f"k{index}", Rates(msgs_per_s=1), msgs=1, bytes_total=0)
    assert len(book) == 3


def test_admit_each_refuses_the_tail_of_a_run() -> None:
    book = QuotaBook(FakeClock())
    outcomes = book.admit_each(stream_key("s"), Rates(msgs_per_s=3),
                               [entry() for _ in range(5)])
    assert [outcome is None for outcome in outcomes] == [True, True, True, False, False]


def test_message_bytes_counts_subject_payload_and_headers() -> None:
    message = streams_pb2.PublishRequest(subject="ab", payload=b"xyz",
                                         headers=[types_pb2.Header(key="k", value="vv")])
    assert message_bytes(message) == 8


def test_rates_of_stream() -> None:
    config = types_pb2.StreamConfig(name="s", max_msgs_per_s=5)
    assert Rates.of_stream(config) == Rates(msgs_per_s=5) and Rates.of_stream(config)
    assert not Rates.of_stream(types_pb2.StreamConfig(name="s"))



def test_caller_is_charged_by_user_only_where_the_call_arrived() -> None:
    clock = FakeClock()
    book = QuotaBook(clock)
    alice = Identity(name="alice", max_msgs_per_s=10, max_bytes_per_s=1000)
    admit_caller(book, alice, [entry()] * 10)
    with pytest.raises(RaftlogError) as refused:
        admit_caller(book, alice, [entry()])
    assert refused.value.reason is Reason.RATE_LIMITED
    assert refused.value.metadata["key"] == user_key("alice") == "user:alice"
    assert int(refused.value.metadata["retry_after_ms"]) == 100
    # the same user forwarded from another node, another user, SYSTEM: not charged here
    admit_caller(book, Identity(name="alice", max_msgs_per_s=10, forwarded=True), [entry()])
    admit_caller(book, Identity(name="bob", max_msgs_per_s=10), [entry()] * 10)
    admit_caller(book, Identity(name="carol"), [entry()] * 100)
    admit_caller(book, SYSTEM, [entry()] * 100)
    clock.advance(0.1)
    admit_caller(book, alice, [entry()])
    with pytest.raises(RaftlogError) as too_big:
        admit_caller(book, alice, [entry(b"x" * 2000)])
    assert too_big.value.reason is Reason.BATCH_TOO_LARGE


def test_connection_counts_limit_new_peers_only() -> None:
    counts = ConnectionCounts(2)
    counts.enter("a")
    counts.enter("b")
    counts.enter("a")  # a connection already counted goes on
    with pytest.raises(RaftlogError) as info:
        counts.enter("c")
    assert info.value.reason is Reason.TOO_MANY_CONNECTIONS
    assert "retry_after_ms" in info.value.metadata
    counts.leave("b")
    counts.enter("c")
    counts.leave("a")
    counts.leave("a")
    assert counts.calls_by_peer == {"c": 1}
