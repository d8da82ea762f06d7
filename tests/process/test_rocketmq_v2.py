"""RocketMQ v2 (apache.rocketmq.v2.MessagingService) with the REAL rocketmq-python-client 5.1.2
(PyPI) on a real 3-process cluster (one cluster for the module; docs/rocketmq.md):

- its Producer sends normal messages with tag, key and a user property through one node, and
  the sends spread over the topic's queues (partitions);
- its SimpleConsumer, through another node, receives every message with those properties and
  acks it (raftlog's group offsets then show nothing pending); a message left unacked comes
  back after its invisible duration (not before) with delivery attempt 2, and one whose
  invisible duration was changed with ChangeInvisibleDuration comes back only after the new
  duration;
- FIFO messages keep their order within each message group (a FIFO group: max_ack_pending 1);
  a message past its group's attempts moves to %DLQ%<group>; a delayed message arrives only
  once due; transactional sends are committed, rolled back, or (left open) put to the
  producer's checker, which commits them;
- a delayed message recalled with the producer's recall_message never arrives, and a second
  recall is refused;
- bad input (unknown topic, no message id, a forged receipt handle, a SQL filter) gets its v2
  status code, and QueryRoute names every node's client port (raftlog's own stubs);
- a message id sent again through another node (raftlog's own stubs, alone, in a batch, and
  transactional) is stored once and answered with the first send's offset or transaction;
- a pull consumer (raftlog's own stubs) reads a queue by offset with QueryOffset and
  PullMessage and commits its offset with UpdateOffset / GetOffset (the group's ack floor);
- after a kill -9 of a queue's primary no acknowledged send and no ack is lost: a new consumer
  gets exactly the messages that were not acked before the kill.

The client runs in its own process (tests/process/rocketmq_v2_client.py): its generated protos
and raftlog's share the package apache.rocketmq.v2. Nodes are signalled by pid through
LocalCluster, which stops them all afterwards.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from raftlog.base import topics
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.compat import rocketmq_v2_definition_pb2 as rmq
from raftlog.compat import rocketmq_v2_service_pb2 as svc
from raftlog.compat import rocketmq_v2_service_pb2_grpc as svc_grpc
from raftlog.v1 import cluster_pb2, consumers_pb2, topics_pb2, topics_pb2_grpc

# Looked up, never imported here: its protos would clash with raftlog's in this process.
if importlib.util.find_spec("rocketmq") is None:
    pytest.skip("rocketmq-python-client (a dev dependency) is not installed",
                allow_module_level=True)

call_timeout_s = 10.0
client_timeout_s = 60.0
failover_timeout_s = 30.0
DRIVER = Path(__file__).with_name("rocketmq_v2_client.py")
TOPIC = "orders"
T = TypeVar("T")
PARTITIONS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    made = LocalCluster(tmp_path_factory.mktemp("rocketmq") / "cluster", nodes=3)
    try:
        yield made.start_all()
    finally:
        made.stop_all()


def api(cluster: LocalCluster, i: int) -> Any:
    return topics_pb2_grpc.TopicsStub(cluster.channel(i))  # type: ignore[no-untyped-call]


def when_available(call: Callable[[], T], what: str) -> T:
    """`call()`, again while it answers UNAVAILABLE (a new partition whose primary has not yet
    heard from its replicas, a lease lapsed on a loaded machine), bounded."""
    results: list[T] = []

    def done() -> bool:
        try:
            results.append(call())
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return True

    wait_until(done, failover_timeout_s, interval_s=0.1, what=what)
    return results[0]


def make_topic(cluster: LocalCluster, name: str, partitions: int = PARTITIONS) -> None:
    """The topic (creating is repeatable), each partition writable (one warm-up message)."""
    when_available(lambda: api(cluster, 1).CreateTopic(topics_pb2.CreateTopicRequest(
        name=name, partitions=partitions), timeout=call_timeout_s), f"topic {name} created")
    for i in range(partitions):
        when_available(lambda i=i: api(cluster, 2).PublishToTopic(
            topics_pb2.PublishToTopicRequest(topic=name, partition=i, payload=b"warm-up"),
            timeout=call_timeout_s), f"partition {i} of {name} writable")


def drain_warm_up(cluster: LocalCluster, name: str, group: str, partitions: int = PARTITIONS,
                  **config: Any) -> None:
    """Acks the warm-up messages for `group` through raftlog.v1 (the group is RocketMQ's; a
    RocketMQ consumer would otherwise receive them first)."""
    info = when_available(lambda: api(cluster, 1).CreateTopicGroup(
        topics_pb2.CreateTopicGroupRequest(topic=name, config=consumers_pb2.ConsumerConfig(
            name=group, ack_wait_ms=2_000, **config)), timeout=call_timeout_s),
        f"group {group}")
    assert len(info.consumers) == partitions
    when_available(lambda: api(cluster, 1).SetTopicOffsets(topics_pb2.SetTopicOffsetsRequest(
        topic=name, group=group, offsets=[topics_pb2.PartitionFloor(partition=i, ack_floor=1)
                                          for i in range(partitions)]), timeout=call_timeout_s),
        f"group {group} past the warm-up")


def offsets(cluster: LocalCluster, i: int, name: str, group: str) -> Any:
    return when_available(lambda: api(cluster, i).GetTopicOffsets(
        topics_pb2.GetTopicOffsetsRequest(topic=name, group=group), timeout=call_timeout_s),
        f"offsets of {group}")


def client(*args: str, timeout_s: float = client_timeout_s) -> Any:
    done = subprocess.run([sys.executable, str(DRIVER), *args], capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def consume(cluster: LocalCluster, i: int, topic: str, group: str, **plan: Any) -> Any:
    plan = {"invisible_s": 2, "leave_unacked": 0, "change_invisible_s": 0, "timeout_s": 30,
            **plan}
    return client("consume", cluster.address(i), topic, group, json.dumps(plan),
                  timeout_s=max(client_timeout_s, plan["timeout_s"] + 10))


def test_a_producer_and_simple_consumer_send_receive_and_ack(cluster: LocalCluster) -> None:
    make_topic(cluster, TOPIC)
    drain_warm_up(cluster, TOPIC, "billing")
    sent = client("produce", cluster.address(1), TOPIC, "20", "m")
    assert [s["body"] for s in sent] == [f"m-{i}" for i in range(20)]
    assert len({s["message_id"] for s in sent}) == 20
    # Per queue, less the warm-up message: the sends spread over every queue.
    per_queue = [p.last_seq - 1 for p in offsets(cluster, 3, TOPIC, "billing").partitions]
    assert sum(per_queue) == 20 and all(n > 0 for n in per_queue), per_queue

    got = consume(cluster, 2, TOPIC, "billing", expect=20, invisible_s=3, leave_unacked=2,
                  change_invisible_s=6, timeout_s=50)
    by_id = {m["message_id"]: m for m in got["acked"]}
    assert sorted(by_id) == sorted(s["message_id"] for s in sent), got["errors"]
    for s in sent:
        m = by_id[s["message_id"]]
        index = int(s["body"].split("-")[1])
        assert m["body"] == s["body"]
        assert m["tag"] == ("even" if index % 2 == 0 else "odd")
        assert m["keys"] == [f"key-{index}"] and m["properties"] == {"index": str(index)}

    # The two left unacked came back once, with attempt 2: the plain one after its invisible
    # duration (3 s), the changed one only after its new duration (6 s).
    assert len(got["left"]) == 2 and got["changed"] in got["left"]
    for message_id in got["left"]:
        seen = [m for m in got["seen"] if m["message_id"] == message_id]
        assert [m["attempt"] for m in seen] == [1, 2]
        gap = seen[1]["at"] - seen[0]["at"]
        wanted = 6 if message_id == got["changed"] else 3
        assert gap >= wanted - 0.3, (message_id, gap)  # not before (and it did come back)
        assert by_id[message_id]["attempt"] == 2
    # Any other message seen twice came back only after its invisible duration (an ack that
    # a loaded machine delayed past it).
    for message_id, record in by_id.items():
        times = [m["at"] for m in got["seen"] if m["message_id"] == message_id]
        assert all(b - a >= 3 - 0.3 for a, b in itertools.pairwise(times)), (record, times)

    after = offsets(cluster, 1, TOPIC, "billing")
    assert [(p.ack_floor, p.num_ack_pending) for p in after.partitions] == \
        [(p.last_seq, 0) for p in after.partitions]


def test_a_receive_finds_a_message_on_any_queue_of_a_quiet_topic(cluster: LocalCluster) -> None:
    """The client picks a queue at random for every receive; on a topic of 3 queues with one
    message at a time, the next receive gets it whichever queue it picked, without waiting out
    its long poll on an empty one (each receive would come back empty 2 times in 3)."""
    topic = "quiet-orders"
    make_topic(cluster, topic)
    drain_warm_up(cluster, topic, "audit")
    done = client("rounds", cluster.address(2), topic, "audit", "6", "5")
    assert [r["bodies"] for r in done] == [[f"r-{i}"] for i in range(6)], done
    assert all(r["took_s"] < 4 for r in done), done  # not a whole 5 s poll


def test_fifo_messages_keep_their_order_within_each_message_group(
        cluster: LocalCluster) -> None:
    """A message group hashes to one queue; a FIFO group (a raftlog group with
    max_ack_pending 1) gets each queue's next message only once the last one is acked."""
    topic = "fifo-orders"
    make_topic(cluster, topic)
    drain_warm_up(cluster, topic, "shipping", max_ack_pending=1)
    groups = ["g1", "green", "red"]  # hashed to queues 0, 1 and 2
    sent = client("produce", cluster.address(2), topic, "12", "f", ",".join(groups))
    assert len(sent) == 12
    # The client picks a queue at random for each receive, and the server serves the receive
    # from any queue with a message to hand out (docs/rocketmq.md). Served by the picked queue
    # alone, each receive of a drained queue waited out its long poll (2 s): the test took
    # 9-31 s on an idle machine and once ran out of 50 s in CI on a slow one. The bound stays
    # generous; a passing run ends at its 12th ack.
    got = consume(cluster, 3, topic, "shipping", expect=12, leave_unacked=1, invisible_s=2,
                  timeout_s=120)
    assert len(got["acked"]) == 12, (got["errors"], [
        (m["body"], m["attempt"], m["at"]) for m in got["seen"]])
    for group in groups:
        wanted = [s["body"] for k, s in enumerate(sent) if groups[k % 3] == group]
        # Every delivery of the group's messages, in the order they were received: the one
        # left unacked came back before anything after it in its queue.
        seen = [m["body"] for m in got["seen"] if m["group"] == group]
        assert [body for k, body in enumerate(seen) if body not in seen[:k]] == wanted, seen
    # Each message group went to the queue its name hashes to (4 sends each).
    per_queue = [p.last_seq - 1 for p in offsets(cluster, 1, topic, "shipping").partitions]
    expected = [0] * PARTITIONS
    for group in groups:
        expected[topics.hash_partition(group.encode(), PARTITIONS)] += 4
    assert per_queue == expected


