"""The Consumers API end to end: a real `raftlog node` process, spoken to over gRPC.

Every consumer feature of issue 2: lifecycle, filters, delivery policies, fetch and its wait,
ack / nak / term / in-progress, redelivery, backoff, max ack pending, max deliver with a
dead-letter subject, push Subscribe, work-queue and interest retention, bad input, and kill -9.

Timing rules: ack waits and heartbeats are a few hundred ms; a lower bound on "not before T" is
measured from a client clock reading taken *before* the call that started T on the server, so
it can never be violated by network or scheduling jitter. Nothing is asserted by sleeping: a
fetch's `max_wait_ms` or `wait_until` does the waiting.

The table-driven tests that need no timing or restart (filters, delivery policies, bad input)
share one module-scoped node, each case on its own stream; everything else gets a fresh node.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import grpc
import pytest

from raftlog.base import limits
from raftlog.base.errors import Reason
from raftlog.chaos.nodeproc import NodeProcess, wait_until
from raftlog.node.transport.rpc import from_rpc_error, grpc_status
from raftlog.v1 import consumers_pb2, streams_pb2, types_pb2
from tests.conftest import Clients

P = consumers_pb2.DeliverPolicy
STREAM = "orders"
WORK_QUEUE = types_pb2.RETENTION_POLICY_WORK_QUEUE
INTEREST = types_pb2.RETENTION_POLICY_INTEREST
RPC_TIMEOUT_S = 15.0
# The dead-letter headers are part of the API (node/consumers/manager.py DLQ_HEADERS); spelled
# out here so that renaming one breaks this test.
DLQ_STREAM, DLQ_CONSUMER, DLQ_SEQ, DLQ_SUBJECT, DLQ_DELIVERIES = (
    "raftlog-dlq-stream", "raftlog-dlq-consumer", "raftlog-dlq-seq", "raftlog-dlq-subject",
    "raftlog-dlq-deliveries")


# --------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def shared_clients(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clients]:
    """One real node for the stateless tables; every case uses a stream of its own."""
    node = NodeProcess(tmp_path_factory.mktemp("consumers-shared") / "node").start()
    try:
        with node.channel() as channel:
            yield Clients(channel)
    finally:
        node.cleanup()


_stream_names = (f"s{i}" for i in itertools.count(1))


def fresh_stream_name() -> str:
    return next(_stream_names)


# --------------------------------------------------------------------------------- helpers


def expect_error(call: Any, request: Any, reason: Reason) -> dict[str, str]:
    """Calls a unary or server-streaming method and checks the status and reason it fails with;
    returns the error's metadata."""
    with pytest.raises(grpc.RpcError) as info:
        reply = call(request, timeout=RPC_TIMEOUT_S)
        if isinstance(reply, grpc.Call) and hasattr(reply, "__iter__"):
            list(reply)
    assert info.value.code() == grpc_status(reason), info.value.details()
    err = from_rpc_error(info.value)
    assert err is not None and err.reason is reason, (info.value.details(), err)
    return dict(err.metadata)


def create_stream(clients: Clients, name: str = STREAM, **fields: Any) -> types_pb2.StreamInfo:
    config = types_pb2.StreamConfig(name=name, **fields)
    info: types_pb2.StreamInfo = clients.streams.CreateStream(
        streams_pb2.CreateStreamRequest(config=config), timeout=RPC_TIMEOUT_S)
    return info


def stream_state(clients: Clients, name: str = STREAM) -> types_pb2.StreamState:
    info: types_pb2.StreamInfo = clients.streams.GetStreamInfo(
        streams_pb2.GetStreamInfoRequest(name=name), timeout=RPC_TIMEOUT_S)
    return info.state


def publish(clients: Clients, subject: str, payload: bytes = b"x", stream: str = STREAM,
            **fields: Any) -> int:
    ack: streams_pb2.PublishAck = clients.streams.Publish(streams_pb2.PublishRequest(
        stream=stream, subject=subject, payload=payload, **fields), timeout=RPC_TIMEOUT_S)
    return int(ack.seq)


def get_message(clients: Clients, seq: int, stream: str = STREAM) -> types_pb2.Message:
    message: types_pb2.Message = clients.streams.GetMessage(
        streams_pb2.GetMessageRequest(stream=stream, seq=seq), timeout=RPC_TIMEOUT_S)
    return message


def create_consumer(clients: Clients, name: str = "c", stream: str = STREAM,
                    **fields: Any) -> consumers_pb2.ConsumerInfo:
    info: consumers_pb2.ConsumerInfo = clients.consumers.CreateConsumer(
        consumers_pb2.CreateConsumerRequest(
            stream=stream, config=consumers_pb2.ConsumerConfig(name=name, **fields)),
        timeout=RPC_TIMEOUT_S)
    return info


def consumer_info(clients: Clients, name: str = "c",
                  stream: str = STREAM) -> consumers_pb2.ConsumerInfo:
    info: consumers_pb2.ConsumerInfo = clients.consumers.GetConsumerInfo(
        consumers_pb2.GetConsumerInfoRequest(stream=stream, consumer=name), timeout=RPC_TIMEOUT_S)
    return info


def consumer_names(clients: Clients, stream: str = STREAM) -> list[str]:
    reply = clients.consumers.ListConsumers(consumers_pb2.ListConsumersRequest(stream=stream),
                                            timeout=RPC_TIMEOUT_S)
    return [info.config.name for info in reply.consumers]


def fetch(clients: Clients, name: str = "c", *, batch: int = 100, max_wait_ms: int = 0,
          stream: str = STREAM) -> list[types_pb2.Message]:
    reply = clients.consumers.Fetch(consumers_pb2.FetchRequest(
        stream=stream, consumer=name, batch=batch, max_wait_ms=max_wait_ms),
        timeout=RPC_TIMEOUT_S + max_wait_ms / 1000)
    return list(reply.messages)


def ack(clients: Clients, seqs: list[int], name: str = "c", stream: str = STREAM) -> int:
    reply = clients.consumers.Ack(consumers_pb2.AckRequest(stream=stream, consumer=name,
                                                           seqs=seqs), timeout=RPC_TIMEOUT_S)
    return int(reply.applied)


def nak(clients: Clients, seqs: list[int], *, delay_ms: int, name: str = "c",
        stream: str = STREAM) -> int:
    reply = clients.consumers.Nak(consumers_pb2.NakRequest(
        stream=stream, consumer=name, seqs=seqs, delay_ms=delay_ms), timeout=RPC_TIMEOUT_S)
    return int(reply.applied)


def delete_consumer(clients: Clients, name: str = "c", stream: str = STREAM) -> None:
    clients.consumers.DeleteConsumer(consumers_pb2.DeleteConsumerRequest(
        stream=stream, consumer=name), timeout=RPC_TIMEOUT_S)


def seqs_of(messages: list[types_pb2.Message]) -> list[int]:
    return [message.seq for message in messages]


def counts_of(messages: list[types_pb2.Message]) -> dict[int, int]:
    return {message.seq: message.deliver_count for message in messages}


def timed_fetch(clients: Clients, name: str = "c", *, batch: int = 100, max_wait_ms: int,
                stream: str = STREAM) -> tuple[float, list[types_pb2.Message], float]:
    """(monotonic time before the call, messages, monotonic time after it)."""
    before = time.monotonic()
    messages = fetch(clients, name, batch=batch, max_wait_ms=max_wait_ms, stream=stream)
    return before, messages, time.monotonic()


