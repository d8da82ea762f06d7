"""Issue 10 item 8 end to end on a real 3-process cluster: consumers across restarts and failover.

- A node that has not caught up with Raft never denies that a stream or consumer exists: with
  only one of three nodes running (no quorum, so it can never catch up) every per-stream call
  through it is UNAVAILABLE, never NOT_FOUND; once the others are back the same calls succeed.
  A caught-up cluster still answers NOT_FOUND for a stream or consumer that does not exist.
- Acks of messages the old primary delivered are accepted after it is killed (kill -9), none of
  those messages is delivered again, and a call mixing delivered and never-delivered seqs gets
  one result per seq.
- Acks carried by fetches (`FetchRequest.ack_seqs`) through a node that is not the primary are
  answered per seq, and once one Ack call returns they are all saved: the primary's kill -9
  loses none of them.

Processes are signalled by pid through the `cluster3` fixture, which stops them all afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest

from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import cluster_pb2, consumers_pb2, streams_pb2, types_pb2

call_timeout_s = 10.0
probe_timeout_s = 3.0  # one call to a node that cannot reach a quorum
recover_timeout_s = 60.0  # the others are back -> every call succeeds again
failover_timeout_s = 30.0  # kill -9 of the primary -> another node serves the stream
ack_wait_ms = 1_500  # short: a message that would come back does so within the test
messages = 50
STREAM = "orders"
CONSUMER = "c1"


def _reason(err: grpc.RpcError) -> str:
    found = from_rpc_error(err)
    return found.reason.name if found is not None else f"(no ErrorInfo: {err.details()})"


def _answer(call: Callable[[], object]) -> str:
    """'OK' or the status code and reason the call ended with."""
    try:
        call()
    except grpc.RpcError as err:
        return f"{err.code().name} {_reason(err)}"
    return "OK"


def _primary(cluster: LocalCluster, *, among: list[int]) -> int:
    """The index of the stream's primary as the first answering node of `among` names it."""
    for i in among:
        try:
            route = cluster.cluster(i).ExplainRoute(
                cluster_pb2.ExplainRouteRequest(stream=STREAM), timeout=call_timeout_s)
        except grpc.RpcError:
            continue
        if route.primary:
            return cluster.index_of(route.primary)
    raise AssertionError(f"no running node of {among} names a primary for {STREAM}")


def _create_stream_and_consumer(cluster: LocalCluster, *, count: int) -> None:
    cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(
        name=STREAM, subjects=[f"{STREAM}.>"], replicas=3)), timeout=call_timeout_s)
    if count:
        entries = [streams_pb2.PublishEntry(subject=f"{STREAM}.a", payload=b"%d" % k)
                   for k in range(count)]
        cluster.streams(1).PublishBatch(streams_pb2.PublishBatchRequest(
            stream=STREAM, entries=entries), timeout=call_timeout_s)
    cluster.consumers(1).CreateConsumer(consumers_pb2.CreateConsumerRequest(
        stream=STREAM, config=consumers_pb2.ConsumerConfig(name=CONSUMER,
                                                           ack_wait_ms=ack_wait_ms)),
        timeout=call_timeout_s)


def _per_stream_calls(cluster: LocalCluster, i: int) -> dict[str, Callable[[], object]]:
    """One call of each kind the issue names, through node i."""
    consumers, streams = cluster.consumers(i), cluster.streams(i)
    return {
        "Fetch": lambda: consumers.Fetch(consumers_pb2.FetchRequest(
            stream=STREAM, consumer=CONSUMER, batch=1, max_wait_ms=200),
            timeout=probe_timeout_s),
        "GetConsumerInfo": lambda: consumers.GetConsumerInfo(
            consumers_pb2.GetConsumerInfoRequest(stream=STREAM, consumer=CONSUMER),
            timeout=probe_timeout_s),
        "Ack": lambda: consumers.Ack(consumers_pb2.AckRequest(
            stream=STREAM, consumer=CONSUMER, seqs=[1]), timeout=probe_timeout_s),
        "GetStreamInfo": lambda: streams.GetStreamInfo(streams_pb2.GetStreamInfoRequest(
            name=STREAM), timeout=probe_timeout_s),
    }