def test_messages_past_their_attempts_move_to_the_dead_letter_topic(
        cluster: LocalCluster) -> None:
    """A group with max_deliver 3 allows 2 attempts: the third receive finds the message moved
    to %DLQ%<group> (its id kept), from where another group receives it. (One queue, so that
    every receive polls the message's queue.)"""
    topic = "risky"
    make_topic(cluster, topic, partitions=1)
    drain_warm_up(cluster, topic, "fragile", partitions=1, max_deliver=3)
    (sent,) = client("produce", cluster.address(1), topic, "1", "doomed")
    tried = consume(cluster, 2, topic, "fragile", expect=1, never_ack=True, invisible_s=1,
                    timeout_s=8)
    # Attempts 1 and 2, never a third (a receive the loaded client gave up on may have taken
    # attempt 2 unseen).
    attempts = [m["attempt"] for m in tried["seen"]]
    assert attempts in ([1, 2], [1]), tried
    dead = consume(cluster, 3, "%DLQ%fragile", "inspect", expect=1)
    assert [(m["message_id"], m["body"]) for m in dead["acked"]] == [
        (sent["message_id"], "doomed-0")], dead
    after = offsets(cluster, 1, topic, "fragile")
    assert [(p.ack_floor, p.num_ack_pending) for p in after.partitions] == \
        [(p.last_seq, 0) for p in after.partitions]