Event = tuple[float, consumers_pb2.SubscribeEvent | None]


class Subscription:
    """A Subscribe call read by a thread: `next()` gives (arrival time, event), None = the
    server ended the stream. A failed call is re-raised by `next()`."""

    def __init__(self, clients: Clients, **fields: Any) -> None:
        request = consumers_pb2.SubscribeRequest(stream=fields.pop("stream", STREAM), **fields)
        self.call = clients.consumers.Subscribe(request, timeout=120)
        self._events: queue.Queue[tuple[float, Any]] = queue.Queue()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self.call:
                self._events.put((time.monotonic(), event))
        except grpc.RpcError as exc:
            self._events.put((time.monotonic(), exc))
            return
        self._events.put((time.monotonic(), None))

    def next(self, timeout_s: float = 5.0) -> Event:
        try:
            at, item = self._events.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no Subscribe event within {timeout_s} s") from None
        if isinstance(item, grpc.RpcError):
            raise item
        return at, item

    def next_message(self, timeout_s: float = 5.0) -> tuple[float, types_pb2.Message]:
        at, event = self.next(timeout_s)
        assert event is not None and event.WhichOneof("event") == "message", event
        return at, event.message

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.call.cancel()
        self._thread.join(timeout=10)


# --------------------------------------------------------------------------------- lifecycle


def test_create_info_list_delete_round_trip(clients: Clients) -> None:
    create_stream(clients, subjects=["orders.>"])
    before_ms = int(time.time() * 1000)
    created = create_consumer(clients, "b", filter_subject="orders.eu.>", description="eu",
                              max_deliver=3)
    create_consumer(clients, "a")
    # Defaults are filled in: ack wait 30 s, max ack pending 1000.
    assert created.stream == STREAM
    assert (created.config.ack_wait_ms, created.config.max_ack_pending) == (
        limits.ack_wait_ms_default, limits.max_ack_pending_default)
    assert (created.config.filter_subject, created.config.description,
            created.config.max_deliver) == ("orders.eu.>", "eu", 3)
    assert before_ms - 5_000 <= created.created_ms <= int(time.time() * 1000) + 5_000
    assert consumer_info(clients, "b") == created
    assert consumer_names(clients) == ["a", "b"]
    assert stream_state(clients).consumers == 2

    delete_consumer(clients, "a")
    expect_error(clients.consumers.GetConsumerInfo,
                 consumers_pb2.GetConsumerInfoRequest(stream=STREAM, consumer="a"),
                 Reason.CONSUMER_NOT_FOUND)
    expect_error(clients.consumers.DeleteConsumer,
                 consumers_pb2.DeleteConsumerRequest(stream=STREAM, consumer="a"),
                 Reason.CONSUMER_NOT_FOUND)
    assert consumer_names(clients) == ["b"]
    assert stream_state(clients).consumers == 1


def test_deleting_a_stream_deletes_its_consumers(clients: Clients) -> None:
    create_stream(clients)
    create_consumer(clients, "c")
    clients.streams.DeleteStream(streams_pb2.DeleteStreamRequest(name=STREAM),
                                 timeout=RPC_TIMEOUT_S)
    expect_error(clients.consumers.ListConsumers, consumers_pb2.ListConsumersRequest(
        stream=STREAM), Reason.STREAM_NOT_FOUND)
    create_stream(clients)
    assert consumer_names(clients) == []
    expect_error(clients.consumers.Fetch, consumers_pb2.FetchRequest(stream=STREAM, consumer="c"),
                 Reason.CONSUMER_NOT_FOUND)


def test_create_with_the_same_config_is_idempotent_and_keeps_state(clients: Clients) -> None:
    create_stream(clients)
    for _ in range(3):
        publish(clients, "a")
    first = create_consumer(clients, "c", filter_subject="a", max_deliver=4)
    assert seqs_of(fetch(clients, batch=2)) == [1, 2]
    # The same config, once as sent and once with the defaults spelled out.
    for fields in ({}, {"ack_wait_ms": limits.ack_wait_ms_default,
                        "max_ack_pending": limits.max_ack_pending_default}):
        again = create_consumer(clients, "c", filter_subject="a", max_deliver=4, **fields)
        assert again.config == first.config
        assert again.created_ms == first.created_ms
        # Not a reset: the deliveries so far are still there.
        assert (again.state.delivered_seq, again.state.num_ack_pending) == (2, 2)
    assert consumer_names(clients) == ["c"]
    assert seqs_of(fetch(clients)) == [3]


def test_create_with_a_different_config_is_consumer_exists(clients: Clients) -> None:
    create_stream(clients)
    original = create_consumer(clients, "c", ack_wait_ms=1_000)
    metadata = expect_error(clients.consumers.CreateConsumer, consumers_pb2.CreateConsumerRequest(
        stream=STREAM, config=consumers_pb2.ConsumerConfig(name="c", ack_wait_ms=2_000)),
        Reason.CONSUMER_EXISTS)
    assert metadata == {"stream": STREAM, "consumer": "c"}
    assert consumer_info(clients, "c") == original


# --------------------------------------------------------------------------------- filters

FILTER_SUBJECTS = ["orders.eu.new", "orders.us.new", "orders.eu.paid", "orders.eu.paid.late",
                   "orders.us.paid", "orders.eu"]


@pytest.mark.parametrize(
    ("filter_subject", "expected"),
    [
        ("", [1, 2, 3, 4, 5, 6]),
        ("orders.>", [1, 2, 3, 4, 5, 6]),
        ("orders.eu.paid", [3]),
        ("orders.*.new", [1, 2]),
        ("orders.*.paid", [3, 5]),
        ("orders.*", [6]),
        ("*.eu.*", [1, 3]),
        ("orders.eu.>", [1, 3, 4]),
        ("*.*.paid.>", [4]),
    ],
)
def test_filter_subject_wildcards_deliver_exactly_the_matching_seqs(
    shared_clients: Clients, filter_subject: str, expected: list[int]
) -> None:
    clients, stream = shared_clients, fresh_stream_name()
    create_stream(clients, stream, subjects=["orders.>"])
    for subject in FILTER_SUBJECTS:
        publish(clients, subject, stream=stream)
    created = create_consumer(clients, stream=stream, filter_subject=filter_subject)
    assert created.state.num_pending == len(expected)
    messages = fetch(clients, stream=stream)
    assert seqs_of(messages) == expected
    assert all(FILTER_SUBJECTS[m.seq - 1] == m.subject for m in messages)
    state = consumer_info(clients, stream=stream).state
    assert (state.num_pending, state.num_ack_pending) == (0, len(expected))


# --------------------------------------------------------------------------------- policies

# Seqs 1..5 before the consumer exists; 6 and 7 after. The last seq per subject is
# a.1 -> 5, b.1 -> 2, a.2 -> 4. Seq 3 is the first one published after a clock tick.
POLICY_BACKLOG = ["a.1", "b.1", "a.1", "a.2", "a.1"]
POLICY_LATER = ["a.1", "b.1"]
START_TIME_OF_SEQ_3 = -1