def test_a_node_without_quorum_never_denies_a_stream_or_consumer(
        cluster3: LocalCluster) -> None:
    _create_stream_and_consumer(cluster3, count=5)
    alone = _primary(cluster3, among=[1, 2, 3])  # it serves the stream's calls itself
    for i in (1, 2, 3):
        cluster3.stop(i)
    cluster3.start(alone)
    seen = {name: _answer(call) for name, call in _per_stream_calls(cluster3, alone).items()}
    assert all(answer.startswith("UNAVAILABLE ") for answer in seen.values()), seen
    for i in (1, 2, 3):
        if i != alone:
            cluster3.start(i)
    calls = _per_stream_calls(cluster3, alone)
    answers: list[str] = []

    def all_succeed() -> bool:
        answers.extend(_answer(call) for call in calls.values())
        return set(answers[-len(calls):]) == {"OK"}

    cluster3.wait_until(all_succeed, recover_timeout_s, what="every call served after the heal")
    assert not [a for a in answers if a.startswith("NOT_FOUND")], answers


def test_a_caught_up_cluster_still_answers_not_found(cluster3: LocalCluster) -> None:
    _create_stream_and_consumer(cluster3, count=0)
    for i in (1, 2, 3):
        with pytest.raises(grpc.RpcError) as info:
            cluster3.streams(i).GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="absent"),
                                              timeout=call_timeout_s)
        assert _reason(info.value) == Reason.STREAM_NOT_FOUND.name
        with pytest.raises(grpc.RpcError) as info:
            cluster3.consumers(i).Fetch(consumers_pb2.FetchRequest(
                stream=STREAM, consumer="absent", batch=1), timeout=call_timeout_s)
        assert _reason(info.value) == Reason.CONSUMER_NOT_FOUND.name
        with pytest.raises(grpc.RpcError) as info:
            cluster3.consumers(i).Ack(consumers_pb2.AckRequest(
                stream="absent", consumer=CONSUMER, seqs=[1]), timeout=call_timeout_s)
        assert _reason(info.value) == Reason.STREAM_NOT_FOUND.name


def _fetch(cluster: LocalCluster, i: int, *, batch: int, max_wait_ms: int) -> list[int]:
    reply = cluster.consumers(i).Fetch(consumers_pb2.FetchRequest(
        stream=STREAM, consumer=CONSUMER, batch=batch, max_wait_ms=max_wait_ms),
        timeout=call_timeout_s + max_wait_ms / 1000)
    return [m.seq for m in reply.messages]


def _ack(cluster: LocalCluster, i: int, seqs: list[int],
         retried: list[str] | None = None) -> consumers_pb2.AckResponse:
    """Acks, retrying while the node answers UNAVAILABLE (right after a failover the new
    primary may still be loading the consumer: CATCHING_UP), as a client would. Each retried
    answer goes into `retried`: an UNAVAILABLE whose outcome was unknown (e.g. the Raft leader
    changed during the commit) may have applied the acks, and then the retry applies none."""
    deadline = time.monotonic() + failover_timeout_s
    while True:
        try:
            reply: consumers_pb2.AckResponse = cluster.consumers(i).Ack(
                consumers_pb2.AckRequest(stream=STREAM, consumer=CONSUMER, seqs=seqs),
                timeout=call_timeout_s)
            return reply
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            if retried is not None:
                retried.append(err.details() or "")
            time.sleep(0.05)