def test_a_push_consumer_retries_with_the_group_back_off_then_dead_letters(
        cluster: LocalCluster) -> None:
    """The real PushConsumer (QueryAssignment, receive, ack; ChangeInvisibleDuration by the
    back-off the server's settings give it): a group with max_deliver 3 and backoff 1 s
    consumes the good messages once; the failing one is tried twice, then moves to
    %DLQ%<group>."""
    topic = "pushed"
    make_topic(cluster, topic)
    drain_warm_up(cluster, topic, "workers", max_deliver=3, backoff_ms=[1000])
    sent = client("produce", cluster.address(1), topic, "4", "ok")
    (bad,) = client("produce", cluster.address(2), topic, "1", "bad")
    # Until the 4 good ones are consumed and the bad one was tried twice, then 5 s more, in
    # which a third attempt (the back-off is 1 s) would show; 30 s at most.
    seen = client("push", cluster.address(3), topic, "workers", "30", "4", "2", "5")
    good = sorted(m["message_id"] for m in seen if m["body"].startswith("ok"))
    assert good == sorted(s["message_id"] for s in sent), seen
    assert [m["attempt"] for m in seen if m["body"] == "bad-0"] == [1, 2], seen
    dead = consume(cluster, 1, "%DLQ%workers", "inspect", expect=1)
    assert [m["message_id"] for m in dead["acked"]] == [bad["message_id"]]