@pytest.mark.parametrize(
    ("policy", "fields", "filter_subject", "backlog", "later"),
    [
        (P.DELIVER_POLICY_ALL, {}, "", [1, 2, 3, 4, 5], [6, 7]),
        (P.DELIVER_POLICY_ALL, {}, "a.*", [1, 3, 4, 5], [6]),
        (P.DELIVER_POLICY_LAST, {}, "", [5], [6, 7]),
        (P.DELIVER_POLICY_LAST, {}, "b.*", [2], [7]),
        (P.DELIVER_POLICY_NEW, {}, "", [], [6, 7]),
        (P.DELIVER_POLICY_BY_START_SEQ, {"opt_start_seq": 3}, "", [3, 4, 5], [6, 7]),
        (P.DELIVER_POLICY_BY_START_SEQ, {"opt_start_seq": 3}, "a.1", [3, 5], [6]),
        (P.DELIVER_POLICY_BY_START_SEQ, {"opt_start_seq": 7}, "", [], [7]),
        (P.DELIVER_POLICY_BY_START_TIME, {"opt_start_time_ms": START_TIME_OF_SEQ_3}, "",
         [3, 4, 5], [6, 7]),
        (P.DELIVER_POLICY_LAST_PER_SUBJECT, {}, "", [2, 4, 5], [6, 7]),
        (P.DELIVER_POLICY_LAST_PER_SUBJECT, {}, "a.*", [4, 5], [6]),
    ],
    ids=["all", "all-filtered", "last", "last-filtered", "new", "by-start-seq",
         "by-start-seq-filtered", "by-start-seq-beyond-the-end", "by-start-time",
         "last-per-subject", "last-per-subject-filtered"],
)
def test_deliver_policy_delivers_exactly_the_right_seqs(
    shared_clients: Clients, policy: int, fields: dict[str, int], filter_subject: str,
    backlog: list[int], later: list[int],
) -> None:
    clients, stream = shared_clients, fresh_stream_name()
    create_stream(clients, stream)
    for subject in POLICY_BACKLOG[:2]:
        publish(clients, subject, stream=stream)
    ts_2 = get_message(clients, 2, stream).ts_ms
    # Seq 3 must get a later timestamp than seq 2.
    wait_until(lambda: time.time() * 1000 > ts_2 + 2, 2.0, what="wall clock past seq 2")
    for subject in POLICY_BACKLOG[2:]:
        publish(clients, subject, stream=stream)
    ts_3 = get_message(clients, 3, stream).ts_ms
    assert ts_3 > ts_2
    start: dict[str, Any] = {k: (ts_3 if v == START_TIME_OF_SEQ_3 else v)
                             for k, v in fields.items()}

    created = create_consumer(clients, stream=stream, deliver_policy=policy,
                              filter_subject=filter_subject, **start)
    assert created.state.num_pending == len(backlog)
    first = fetch(clients, stream=stream)
    assert seqs_of(first) == backlog
    for subject in POLICY_LATER:
        publish(clients, subject, stream=stream)
    second = fetch(clients, stream=stream)
    assert seqs_of(second) == later
    assert {m.deliver_count for m in first + second} <= {1}


# --------------------------------------------------------------------------------- fetch


def test_fetch_hands_out_at_most_batch_in_seq_order_with_deliver_count_1(
    clients: Clients
) -> None:
    create_stream(clients)
    publish(clients, "a", b"first", headers=[types_pb2.Header(key="k", value="v")], msg_id="m1")
    for i in range(2, 11):
        publish(clients, "a", b"%d" % i)
    create_consumer(clients)
    batch = fetch(clients, batch=4)
    assert seqs_of(batch) == [1, 2, 3, 4]
    first = batch[0]
    assert (first.stream, first.subject, first.payload, first.msg_id, first.deliver_count) == (
        STREAM, "a", b"first", "m1", 1)
    assert [(h.key, h.value) for h in first.headers] == [("k", "v")]
    assert first.ts_ms == get_message(clients, 1).ts_ms
    assert seqs_of(fetch(clients, batch=0)) == [5]  # batch 0 means 1
    rest = fetch(clients, batch=100)
    assert seqs_of(rest) == [6, 7, 8, 9, 10]
    assert all(m.deliver_count == 1 for m in batch + rest)
    state = consumer_info(clients).state
    assert (state.delivered_seq, state.num_ack_pending, state.num_pending, state.ack_floor) == (
        10, 10, 0, 0)


def test_fetch_on_an_empty_stream_returns_nothing_after_about_max_wait(clients: Clients) -> None:
    create_stream(clients)
    create_consumer(clients)
    before, messages, after = timed_fetch(clients, max_wait_ms=0)
    assert messages == [] and after - before < 2.0
    before, messages, after = timed_fetch(clients, max_wait_ms=400)
    assert messages == []
    assert 0.4 <= after - before < 3.0


def test_a_waiting_fetch_returns_a_message_another_client_publishes_promptly(
    node_proc: NodeProcess, clients: Clients
) -> None:
    create_stream(clients)
    create_consumer(clients)
    waiting = clients.consumers.Fetch.future(consumers_pb2.FetchRequest(
        stream=STREAM, consumer="c", batch=10, max_wait_ms=10_000), timeout=30)
    time.sleep(0.3)  # let the fetch park on the server (a setup step, not an assertion)
    assert not waiting.done()
    with node_proc.channel() as other_channel:
        published_at = time.monotonic()
        seq = publish(Clients(other_channel), "a", b"news")
    reply = waiting.result(timeout=5)
    assert seqs_of(list(reply.messages)) == [seq]
    assert time.monotonic() - published_at < 2.0  # not at the end of the 10 s wait


def test_a_waiting_fetch_ends_with_consumer_not_found_when_the_consumer_is_deleted(
    clients: Clients
) -> None:
    create_stream(clients)
    create_consumer(clients)
    waiting = clients.consumers.Fetch.future(consumers_pb2.FetchRequest(
        stream=STREAM, consumer="c", max_wait_ms=10_000), timeout=30)
    time.sleep(0.3)
    deleted_at = time.monotonic()
    delete_consumer(clients)
    with pytest.raises(grpc.RpcError) as info:
        waiting.result(timeout=5)
    err = from_rpc_error(info.value)
    assert err is not None and err.reason is Reason.CONSUMER_NOT_FOUND, info.value
    assert time.monotonic() - deleted_at < 2.0


# --------------------------------------------------------------------------------- acks


def test_ack_applies_many_seqs_and_counts_only_changes(clients: Clients) -> None:
    create_stream(clients)
    for _ in range(6):
        publish(clients, "a")
    create_consumer(clients)
    assert seqs_of(fetch(clients, batch=5)) == [1, 2, 3, 4, 5]
    assert ack(clients, [1, 2, 3]) == 3
    assert consumer_info(clients).state.ack_floor == 3
    assert ack(clients, [3, 1]) == 0  # already acked: accepted, not counted
    assert ack(clients, [2, 5, 5]) == 1  # a repeated seq counts once
    state = consumer_info(clients).state
    assert (state.ack_floor, state.num_ack_pending, state.delivered_seq) == (3, 1, 5)
    assert ack(clients, [4]) == 1
    assert consumer_info(clients).state.ack_floor == 5


def test_ack_of_a_never_delivered_seq_is_refused_alone_and_the_rest_applies(
    clients: Clients
) -> None:
    create_stream(clients)
    for _ in range(3):
        publish(clients, "a")
    create_consumer(clients)
    assert seqs_of(fetch(clients, batch=2)) == [1, 2]
    reply = clients.consumers.Ack(consumers_pb2.AckRequest(
        stream=STREAM, consumer="c", seqs=[1, 3]), timeout=RPC_TIMEOUT_S)
    assert reply.applied == 1
    assert [(r.seq, r.error.reason) for r in reply.results] == [(1, ""), (3, "NOT_DELIVERED")]
    assert dict(reply.results[1].error.metadata) == {
        "seq": "3", "delivered_seq": "2", "ack_floor": "0"}
    reply = clients.consumers.Ack(consumers_pb2.AckRequest(
        stream=STREAM, consumer="c", seqs=[2, 99]), timeout=RPC_TIMEOUT_S)
    assert [(r.seq, r.error.reason) for r in reply.results] == [(2, ""), (99, "NOT_DELIVERED")]
    state = consumer_info(clients).state
    assert (state.ack_floor, state.num_ack_pending) == (2, 0)
    assert seqs_of(fetch(clients)) == [3]