def test_acks_of_what_a_killed_primary_delivered_are_accepted_per_seq(
        cluster3: LocalCluster) -> None:
    _create_stream_and_consumer(cluster3, count=messages)
    old = _primary(cluster3, among=[1, 2, 3])
    assert _fetch(cluster3, old, batch=messages, max_wait_ms=0) == list(range(1, messages + 1))
    cluster3.kill9(old)  # its deliveries were never saved: only acks save
    survivors = [i for i in (1, 2, 3) if i != old]
    through = survivors[0]

    def served_elsewhere() -> bool:
        try:
            info = cluster3.streams(through).GetStreamInfo(
                streams_pb2.GetStreamInfoRequest(name=STREAM), timeout=probe_timeout_s)
        except grpc.RpcError:
            return False
        return info.state.commit_seq >= messages and _primary(cluster3, among=survivors) != old

    cluster3.wait_until(served_elsewhere, failover_timeout_s, what="a new primary serving")
    retried: list[str] = []
    acked = _ack(cluster3, through, list(range(1, messages + 1)), retried)
    refused = {r.seq: r.error.reason for r in acked.results if r.HasField("error")}
    # After an UNAVAILABLE that may have applied them, the retry finds them acked (the ack
    # floor below shows every one took effect).
    assert refused == {} and (acked.applied == messages or retried), (acked, retried)
    assert [r.seq for r in acked.results] == list(range(1, messages + 1))
    # Nothing comes back, not even after an ack wait (the old deliveries are done).
    assert _fetch(cluster3, through, batch=messages, max_wait_ms=2 * ack_wait_ms) == []
    info = cluster3.consumers(survivors[1]).GetConsumerInfo(consumers_pb2.GetConsumerInfoRequest(
        stream=STREAM, consumer=CONSUMER), timeout=call_timeout_s)
    assert (info.state.ack_floor, info.state.num_ack_pending) == (messages, 0)

    cluster3.streams(through).Publish(streams_pb2.PublishRequest(
        stream=STREAM, subject=f"{STREAM}.a", payload=b"late"), timeout=call_timeout_s)
    assert _fetch(cluster3, through, batch=10, max_wait_ms=2_000) == [messages + 1]
    mixed = _ack(cluster3, through, [messages + 1, messages + 100, 2])
    assert [(r.seq, r.error.reason) for r in mixed.results] == [
        (messages + 1, ""), (messages + 100, Reason.NOT_DELIVERED.name), (2, "")]
    assert mixed.applied == 1
    assert _fetch(cluster3, through, batch=10, max_wait_ms=2 * ack_wait_ms) == []


def test_acks_fetches_carry_through_any_node_are_saved_and_survive_kill9_of_the_primary(
        cluster3: LocalCluster) -> None:
    """Fetches through a node that is not the primary (forwarded), each carrying the acks of
    the batch before it, then one Ack call: once it returns, every carried ack is saved too,
    and the primary's kill -9 changes none of it."""
    _create_stream_and_consumer(cluster3, count=messages)
    primary = _primary(cluster3, among=[1, 2, 3])
    through = next(i for i in (1, 2, 3) if i != primary)
    carried: list[int] = []
    fetched: list[int] = []
    while True:
        reply = cluster3.consumers(through).Fetch(consumers_pb2.FetchRequest(
            stream=STREAM, consumer=CONSUMER, batch=7, ack_seqs=carried),
            timeout=call_timeout_s)
        assert [r.seq for r in reply.acks.results] == carried
        assert not any(r.HasField("error") for r in reply.acks.results)
        assert reply.acks.applied == len(carried)
        carried = [m.seq for m in reply.messages]
        if not carried:
            break
        fetched += carried
    assert fetched == list(range(1, messages + 1))
    # The last fetch carried the last batch's acks and brought nothing: one Ack call of any
    # seq acked already returns once a save covers everything before it.
    assert _ack(cluster3, through, [messages]).applied == 0
    cluster3.kill9(primary)
    survivors = [i for i in (1, 2, 3) if i != primary]

    def floor_elsewhere() -> bool:
        if _primary(cluster3, among=survivors) == primary:
            return False
        try:
            info = cluster3.consumers(survivors[0]).GetConsumerInfo(
                consumers_pb2.GetConsumerInfoRequest(stream=STREAM, consumer=CONSUMER),
                timeout=probe_timeout_s)
        except grpc.RpcError:
            return False
        return (info.state.ack_floor, info.state.num_ack_pending) == (messages, 0)

    cluster3.wait_until(floor_elsewhere, failover_timeout_s,
                        what="a new primary with every carried ack")
    handed_out: list[list[int]] = []

    def fetched_after_an_ack_wait() -> bool:  # the new primary may still be taking its lease
        try:
            handed_out.append(_fetch(cluster3, survivors[1], batch=messages,
                                     max_wait_ms=2 * ack_wait_ms))
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return True

    cluster3.wait_until(fetched_after_an_ack_wait, failover_timeout_s, what="a fetch answered")
    assert handed_out == [[]]  # nothing comes back, not even after an ack wait