def test_a_delayed_message_is_received_only_once_it_is_due(cluster: LocalCluster) -> None:
    topic = "reminders"
    make_topic(cluster, topic)
    drain_warm_up(cluster, topic, "nudges")
    sent = client("delayed", cluster.address(1), topic, "4000")
    got = consume(cluster, 2, topic, "nudges", expect=1, timeout_s=30)
    (received,) = got["acked"]
    assert received["message_id"] == sent["message_id"] and received["body"] == "later"
    assert received["wall_ms"] >= sent["sent_ms"] + 4000 - 50, (received, sent)
    assert [m["message_id"] for m in got["seen"]] == [sent["message_id"]]


def test_transactional_messages_commit_roll_back_and_are_recovered(
        cluster: LocalCluster) -> None:
    """A committed send is received, a rolled back one never; one left open is put to the
    producer's checker through the Telemetry stream, which commits it."""
    topic = "ledger-txn"
    make_topic(cluster, topic)
    drain_warm_up(cluster, topic, "books")
    outcome = client("transactional", cluster.address(3), topic, "40")
    assert "orphan" in outcome["asked"], outcome
    got = consume(cluster, 1, topic, "books", expect=2, timeout_s=30)
    assert sorted((m["body"], m["message_id"]) for m in got["acked"]) == [
        ("commit", outcome["ids"]["commit"]), ("orphan", outcome["ids"]["orphan"])], got
    late = consume(cluster, 2, topic, "books", expect=1, timeout_s=4)
    assert late["seen"] == []  # the rolled back one never comes