# --------------------------------------------------------------------------------- nak, term


def test_nak_with_delay_redelivers_only_after_the_delay_with_deliver_count_2(
    clients: Clients
) -> None:
    create_stream(clients)
    publish(clients, "a")
    publish(clients, "a")
    create_consumer(clients)  # ack wait 30 s: only the nak can bring seq 1 back
    assert seqs_of(fetch(clients, batch=2)) == [1, 2]
    nak_started = time.monotonic()
    assert nak(clients, [1], delay_ms=700) == 1
    _, early, _ = timed_fetch(clients, max_wait_ms=300)
    assert early == [] or time.monotonic() - nak_started >= 0.7, "redelivered before the delay"
    _, messages, received = timed_fetch(clients, max_wait_ms=5_000)
    assert counts_of(messages) == {1: 2}
    assert received - nak_started >= 0.7
    assert consumer_info(clients).state.num_redelivered == 1
    # Delay 0: due again at once.
    assert nak(clients, [2], delay_ms=0) == 1
    assert counts_of(fetch(clients, max_wait_ms=2_000)) == {2: 2}


def test_term_never_redelivers_a_message(clients: Clients) -> None:
    create_stream(clients)
    publish(clients, "a")
    publish(clients, "a")
    create_consumer(clients, ack_wait_ms=300)
    assert seqs_of(fetch(clients, batch=2)) == [1, 2]
    reply = clients.consumers.Term(consumers_pb2.TermRequest(
        stream=STREAM, consumer="c", seqs=[1], reason="poison"), timeout=RPC_TIMEOUT_S)
    assert reply.applied == 1
    # Seq 2 (not terminated) comes back after the ack wait; seq 1 does not.
    assert counts_of(fetch(clients, max_wait_ms=3_000)) == {2: 2}
    assert ack(clients, [2]) == 1
    assert fetch(clients, max_wait_ms=900) == []  # three ack waits
    state = consumer_info(clients).state
    assert (state.ack_floor, state.num_ack_pending) == (2, 0)
    reply = clients.consumers.Term(consumers_pb2.TermRequest(
        stream=STREAM, consumer="c", seqs=[1]), timeout=RPC_TIMEOUT_S)
    assert reply.applied == 0


def test_in_progress_extends_the_ack_wait(clients: Clients) -> None:
    ack_wait_s = 0.8
    create_stream(clients)
    publish(clients, "a")
    publish(clients, "a")
    create_consumer(clients, ack_wait_ms=int(ack_wait_s * 1000))
    fetched_at = time.monotonic()
    assert seqs_of(fetch(clients, batch=2)) == [1, 2]
    time.sleep(ack_wait_s / 2)  # half way to the original deadline (a setup step)
    touched_at = time.monotonic()
    reply = clients.consumers.InProgress(consumers_pb2.InProgressRequest(
        stream=STREAM, consumer="c", seqs=[1]), timeout=RPC_TIMEOUT_S)
    assert reply.applied == 1
    assert time.monotonic() - fetched_at < ack_wait_s, "too slow to test before the deadline"
    # At the original deadline only seq 2 is due.
    assert counts_of(fetch(clients, max_wait_ms=5_000)) == {2: 2}
    _, messages, received = timed_fetch(clients, max_wait_ms=5_000)
    assert counts_of(messages) == {1: 2}
    assert received - touched_at >= ack_wait_s


# --------------------------------------------------------------------------------- redelivery


def test_unacked_message_is_redelivered_after_ack_wait_with_a_higher_count(
    clients: Clients
) -> None:
    create_stream(clients)
    publish(clients, "a")
    create_consumer(clients, ack_wait_ms=300)
    starts, received = [], []
    for count in (1, 2, 3):
        before, messages, after = timed_fetch(clients, max_wait_ms=5_000)
        assert counts_of(messages) == {1: count}
        starts.append(before)
        received.append(after)
    # Each redelivery comes no sooner than one ack wait after the delivery before it.
    assert all(received[i + 1] - starts[i] >= 0.3 for i in range(2))
    state = consumer_info(clients).state
    assert (state.num_redelivered, state.num_ack_pending, state.ack_floor) == (1, 1, 0)
    assert ack(clients, [1]) == 1
    assert fetch(clients, max_wait_ms=700) == []


def test_backoff_list_sets_each_redelivery_delay_and_its_last_value_repeats(
    clients: Clients
) -> None:
    create_stream(clients)
    publish(clients, "a")
    create_consumer(clients, backoff_ms=[100, 1_000])  # ack wait stays 30 s: backoff rules
    starts, received = [], []
    for count in (1, 2, 3, 4):
        before, messages, after = timed_fetch(clients, max_wait_ms=5_000)
        assert counts_of(messages) == {1: count}
        starts.append(before)
        received.append(after)
    waits = [received[i + 1] - starts[i] for i in range(3)]
    assert 0.1 <= waits[0] < 1.0  # backoff[0], not backoff[1]
    assert 1.0 <= waits[1] < 4.0  # backoff[1]
    assert 1.0 <= waits[2] < 4.0  # the last value repeats (not the 30 s ack wait)


def test_max_ack_pending_stops_fetch_until_an_ack_frees_room(clients: Clients) -> None:
    create_stream(clients)
    for _ in range(5):
        publish(clients, "a")
    create_consumer(clients, max_ack_pending=3)
    assert seqs_of(fetch(clients, batch=10)) == [1, 2, 3]
    assert fetch(clients, batch=10, max_wait_ms=300) == []
    state = consumer_info(clients).state
    assert (state.num_ack_pending, state.num_pending) == (3, 2)
    waiting = clients.consumers.Fetch.future(consumers_pb2.FetchRequest(
        stream=STREAM, consumer="c", batch=10, max_wait_ms=10_000), timeout=30)
    time.sleep(0.2)
    acked_at = time.monotonic()
    assert ack(clients, [1]) == 1
    assert seqs_of(list(waiting.result(timeout=5).messages)) == [4]  # room for one
    assert time.monotonic() - acked_at < 2.0
    assert ack(clients, [2, 3]) == 2
    assert seqs_of(fetch(clients, batch=10)) == [5]


# --------------------------------------------------------------------------------- dead letters