def test_a_batch_send_keeps_group_order_and_a_batch_ack_settles_every_queue(
        cluster: LocalCluster) -> None:
    """raftlog's own stubs: one SendMessage of 9 messages (3 FIFO ones of a group among
    normal ones) is stored with the group's messages in order; one AckMessage of handles from
    several queues settles them all; a forged handle among them is refused alone."""
    topic = "batched"
    make_topic(cluster, topic)
    drain_warm_up(cluster, topic, "sweep")
    stub = svc_grpc.MessagingServiceStub(grpc.insecure_channel(cluster.address(1)))  # type: ignore[no-untyped-call]
    resource = rmq.Resource(name=topic)

    def message(k: int) -> rmq.Message:
        props = rmq.SystemProperties(message_id=f"batch-{k}", message_type=rmq.NORMAL)
        if k % 3 == 0:
            props.message_type, props.message_group = rmq.FIFO, "g1"
        return rmq.Message(topic=resource, body=b"b%d" % k, system_properties=props)
    sent = stub.SendMessage(svc.SendMessageRequest(messages=[message(k) for k in range(9)]),
                            timeout=call_timeout_s)
    assert sent.status.code == rmq.OK and len(sent.entries) == 9, sent
    assert [e.message_id for e in sent.entries] == [f"batch-{k}" for k in range(9)]
    fifo = [e.offset for k, e in enumerate(sent.entries) if k % 3 == 0]
    assert fifo == sorted(fifo) and len(set(fifo)) == 3  # one queue, in send order
    route = stub.QueryRoute(svc.QueryRouteRequest(topic=resource), timeout=call_timeout_s)
    handles: list[tuple[str, str]] = []
    for queue in route.message_queues:
        answers = list(stub.ReceiveMessage(svc.ReceiveMessageRequest(
            group=rmq.Resource(name="sweep"), message_queue=queue, batch_size=32,
            filter_expression=rmq.FilterExpression(type=rmq.TAG, expression="*"),
            long_polling_timeout={"nanos": 300_000_000}), timeout=call_timeout_s))
        handles += [(a.message.system_properties.message_id,
                     a.message.system_properties.receipt_handle)
                    for a in answers if a.WhichOneof("content") == "message"]
    assert sorted(m for m, _ in handles) == sorted(f"batch-{k}" for k in range(9))
    acked = stub.AckMessage(svc.AckMessageRequest(
        group=rmq.Resource(name="sweep"), topic=resource,
        entries=[svc.AckMessageEntry(message_id=m, receipt_handle=h) for m, h in handles]
        + [svc.AckMessageEntry(message_id="x", receipt_handle="0.999.1")]),
        timeout=call_timeout_s)
    assert acked.status.code == rmq.MULTIPLE_RESULTS, acked.status
    assert [e.status.code for e in acked.entries] == [rmq.OK] * 9 + [rmq.INVALID_RECEIPT_HANDLE]
    after = offsets(cluster, 2, topic, "sweep")
    assert [(p.ack_floor, p.num_ack_pending) for p in after.partitions] == \
        [(p.last_seq, 0) for p in after.partitions]


def test_bad_input_gets_the_v2_status_codes(cluster: LocalCluster) -> None:
    """raftlog's own stubs of the restated protocol (not the client's)."""
    stub = svc_grpc.MessagingServiceStub(grpc.insecure_channel(cluster.address(2)))  # type: ignore[no-untyped-call]
    orders = rmq.Resource(name=TOPIC)
    route = stub.QueryRoute(svc.QueryRouteRequest(topic=rmq.Resource(name="nope")),
                            timeout=call_timeout_s)
    assert route.status.code == rmq.TOPIC_NOT_FOUND, route.status
    route = stub.QueryRoute(svc.QueryRouteRequest(topic=orders), timeout=call_timeout_s)
    # Every queue is queue 0 of a broker of its own, `<node>#q<partition>` (the Node.js client
    # takes only queues whose id is 0).
    assert route.status.code == rmq.OK and [q.id for q in route.message_queues] == [0, 0, 0]
    assert [q.broker.name.rpartition("#q")[2] for q in route.message_queues] == ["0", "1", "2"]
    assert {q.broker.endpoints.addresses[0].port for q in route.message_queues} == {
        int(cluster.address(i).rsplit(":", 1)[1]) for i in (1, 2, 3)}
    sent = stub.SendMessage(svc.SendMessageRequest(messages=[rmq.Message(
        topic=orders, body=b"x", system_properties=rmq.SystemProperties(
            message_type=rmq.NORMAL))]), timeout=call_timeout_s)
    assert sent.status.code == rmq.ILLEGAL_MESSAGE_ID, sent.status
    acked = stub.AckMessage(svc.AckMessageRequest(
        group=rmq.Resource(name="billing"), topic=orders,
        entries=[svc.AckMessageEntry(message_id="m", receipt_handle="forged")]),
        timeout=call_timeout_s)
    assert acked.status.code == rmq.INVALID_RECEIPT_HANDLE, acked.status
    queue = route.message_queues[0]
    answers = list(stub.ReceiveMessage(svc.ReceiveMessageRequest(
        group=rmq.Resource(name="billing"), message_queue=queue, batch_size=1,
        filter_expression=rmq.FilterExpression(type=rmq.SQL, expression="a > 1")),
        timeout=call_timeout_s))
    assert [a.status.code for a in answers] == [rmq.ILLEGAL_FILTER_EXPRESSION]
    answers = list(stub.ReceiveMessage(svc.ReceiveMessageRequest(
        group=rmq.Resource(name="billing"), message_queue=queue, batch_size=1,
        long_polling_timeout={"nanos": 200_000_000}), timeout=call_timeout_s))
    assert [a.status.code for a in answers] == [rmq.MESSAGE_NOT_FOUND]  # all acked before