@pytest.mark.parametrize(
    ("trigger", "dead_letter_subject"),
    [("fetch", "dlq.orders"), ("nak", "dlq.orders"), ("fetch", "")],
    ids=["on-fetch", "on-nak", "without-subject-dropped"],
)
def test_max_deliver_dead_letters_the_message_with_dlq_headers(
    clients: Clients, trigger: str, dead_letter_subject: str
) -> None:
    create_stream(clients, subjects=["orders.>", "dlq.>"])
    seq = publish(clients, "orders.a", b"boom", msg_id="m1",
                  headers=[types_pb2.Header(key="k", value="v")])
    create_consumer(clients, filter_subject="orders.>", max_deliver=2, ack_wait_ms=250,
                    dead_letter_subject=dead_letter_subject)
    assert counts_of(fetch(clients)) == {seq: 1}
    assert counts_of(fetch(clients, max_wait_ms=5_000)) == {seq: 2}
    if trigger == "nak":
        assert nak(clients, [seq], delay_ms=0) == 1
    else:
        # The third delivery is due after the ack wait: instead, the message is dead-lettered.
        assert fetch(clients, max_wait_ms=800) == []
    state = consumer_info(clients).state
    assert (state.num_dead_lettered, state.num_ack_pending) == (1, 0)
    assert state.ack_floor >= seq  # also past the dead letter itself once a fetch skips it
    assert fetch(clients, max_wait_ms=600) == []  # never redelivered to this consumer

    stream = stream_state(clients)
    if not dead_letter_subject:
        assert (stream.last_seq, stream.messages) == (1, 1)
        return
    assert (stream.last_seq, stream.messages) == (2, 2)
    dead = get_message(clients, 2)
    assert (dead.subject, dead.payload) == ("dlq.orders", b"boom")
    assert [(h.key, h.value) for h in dead.headers] == [
        ("k", "v"), (DLQ_STREAM, STREAM), (DLQ_CONSUMER, "c"), (DLQ_SEQ, str(seq)),
        (DLQ_SUBJECT, "orders.a"), (DLQ_DELIVERIES, "2")]
    create_consumer(clients, "dlq", filter_subject="dlq.>")
    assert seqs_of(fetch(clients, "dlq")) == [2]


def test_a_stream_update_never_wedges_a_consumers_dead_lettering(clients: Clients) -> None:
    create_stream(clients, subjects=["jobs.>", "dlq.>"])
    publish(clients, "jobs.a")
    create_consumer(clients, filter_subject="jobs.>", max_deliver=1, ack_wait_ms=200,
                    dead_letter_subject="dlq.jobs")
    assert seqs_of(fetch(clients)) == [1]
    try:
        clients.streams.UpdateStream(streams_pb2.UpdateStreamRequest(
            name=STREAM, subjects=streams_pb2.SubjectList(subjects=["jobs.>"])),
            timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as exc:  # refusing the update is one correct answer
        err = from_rpc_error(exc)
        assert err is not None and err.reason is Reason.INVALID_CONFIG, exc
        return
    publish(clients, "jobs.b")
    # The other correct answer: the consumer keeps working once seq 1 is out of deliveries.
    assert seqs_of(fetch(clients, max_wait_ms=600)) == [2]
    assert fetch(clients, max_wait_ms=600) == []
    assert consumer_info(clients).state.num_dead_lettered == 1


# --------------------------------------------------------------------------------- subscribe


def test_subscribe_delivers_the_backlog_then_a_new_message_woken_by_the_append(
    clients: Clients
) -> None:
    create_stream(clients)
    for i in range(3):
        publish(clients, "a", b"%d" % i)
    create_consumer(clients)
    # A 10 s heartbeat: a server that polled on that period could not answer within 2 s.
    with Subscription(clients, consumer="c", heartbeat_ms=10_000) as sub:
        backlog = [sub.next_message()[1] for _ in range(3)]
        assert seqs_of(backlog) == [1, 2, 3]
        assert all(m.deliver_count == 1 and m.stream == STREAM for m in backlog)
        time.sleep(0.3)  # let the subscription park in its wait (a setup step)
        published_at = time.monotonic()
        seq = publish(clients, "a", b"new")
        arrived_at, message = sub.next_message()
        assert (message.seq, message.payload) == (seq, b"new")
        assert arrived_at - published_at < 2.0
    assert ack(clients, [1, 2, 3, 4]) == 4  # push deliveries are acked through Ack
    assert consumer_info(clients).state.ack_floor == 4


def test_subscribe_sends_heartbeats_when_idle(clients: Clients) -> None:
    create_stream(clients)
    publish(clients, "a")
    publish(clients, "a")
    create_consumer(clients)
    with Subscription(clients, consumer="c", heartbeat_ms=200) as sub:
        assert seqs_of([sub.next_message()[1] for _ in range(2)]) == [1, 2]
        times = []
        for _ in range(3):
            at, event = sub.next(timeout_s=5)
            assert event is not None and event.WhichOneof("event") == "heartbeat", event
            assert event.heartbeat.commit_seq == 2
            times.append(at)
    # Spaced by the heartbeat period: an idle subscription does not spin.
    assert all(later - earlier >= 0.15 for earlier, later in itertools.pairwise(times))


def test_subscribe_below_the_minimum_heartbeat_is_invalid(clients: Clients) -> None:
    create_stream(clients)
    create_consumer(clients)
    metadata = expect_error(clients.consumers.Subscribe, consumers_pb2.SubscribeRequest(
        stream=STREAM, consumer="c", heartbeat_ms=limits.subscribe_heartbeat_ms_min - 1),
        Reason.INVALID_ARGUMENT)
    assert metadata["field"] == "heartbeat_ms"


@pytest.mark.parametrize("backlog", [3, 0])
def test_subscribe_stop_when_empty_ends_with_a_stopped_event(clients: Clients,
                                                             backlog: int) -> None:
    create_stream(clients)
    for _ in range(backlog):
        publish(clients, "a")
    create_consumer(clients)
    with Subscription(clients, consumer="c", stop_when_empty=True, heartbeat_ms=200) as sub:
        assert seqs_of([sub.next_message()[1] for _ in range(backlog)]) == list(
            range(1, backlog + 1))
        _, event = sub.next()
        assert event is not None and event.WhichOneof("event") == "stopped", event
        assert event.stopped.reason == "drained"
        assert sub.next()[1] is None  # the server ended the call cleanly


@pytest.mark.parametrize(("what", "reason"), [("consumer", "consumer deleted"),
                                              ("stream", "stream deleted")])
def test_deleting_the_consumer_or_its_stream_ends_the_subscription(
    clients: Clients, what: str, reason: str
) -> None:
    create_stream(clients)
    create_consumer(clients)
    with Subscription(clients, consumer="c", heartbeat_ms=5_000) as sub:
        time.sleep(0.3)  # let the subscription park in its wait
        deleted_at = time.monotonic()
        if what == "consumer":
            delete_consumer(clients)
        else:
            clients.streams.DeleteStream(streams_pb2.DeleteStreamRequest(name=STREAM),
                                         timeout=RPC_TIMEOUT_S)
        stopped_at, event = sub.next()
        assert event is not None and event.WhichOneof("event") == "stopped", event
        assert event.stopped.reason == reason
        assert stopped_at - deleted_at < 2.0  # woken by the delete, not the 5 s heartbeat
        assert sub.next()[1] is None


def test_subscribe_redelivers_an_unacked_message_after_ack_wait(clients: Clients) -> None:
    create_stream(clients)
    publish(clients, "a")
    create_consumer(clients, ack_wait_ms=300)
    with Subscription(clients, consumer="c", heartbeat_ms=5_000) as sub:
        first_at, first = sub.next_message()
        again_at, again = sub.next_message()
    assert (first.seq, first.deliver_count, again.seq, again.deliver_count) == (1, 1, 1, 2)
    assert again_at - first_at < 3.0


# --------------------------------------------------------------------------------- retention


def test_work_queue_removes_acked_and_terminated_messages(clients: Clients) -> None:
    create_stream(clients, subjects=["wq.>"], retention=WORK_QUEUE)
    for _ in range(4):
        publish(clients, "wq.a")
    create_consumer(clients, filter_subject="wq.a")
    assert seqs_of(fetch(clients)) == [1, 2, 3, 4]
    assert ack(clients, [1, 2]) == 2
    # Removed by the time the ack returns.
    for seq in (1, 2):
        expect_error(clients.streams.GetMessage, streams_pb2.GetMessageRequest(
            stream=STREAM, seq=seq), Reason.MESSAGE_NOT_FOUND)
    assert stream_state(clients).messages == 2
    assert clients.consumers.Term(consumers_pb2.TermRequest(
        stream=STREAM, consumer="c", seqs=[4]), timeout=RPC_TIMEOUT_S).applied == 1
    expect_error(clients.streams.GetMessage, streams_pb2.GetMessageRequest(stream=STREAM, seq=4),
                 Reason.MESSAGE_NOT_FOUND)
    state = stream_state(clients)
    assert (state.messages, state.first_seq, state.last_seq) == (1, 3, 4)
    assert get_message(clients, 3).seq == 3  # unacked: kept


def test_work_queue_refuses_a_consumer_whose_filter_overlaps_another(clients: Clients) -> None:
    create_stream(clients, subjects=["wq.>"], retention=WORK_QUEUE)
    create_consumer(clients, "first", filter_subject="wq.a.*")
    for name, filter_subject in [("all", ""), ("tail", "wq.>"), ("star", "wq.*.x"),
                                 ("same", "wq.a.*"), ("literal", "wq.a.b"), ("lead", "*.a.>")]:
        metadata = expect_error(clients.consumers.CreateConsumer,
                                consumers_pb2.CreateConsumerRequest(
                                    stream=STREAM, config=consumers_pb2.ConsumerConfig(
                                        name=name, filter_subject=filter_subject)),
                                Reason.WORK_QUEUE_OVERLAP)
        assert metadata == {"consumer": "first"}, filter_subject
    create_consumer(clients, "second", filter_subject="wq.b.>")  # disjoint: accepted
    create_consumer(clients, "third", filter_subject="wq.a")  # one token fewer: disjoint
    assert consumer_names(clients) == ["first", "second", "third"]


def test_interest_removes_a_message_once_every_consumer_acked_it(clients: Clients) -> None:
    create_stream(clients, retention=INTEREST)
    create_consumer(clients, "c1")
    create_consumer(clients, "c2")
    create_consumer(clients, "c3")
    for _ in range(3):
        publish(clients, "a")
    assert seqs_of(fetch(clients, "c1")) == [1, 2, 3]
    assert ack(clients, [1, 2, 3], "c1") == 3
    assert stream_state(clients).messages == 3  # c2 and c3 have not acked
    assert seqs_of(fetch(clients, "c2")) == [1, 2, 3]
    assert ack(clients, [1], "c2") == 1
    assert seqs_of(fetch(clients, "c3")) == [1, 2, 3]
    assert ack(clients, [1, 2], "c3") == 2
    state = stream_state(clients)
    assert (state.messages, state.first_seq) == (2, 2)
    expect_error(clients.streams.GetMessage, streams_pb2.GetMessageRequest(stream=STREAM, seq=1),
                 Reason.MESSAGE_NOT_FOUND)
    # Deleting the lagging consumer leaves only what c3 still needs.
    delete_consumer(clients, "c2")
    state = stream_state(clients)
    assert (state.messages, state.first_seq) == (1, 3)


def test_interest_a_lagging_consumer_whose_filter_does_not_match_holds_nothing_back(
    clients: Clients
) -> None:
    create_stream(clients, retention=INTEREST)
    create_consumer(clients, "ca", filter_subject="a")
    create_consumer(clients, "cb", filter_subject="b")  # lags: fetches nothing yet
    for subject in ("a", "b", "a", "b"):
        publish(clients, subject)
    assert seqs_of(fetch(clients, "ca")) == [1, 3]
    assert ack(clients, [1, 3], "ca") == 2
    assert stream_state(clients).messages == 2  # at once, not at cb's next ack
    for seq in (1, 3):
        expect_error(clients.streams.GetMessage, streams_pb2.GetMessageRequest(
            stream=STREAM, seq=seq), Reason.MESSAGE_NOT_FOUND)
    assert seqs_of(fetch(clients, "cb")) == [2, 4]


def test_interest_keeps_nothing_without_consumers(clients: Clients) -> None:
    create_stream(clients, retention=INTEREST)
    for _ in range(3):
        publish(clients, "a")
    state = stream_state(clients)
    assert (state.messages, state.last_seq) == (0, 3)
    create_consumer(clients, deliver_policy=P.DELIVER_POLICY_ALL)
    assert fetch(clients) == []
    publish(clients, "a")
    assert seqs_of(fetch(clients)) == [4]


def test_interest_deleting_the_last_consumer_leaves_nothing_kept(clients: Clients) -> None:
    create_stream(clients, retention=INTEREST)
    create_consumer(clients)
    for _ in range(3):
        publish(clients, "a")
    assert stream_state(clients).messages == 3  # the consumer wants them
    delete_consumer(clients)
    assert stream_state(clients).messages == 0


def test_interest_keeps_no_message_that_no_consumer_filter_matches(clients: Clients) -> None:
    create_stream(clients, retention=INTEREST)
    create_consumer(clients, filter_subject="a")
    for _ in range(3):
        publish(clients, "b")
    assert fetch(clients, max_wait_ms=100) == []  # the consumer passes the "b" messages
    wait_until(lambda: stream_state(clients).messages == 0, 2.0,
               what="unwanted messages removed")


# --------------------------------------------------------------------------------- bad input


def _create(**fields: Any) -> consumers_pb2.CreateConsumerRequest:
    return consumers_pb2.CreateConsumerRequest(stream=STREAM,
                                               config=consumers_pb2.ConsumerConfig(**fields))


BAD_INPUT: list[tuple[str, str, Any, Reason]] = [
    ("name-empty", "CreateConsumer", _create(name=""), Reason.INVALID_NAME),
    ("name-too-long", "CreateConsumer", _create(name="x" * (limits.name_bytes_max + 1)),
     Reason.INVALID_NAME),
    ("name-path", "CreateConsumer", _create(name="../x"), Reason.INVALID_NAME),
    ("name-space", "CreateConsumer", _create(name="a b"), Reason.INVALID_NAME),
    ("name-slash", "CreateConsumer", _create(name="a/b"), Reason.INVALID_NAME),
    ("stream-name-empty", "CreateConsumer", consumers_pb2.CreateConsumerRequest(
        stream="", config=consumers_pb2.ConsumerConfig(name="d")), Reason.INVALID_NAME),
    ("filter-empty-token", "CreateConsumer", _create(name="d", filter_subject="orders..b"),
     Reason.INVALID_SUBJECT),
    ("filter-gt-not-last", "CreateConsumer", _create(name="d", filter_subject="orders.>.b"),
     Reason.INVALID_SUBJECT),
    ("filter-partial-wildcard", "CreateConsumer", _create(name="d", filter_subject="orders.a*"),
     Reason.INVALID_SUBJECT),
    ("filter-outside-stream", "CreateConsumer", _create(name="d", filter_subject="other.x"),
     Reason.INVALID_CONFIG),
    ("start-seq-0", "CreateConsumer", _create(
        name="d", deliver_policy=P.DELIVER_POLICY_BY_START_SEQ, opt_start_seq=0),
     Reason.INVALID_CONFIG),
    ("start-seq-without-policy", "CreateConsumer", _create(name="d", opt_start_seq=2),
     Reason.INVALID_CONFIG),
    ("start-time-0", "CreateConsumer", _create(
        name="d", deliver_policy=P.DELIVER_POLICY_BY_START_TIME), Reason.INVALID_CONFIG),
    ("unknown-policy", "CreateConsumer", _create(name="d", deliver_policy=99),
     Reason.INVALID_CONFIG),
    ("backoff-0-entry", "CreateConsumer", _create(name="d", backoff_ms=[100, 0]),
     Reason.INVALID_CONFIG),
    ("backoff-too-many", "CreateConsumer", _create(
        name="d", backoff_ms=[10] * (limits.backoff_steps_max + 1)), Reason.INVALID_CONFIG),
    ("ack-wait-too-long", "CreateConsumer", _create(
        name="d", ack_wait_ms=limits.ack_wait_ms_max + 1), Reason.INVALID_CONFIG),
    ("max-ack-pending-too-high", "CreateConsumer", _create(
        name="d", max_ack_pending=limits.max_ack_pending_max + 1), Reason.INVALID_CONFIG),
    ("dlq-passes-own-filter", "CreateConsumer", _create(
        name="d", filter_subject="orders.>", dead_letter_subject="orders.dlq"),
     Reason.INVALID_CONFIG),
    ("dlq-outside-stream", "CreateConsumer", _create(
        name="d", filter_subject="orders.a", dead_letter_subject="dlq.x"), Reason.INVALID_CONFIG),
    ("dlq-wildcard", "CreateConsumer", _create(
        name="d", filter_subject="orders.a", dead_letter_subject="orders.*"),
     Reason.INVALID_SUBJECT),
    ("description-too-long", "CreateConsumer", _create(
        name="d", description="x" * (limits.description_bytes_max + 1)), Reason.INVALID_CONFIG),
    ("exists-other-config", "CreateConsumer", _create(name="c", ack_wait_ms=1_000),
     Reason.CONSUMER_EXISTS),
    ("create-unknown-stream", "CreateConsumer", consumers_pb2.CreateConsumerRequest(
        stream="nope", config=consumers_pb2.ConsumerConfig(name="d")), Reason.STREAM_NOT_FOUND),
    ("list-unknown-stream", "ListConsumers", consumers_pb2.ListConsumersRequest(stream="nope"),
     Reason.STREAM_NOT_FOUND),
    ("info-unknown-consumer", "GetConsumerInfo", consumers_pb2.GetConsumerInfoRequest(
        stream=STREAM, consumer="nope"), Reason.CONSUMER_NOT_FOUND),
    ("info-unknown-stream", "GetConsumerInfo", consumers_pb2.GetConsumerInfoRequest(
        stream="nope", consumer="c"), Reason.STREAM_NOT_FOUND),
    ("delete-unknown-consumer", "DeleteConsumer", consumers_pb2.DeleteConsumerRequest(
        stream=STREAM, consumer="nope"), Reason.CONSUMER_NOT_FOUND),
    ("delete-bad-name", "DeleteConsumer", consumers_pb2.DeleteConsumerRequest(
        stream=STREAM, consumer="../c"), Reason.INVALID_NAME),
    ("fetch-unknown-consumer", "Fetch", consumers_pb2.FetchRequest(
        stream=STREAM, consumer="nope"), Reason.CONSUMER_NOT_FOUND),
    ("fetch-unknown-stream", "Fetch", consumers_pb2.FetchRequest(stream="nope", consumer="c"),
     Reason.STREAM_NOT_FOUND),
    ("fetch-batch-over-max", "Fetch", consumers_pb2.FetchRequest(
        stream=STREAM, consumer="c", batch=limits.fetch_batch_max + 1), Reason.INVALID_ARGUMENT),
    ("fetch-wait-over-max", "Fetch", consumers_pb2.FetchRequest(
        stream=STREAM, consumer="c", max_wait_ms=limits.fetch_wait_ms_max + 1),
     Reason.INVALID_ARGUMENT),
    ("ack-no-seqs", "Ack", consumers_pb2.AckRequest(stream=STREAM, consumer="c"),
     Reason.INVALID_ARGUMENT),
    ("ack-seq-0", "Ack", consumers_pb2.AckRequest(stream=STREAM, consumer="c", seqs=[0]),
     Reason.INVALID_ARGUMENT),
    ("ack-pending-and-0", "Ack", consumers_pb2.AckRequest(
        stream=STREAM, consumer="c", seqs=[2, 0]), Reason.INVALID_ARGUMENT),
    ("ack-too-many-seqs", "Ack", consumers_pb2.AckRequest(
        stream=STREAM, consumer="c", seqs=[2] * (limits.ack_seqs_max + 1)),
     Reason.INVALID_ARGUMENT),
    ("ack-unknown-consumer", "Ack", consumers_pb2.AckRequest(
        stream=STREAM, consumer="nope", seqs=[1]), Reason.CONSUMER_NOT_FOUND),
    ("nak-delay-over-max", "Nak", consumers_pb2.NakRequest(
        stream=STREAM, consumer="c", seqs=[2], delay_ms=limits.nak_delay_ms_max + 1),
     Reason.INVALID_ARGUMENT),
    ("nak-no-seqs", "Nak", consumers_pb2.NakRequest(stream=STREAM, consumer="c"),
     Reason.INVALID_ARGUMENT),
    ("term-seq-0", "Term", consumers_pb2.TermRequest(stream=STREAM, consumer="c", seqs=[0]),
     Reason.INVALID_ARGUMENT),
    ("in-progress-no-seqs", "InProgress", consumers_pb2.InProgressRequest(
        stream=STREAM, consumer="c"), Reason.INVALID_ARGUMENT),
    ("subscribe-heartbeat-too-short", "Subscribe", consumers_pb2.SubscribeRequest(
        stream=STREAM, consumer="c", heartbeat_ms=50), Reason.INVALID_ARGUMENT),
    ("subscribe-heartbeat-too-long", "Subscribe", consumers_pb2.SubscribeRequest(
        stream=STREAM, consumer="c", heartbeat_ms=limits.fetch_wait_ms_max + 1),
     Reason.INVALID_ARGUMENT),
    ("subscribe-batch-over-max", "Subscribe", consumers_pb2.SubscribeRequest(
        stream=STREAM, consumer="c", batch=limits.fetch_batch_max + 1), Reason.INVALID_ARGUMENT),
    ("subscribe-unknown-consumer", "Subscribe", consumers_pb2.SubscribeRequest(
        stream=STREAM, consumer="nope"), Reason.CONSUMER_NOT_FOUND),
]


@pytest.mark.parametrize(("method", "request_", "reason"),
                         [case[1:] for case in BAD_INPUT], ids=[case[0] for case in BAD_INPUT])
def test_bad_input_gets_status_and_reason_and_changes_nothing(
    shared_clients: Clients, method: str, request_: Any, reason: Reason
) -> None:
    clients, stream = shared_clients, fresh_stream_name()
    create_stream(clients, stream, subjects=["orders.>"])
    for _ in range(3):
        publish(clients, "orders.a", stream=stream)
    # Consumer c: seq 1 acked, seq 2 awaiting an ack, seq 3 not delivered yet.
    create_consumer(clients, "c", stream=stream, filter_subject="orders.>")
    assert seqs_of(fetch(clients, batch=2, stream=stream)) == [1, 2]
    assert ack(clients, [1], stream=stream) == 1
    before = consumer_info(clients, stream=stream)
    before_stream = stream_state(clients, stream)

    request = type(request_)()
    request.CopyFrom(request_)
    if request.stream == STREAM:
        request.stream = stream
    expect_error(getattr(clients.consumers, method), request, reason)

    assert consumer_info(clients, stream=stream) == before
    assert consumer_names(clients, stream) == ["c"]
    after_stream = stream_state(clients, stream)
    assert (after_stream.messages, after_stream.last_seq) == (
        before_stream.messages, before_stream.last_seq)
    # Seq 2 is still awaiting its ack and seq 3 still comes next.
    assert ack(clients, [2], stream=stream) == 1
    assert seqs_of(fetch(clients, stream=stream)) == [3]


# Settling calls with a seq nobody delivered (consumer c: 1 acked, 2 awaiting an ack, 3 not yet
# delivered): (case, method, request, results as (seq, reason), applied, what a fetch then gets).
SETTLE_PER_SEQ: list[tuple[str, str, Any, list[tuple[int, str]], int, list[int]]] = [
    ("ack-pending-and-undelivered", "Ack", consumers_pb2.AckRequest(
        stream=STREAM, consumer="c", seqs=[2, 3]), [(2, ""), (3, "NOT_DELIVERED")], 1, [3]),
    ("ack-beyond-last", "Ack", consumers_pb2.AckRequest(
        stream=STREAM, consumer="c", seqs=[1_000, 2]), [(1_000, "NOT_DELIVERED"), (2, "")], 1,
     [3]),
    ("nak-undelivered", "Nak", consumers_pb2.NakRequest(
        stream=STREAM, consumer="c", seqs=[2, 3]), [(2, ""), (3, "NOT_DELIVERED")], 1, [2, 3]),
    ("term-undelivered", "Term", consumers_pb2.TermRequest(
        stream=STREAM, consumer="c", seqs=[2, 3]), [(2, ""), (3, "NOT_DELIVERED")], 1, [3]),
    ("in-progress-undelivered", "InProgress", consumers_pb2.InProgressRequest(
        stream=STREAM, consumer="c", seqs=[3]), [(3, "NOT_DELIVERED")], 0, [3]),
]


@pytest.mark.parametrize(("method", "request_", "results", "applied", "next_fetch"),
                         [case[1:] for case in SETTLE_PER_SEQ],
                         ids=[case[0] for case in SETTLE_PER_SEQ])
def test_settling_a_seq_nobody_delivered_refuses_that_seq_alone(
    shared_clients: Clients, method: str, request_: Any, results: list[tuple[int, str]],
    applied: int, next_fetch: list[int]
) -> None:
    clients, stream = shared_clients, fresh_stream_name()
    create_stream(clients, stream, subjects=["orders.>"])
    for _ in range(3):
        publish(clients, "orders.a", stream=stream)
    create_consumer(clients, "c", stream=stream, filter_subject="orders.>")
    assert seqs_of(fetch(clients, batch=2, stream=stream)) == [1, 2]
    assert ack(clients, [1], stream=stream) == 1
    request = type(request_)()
    request.CopyFrom(request_)
    request.stream = stream
    reply = getattr(clients.consumers, method)(request, timeout=RPC_TIMEOUT_S)
    assert [(r.seq, r.error.reason) for r in reply.results] == results
    assert all(r.error.code == grpc_status(Reason.NOT_DELIVERED).value[0]
               for r in reply.results if r.error.reason)
    assert reply.applied == applied
    assert seqs_of(fetch(clients, stream=stream)) == next_fetch


# --------------------------------------------------------------------------------- durability


def test_consumer_config_and_acks_survive_kill9_and_restart(node_proc: NodeProcess) -> None:
    ack_wait_ms = 400
    with node_proc.channel() as channel:
        clients = Clients(channel)
        create_stream(clients, subjects=["orders.>", "dlq.>"])
        for i in range(10):
            publish(clients, f"orders.{i % 3}")
        create_consumer(clients, "c", filter_subject="orders.>", ack_wait_ms=ack_wait_ms,
                        max_deliver=5, dead_letter_subject="dlq.orders", max_ack_pending=50,
                        description="durable")
        create_consumer(clients, "late", deliver_policy=P.DELIVER_POLICY_LAST_PER_SUBJECT,
                        filter_subject="orders.>", backoff_ms=[100, 200])
        assert seqs_of(fetch(clients, batch=6)) == [1, 2, 3, 4, 5, 6]
        assert ack(clients, [1, 2, 3]) == 3
        term = clients.consumers.Term(consumers_pb2.TermRequest(
            stream=STREAM, consumer="c", seqs=[5]), timeout=RPC_TIMEOUT_S)
        assert term.applied == 1
        before = {name: consumer_info(clients, name) for name in ("c", "late")}
        assert (before["c"].state.ack_floor, before["c"].state.delivered_seq,
                before["c"].state.num_ack_pending) == (3, 6, 2)
    node_proc.kill9()
    node_proc.start()
    with node_proc.channel() as channel:
        clients = Clients(channel)
        assert consumer_names(clients) == ["c", "late"]
        for name in ("c", "late"):
            after = consumer_info(clients, name)
            assert (after.config, after.created_ms) == (before[name].config,
                                                        before[name].created_ms)
        state = consumer_info(clients, "c").state
        assert (state.ack_floor, state.delivered_seq, state.num_ack_pending) == (3, 6, 2)
        assert consumer_info(clients, "late").state.num_pending == 3
        # Acked and terminated seqs stay done.
        assert ack(clients, [1, 5]) == 0
        delivered: dict[int, int] = {}
        deadline = time.monotonic() + 10
        while set(delivered) != {4, 6, 7, 8, 9, 10} and time.monotonic() < deadline:
            for message in fetch(clients, batch=20, max_wait_ms=2_000):
                assert message.seq not in delivered, f"seq {message.seq} delivered twice"
                delivered[message.seq] = message.deliver_count
        # Unacked deliveries come back (a second delivery); new ones are first deliveries.
        assert delivered == {4: 2, 6: 2, 7: 1, 8: 1, 9: 1, 10: 1}
        assert ack(clients, list(delivered)) == 6
        assert fetch(clients, max_wait_ms=2 * ack_wait_ms) == []  # nothing acked returns
        state = consumer_info(clients, "c").state
        assert (state.ack_floor, state.num_ack_pending, state.num_pending) == (10, 0, 0)


def test_work_queue_removals_and_pending_deliveries_survive_kill9(
    node_proc: NodeProcess
) -> None:
    with node_proc.channel() as channel:
        clients = Clients(channel)
        create_stream(clients, retention=WORK_QUEUE)
        for _ in range(5):
            publish(clients, "job")
        create_consumer(clients, ack_wait_ms=300)
        assert seqs_of(fetch(clients)) == [1, 2, 3, 4, 5]
        assert ack(clients, [1, 2, 4]) == 3
    node_proc.kill9()
    node_proc.start()
    with node_proc.channel() as channel:
        clients = Clients(channel)
        assert stream_state(clients).messages == 2
        for seq in (1, 2, 4):
            expect_error(clients.streams.GetMessage, streams_pb2.GetMessageRequest(
                stream=STREAM, seq=seq), Reason.MESSAGE_NOT_FOUND)
        redelivered: dict[int, int] = {}
        wait_until(lambda: redelivered.update(counts_of(fetch(clients, max_wait_ms=500)))
                   or set(redelivered) >= {3, 5}, 5.0, what="unacked jobs redelivered")
        assert redelivered == {3: 2, 5: 2}
        assert ack(clients, [3, 5]) == 2
        assert stream_state(clients).messages == 0