def test_a_recalled_delayed_message_is_never_delivered(cluster: LocalCluster) -> None:
    """The real producer's recall_message withdraws a delayed message (raftlog's
    CancelScheduled): nothing arrives once it was due, and a second recall is refused with
    NOT_FOUND."""
    topic = "recalls"
    make_topic(cluster, topic)
    drain_warm_up(cluster, topic, "undo")
    out = client("recall", cluster.address(1), topic, "5000")
    first, second = out["answers"]
    assert out["recall_handle"] and first == {"message_id": out["message_id"]}, out
    assert second["error"] == "NotFoundException", out
    assert second["text"].startswith(f"{rmq.NOT_FOUND},"), out
    # Until a second past the time it was due, no consumer receives it.
    wait_s = max(out["due_ms"] / 1000 - time.time(), 0) + 1
    got = consume(cluster, 2, topic, "undo", expect=1, never_ack=True, timeout_s=wait_s)
    assert got["seen"] == [], got
    assert [p.last_seq for p in offsets(cluster, 3, topic, "undo").partitions] == \
        [1] * PARTITIONS  # the warm-up messages only


def test_a_message_id_sent_again_through_another_node_is_stored_once(
        cluster: LocalCluster) -> None:
    """raftlog's own stubs (the real client never repeats an id): a NORMAL message's id picks
    its queue, so the same id sent again through another node, alone or in a batch, reaches
    the queue of the first send and is answered with its offset; a transactional send sent
    again answers the first one's transaction."""
    topic = "retried"
    make_topic(cluster, topic)
    resource = rmq.Resource(name=topic)
    stubs = {i: svc_grpc.MessagingServiceStub(grpc.insecure_channel(cluster.address(i)))  # type: ignore[no-untyped-call]
             for i in (1, 2, 3)}

    def message(message_id: str, kind: int = rmq.NORMAL) -> rmq.Message:
        return rmq.Message(topic=resource, body=message_id.encode(),
                           system_properties=rmq.SystemProperties(message_id=message_id,
                                                                  message_type=kind))

    def sent(i: int, *messages: rmq.Message) -> list[svc.SendResultEntry]:
        answer = when_available(lambda: stubs[i].SendMessage(svc.SendMessageRequest(
            messages=messages), timeout=call_timeout_s), "a send")
        assert answer.status.code == rmq.OK, answer.status
        assert [e.status.code for e in answer.entries] == [rmq.OK] * len(messages)
        return list(answer.entries)

    ids = [f"dup-{n}" for n in range(6)]
    first = {e.message_id: e.offset for i in ids for e in sent(1, message(i))}
    again = {e.message_id: e.offset for i in ids for e in sent(2, message(i))}
    batch = {e.message_id: e.offset for e in sent(3, *(message(i) for i in ids))}
    assert again == first and batch == first  # the first send's offsets
    info = when_available(lambda: api(cluster, 3).GetTopic(topics_pb2.GetTopicRequest(
        name=topic), timeout=call_timeout_s), "the topic")
    expected = [1] * PARTITIONS  # the warm-up messages
    for message_id in ids:
        expected[topics.hash_partition(message_id.encode(), PARTITIONS)] += 1
    assert [p.info.state.last_seq for p in info.partition_infos] == expected

    (prepared,) = sent(1, message("txn-dup", rmq.TRANSACTION))
    (retried,) = sent(3, message("txn-dup", rmq.TRANSACTION))
    assert prepared.transaction_id and retried.transaction_id == prepared.transaction_id
    ended = stubs[2].EndTransaction(svc.EndTransactionRequest(
        topic=resource, message_id="txn-dup", transaction_id=prepared.transaction_id,
        resolution=rmq.ROLLBACK), timeout=call_timeout_s)
    assert ended.status.code == rmq.OK, ended.status


def pull(stub: Any, queue: rmq.MessageQueue, offset: int, *, tags: str = "*",
         wait_ms: int = 300) -> tuple[list[rmq.Message], int, int]:
    """One PullMessage of group "pullers": its messages, next offset and status code."""
    answers = list(stub.PullMessage(svc.PullMessageRequest(
        group=rmq.Resource(name="pullers"), message_queue=queue, offset=offset, batch_size=2,
        filter_expression=rmq.FilterExpression(type=rmq.TAG, expression=tags),
        long_polling_timeout={"nanos": wait_ms * 1_000_000}), timeout=call_timeout_s))
    kinds = [a.WhichOneof("content") for a in answers]
    assert kinds[-1] == "status", kinds
    messages = [a.message for a in answers if a.WhichOneof("content") == "message"]
    next_offsets = [a.next_offset for a in answers if a.WhichOneof("content") == "next_offset"]
    return messages, (next_offsets or [-1])[0], answers[-1].status.code


def test_a_pull_consumer_reads_by_offset_and_commits_its_offset(cluster: LocalCluster) -> None:
    """raftlog's own stubs: QueryOffset gives a queue's ends and the offset at a time,
    PullMessage reads the queue by offset (tag filtered or not; at the end it long-polls, then
    answers MESSAGE_NOT_FOUND), UpdateOffset commits a group's offset, which GetOffset and
    raftlog's group offsets (ack floor = offset - 1) show; bad offsets and recall handles get
    their codes."""
    topic = "pulled"
    make_topic(cluster, topic, partitions=1)
    stub = svc_grpc.MessagingServiceStub(grpc.insecure_channel(cluster.address(2)))  # type: ignore[no-untyped-call]
    resource = rmq.Resource(name=topic)
    since_ms = int(time.time() * 1000) + 1
    sent = stub.SendMessage(svc.SendMessageRequest(messages=[rmq.Message(
        topic=resource, body=b"p%d" % k, system_properties=rmq.SystemProperties(
            message_id=f"pull-{k}", message_type=rmq.NORMAL, tag=f"t{k % 2}"))
        for k in range(5)]), timeout=call_timeout_s)
    assert sent.status.code == rmq.OK and [e.offset for e in sent.entries] == [2, 3, 4, 5, 6]
    (queue,) = stub.QueryRoute(svc.QueryRouteRequest(topic=resource),
                               timeout=call_timeout_s).message_queues

    def query(policy: int, **at: Any) -> int:
        answer = stub.QueryOffset(svc.QueryOffsetRequest(
            message_queue=queue, query_offset_policy=policy, **at), timeout=call_timeout_s)
        assert answer.status.code == rmq.OK, answer.status
        return int(answer.offset)
    assert query(rmq.BEGINNING) == 1 and query(rmq.END) == 7
    assert query(rmq.TIMESTAMP, timestamp={"seconds": since_ms // 1000,
                                           "nanos": since_ms % 1000 * 1_000_000}) == 2

    bodies, offset, code = [], 0, rmq.OK
    while code == rmq.OK:
        messages, offset, code = pull(stub, queue, offset)
        bodies += [(m.system_properties.queue_offset, m.body) for m in messages]
        assert all(not m.system_properties.receipt_handle for m in messages)
    assert bodies == [(1, b"warm-up")] + [(k + 2, b"p%d" % k) for k in range(5)]
    assert (offset, code) == (7, rmq.MESSAGE_NOT_FOUND)
    started = time.monotonic()
    assert pull(stub, queue, 7, wait_ms=600) == ([], 7, rmq.MESSAGE_NOT_FOUND)
    assert time.monotonic() - started >= 0.5  # it waited at the end
    odd = pull(stub, queue, 3, tags="t1")  # offsets 3 and 4 examined, p2 filtered out
    assert [m.body for m in odd[0]] == [b"p1"] and odd[1:] == (5, rmq.OK)
    assert pull(stub, queue, 99, wait_ms=100)[2] == rmq.ILLEGAL_OFFSET

    group = rmq.Resource(name="pullers")
    got = stub.GetOffset(svc.GetOffsetRequest(group=group, message_queue=queue),
                         timeout=call_timeout_s)
    assert got.status.code == rmq.OFFSET_NOT_FOUND, got.status
    updated = when_available(lambda: stub.UpdateOffset(svc.UpdateOffsetRequest(
        group=group, message_queue=queue, offset=4), timeout=call_timeout_s), "offset set")
    assert updated.status.code == rmq.OK, updated.status
    got = stub.GetOffset(svc.GetOffsetRequest(group=group, message_queue=queue),
                         timeout=call_timeout_s)
    assert (got.status.code, got.offset) == (rmq.OK, 4)
    assert [p.ack_floor for p in offsets(cluster, 1, topic, "pullers").partitions] == [3]
    beyond = stub.UpdateOffset(svc.UpdateOffsetRequest(group=group, message_queue=queue,
                                                       offset=99), timeout=call_timeout_s)
    assert beyond.status.code == rmq.ILLEGAL_OFFSET, beyond.status

    for handle, code in (("forged", rmq.BAD_REQUEST), ("r0.999", rmq.NOT_FOUND)):
        recalled = stub.RecallMessage(svc.RecallMessageRequest(
            topic=resource, recall_handle=handle), timeout=call_timeout_s)
        assert recalled.status.code == code, (handle, recalled.status)


def test_a_killed_queue_primary_loses_nothing_acknowledged(cluster: LocalCluster) -> None:
    topic = "payments"
    make_topic(cluster, topic)
    drain_warm_up(cluster, topic, "ledger")
    stream = topics.partition_stream(topic, 0)
    route = cluster.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(stream=stream),
                                            timeout=call_timeout_s)
    victim = cluster.index_of(route.primary)
    others = [i for i in (1, 2, 3) if i != victim]
    sent = {s["message_id"]: s["body"]
            for s in client("produce", cluster.address(others[0]), topic, "24", "p")}
    assert len(sent) == 24
    # The victim's queue took sends too.
    assert offsets(cluster, others[0], topic, "ledger").partitions[0].last_seq > 1
    before = consume(cluster, others[1], topic, "ledger", expect=10)
    acked_before = {m["message_id"] for m in before["acked"]}
    assert len(acked_before) >= 10

    cluster.kill9(victim)

    def moved() -> bool:
        try:
            now = cluster.cluster(others[0]).ExplainRoute(
                cluster_pb2.ExplainRouteRequest(stream=stream), timeout=call_timeout_s)
        except grpc.RpcError:
            return False
        return bool(now.primary) and now.primary != route.primary

    wait_until(moved, failover_timeout_s, interval_s=0.2, what="queue 0 served by another node")
    rest = len(sent) - len(acked_before)
    after = consume(cluster, others[1], topic, "ledger", expect=rest, timeout_s=40)
    acked_after = {m["message_id"] for m in after["acked"]}
    assert acked_before.isdisjoint(acked_after)  # an ack made before the kill held
    assert acked_before | acked_after == set(sent), after["errors"]
