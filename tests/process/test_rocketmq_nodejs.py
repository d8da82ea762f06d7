"""RocketMQ v2 with the REAL Node.js client (npm rocketmq-client-nodejs 1.0.8, which
scripts/env.sh installs into .cache/nodejs when node and npm are on PATH) on a real 3-process
cluster, one for the module (docs/rocketmq.md):

- its Producer sends normal messages with tag, keys and a user property through one node; its
  SimpleConsumer, through another node, receives every one with those properties and acks it,
  after which raftlog's group offsets show nothing pending or unacknowledged; a message left
  unacked comes back after its invisible duration (not before) with delivery attempt 2, one
  whose invisible duration was changed only after the new duration;
- FIFO: messages of three message groups sent to a FIFO group's queue (made with
  max_ack_pending 1) come in order within each group; nothing after an unacked message of a
  group comes before its redelivery;
- across clients: what the Node producer sends the Python client (rocketmq-python-client)
  receives, and what the Python producer sends the Node consumer receives, properties included;
- every queue: messages published to each partition of a 3-partition topic are all received;
- a delayed message is received only once due; of transactional sends the committed one is
  received, the rolled back one never, and the one left open is put to the producer's checker
  (the server asks over the Telemetry stream), which commits it;
- a message left unacked past its group's attempts (max_deliver 3: two) moves to
  `%DLQ%<group>`, where another Node consumer receives it with its original message id;
- after a kill -9 of a queue's primary between sends and receives, a new Node consumer gets
  exactly the messages not acked before the kill (no send and no ack lost).

rocketmq-client-nodejs 1.0.8 takes only queues whose queue id is 0 (its load balancers compare
the queue id where the other clients compare the broker id); raftlog's routes give every
partition queue id 0 of a broker of its own (docs/rocketmq.md), so it uses every partition.

The client runs in `node tests/process/rocketmq_node_driver.mjs`, one process per scenario,
bounded by a timeout (subprocess kills it by pid when it overruns). Nodes are signalled by pid
through LocalCluster, which stops them all afterwards.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from raftlog.base import topics
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.v1 import cluster_pb2, consumers_pb2, topics_pb2, topics_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / ".cache" / "nodejs"  # where scripts/env.sh installs the client
DRIVER = Path(__file__).with_name("rocketmq_node_driver.mjs")
PYTHON_DRIVER = Path(__file__).with_name("rocketmq_v2_client.py")
PINS = Path(__file__).with_name("nodejs") / "package-lock.json"
INSTALLED = NODE_DIR / ".installed-lock"  # a copy of PINS once `npm ci` succeeded
NODE = shutil.which("node")
if NODE is None:
    pytest.skip("node is not on PATH (rocketmq-client-nodejs needs Node.js >= 16.19)",
                allow_module_level=True)
if not INSTALLED.is_file() or INSTALLED.read_bytes() != PINS.read_bytes():
    pytest.skip(f"rocketmq-client-nodejs is not installed in {NODE_DIR} as {PINS} pins it: "
                "`source scripts/env.sh` installs it (npm); see its output if that failed",
                allow_module_level=True)

call_timeout_s = 10.0
client_timeout_s = 60.0
failover_timeout_s = 30.0
PARTITIONS = 3
T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    made = LocalCluster(tmp_path_factory.mktemp("rocketmq-nodejs") / "cluster", nodes=3)
    try:
        yield made.start_all()
    finally:
        made.stop_all()


def api(cluster: LocalCluster, i: int) -> Any:
    return topics_pb2_grpc.TopicsStub(cluster.channel(i))  # type: ignore[no-untyped-call]


def when_available(call: Callable[[], T], what: str) -> T:
    """`call()`, again while it answers UNAVAILABLE (a new partition's primary not yet leased,
    a primary failing over), bounded."""
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


def make_topic(cluster: LocalCluster, name: str, groups: tuple[str, ...], *,
               partitions: int = PARTITIONS, fifo: bool = False, max_deliver: int = 0) -> None:
    """The topic, each partition writable (one warm-up message), and `groups` already past
    the warm-up messages (made through raftlog.v1; RocketMQ's receive would make them too),
    FIFO groups (one message in flight per queue) when `fifo`, with `max_deliver`."""
    when_available(lambda: api(cluster, 1).CreateTopic(topics_pb2.CreateTopicRequest(
        name=name, partitions=partitions), timeout=call_timeout_s), f"topic {name} created")
    for i in range(partitions):
        when_available(lambda i=i: api(cluster, 2).PublishToTopic(
            topics_pb2.PublishToTopicRequest(topic=name, partition=i, payload=b"warm-up"),
            timeout=call_timeout_s), f"partition {i} of {name} writable")
    for group in groups:
        when_available(lambda group=group: api(cluster, 1).CreateTopicGroup(
            topics_pb2.CreateTopicGroupRequest(topic=name, config=consumers_pb2.ConsumerConfig(
                name=group, ack_wait_ms=2_000, max_ack_pending=1 if fifo else 0,
                max_deliver=max_deliver)),
            timeout=call_timeout_s), f"group {group}")
        when_available(lambda group=group: api(cluster, 1).SetTopicOffsets(
            topics_pb2.SetTopicOffsetsRequest(topic=name, group=group, offsets=[
                topics_pb2.PartitionFloor(partition=i, ack_floor=1)
                for i in range(partitions)]), timeout=call_timeout_s),
            f"group {group} past the warm-up")


def offsets(cluster: LocalCluster, i: int, name: str, group: str) -> Any:
    return when_available(lambda: api(cluster, i).GetTopicOffsets(
        topics_pb2.GetTopicOffsetsRequest(topic=name, group=group), timeout=call_timeout_s),
        f"offsets of {group}")


def node_client(cluster: LocalCluster, i: int, topic: str, group: str,
                *actions: dict[str, Any]) -> list[dict[str, Any]]:
    """Runs the Node.js driver on node `i`'s client port; its events, in order."""
    scenario = {"endpoint": cluster.address(i), "topic": topic, "group": group,
                "actions": list(actions)}
    done = subprocess.run([NODE or "node", str(DRIVER)], input=json.dumps(scenario),
                          capture_output=True, text=True, timeout=client_timeout_s, check=False,
                          env={**os.environ, "RAFTLOG_NODEJS_DIR": str(NODE_DIR)})
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and events and events[-1]["event"] == "done", (
        done.stdout[-2000:], done.stderr[-4000:])
    return events


def send(count: int, prefix: str, kind: str = "normal", **shape: Any) -> dict[str, Any]:
    return {"do": "send", "count": count, "prefix": prefix, "kind": kind, **shape}


def receive(expect: int, **plan: Any) -> dict[str, Any]:
    return {"do": "receive", "expect": expect, "invisible_ms": 3_000, "leave_unacked": 0,
            "change_invisible_ms": 0, "timeout_ms": 30_000, "await_ms": 2_000, **plan}


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == kind]


def python_client(*args: str) -> Any:
    done = subprocess.run([sys.executable, str(PYTHON_DRIVER), *args], capture_output=True,
                          text=True, timeout=client_timeout_s, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_nothing_pending(cluster: LocalCluster, i: int, topic: str, group: str) -> None:
    after = offsets(cluster, i, topic, group)
    assert [(p.ack_floor, p.num_pending, p.num_ack_pending) for p in after.partitions] == \
        [(p.last_seq, 0, 0) for p in after.partitions], after


def test_node_producer_and_simple_consumer_send_receive_and_ack(cluster: LocalCluster) -> None:
    make_topic(cluster, "orders", ("billing",))
    events = node_client(cluster, 1, "orders", "billing", send(12, "m"))
    assert not of(events, "send_failed"), of(events, "send_failed")
    sent = of(events, "sent")
    assert [s["body"] for s in sent] == [f"m-{i}" for i in range(12)]
    assert len({s["message_id"] for s in sent}) == 12
    stored = offsets(cluster, 3, "orders", "billing").partitions
    assert sum(p.last_seq - 1 for p in stored) == 12  # less the warm-up message of each

    events = node_client(cluster, 2, "orders", "billing", receive(
        12, leave_unacked=2, change_invisible_ms=6_000))
    received = of(events, "received")
    acked = {e["message_id"] for e in of(events, "acked")}
    assert acked == {s["message_id"] for s in sent}, of(events, "receive_failed")
    for s in sent:
        index = int(s["body"].split("-")[1])
        first = next(r for r in received if r["message_id"] == s["message_id"])
        assert first["body"] == s["body"] and first["attempt"] == 1
        assert first["tag"] == ("even" if index % 2 == 0 else "odd")
        assert first["keys"] == [f"key-{index}"] and first["properties"] == {"index": str(index)}

    # The two left unacked came back once, with attempt 2: the plain one after its invisible
    # duration (3 s), the changed one only after its new duration (6 s).
    left = [e["message_id"] for e in of(events, "left")]
    changed = [e["message_id"] for e in of(events, "changed")]
    assert len(left) == 2 and len(changed) == 1 and changed[0] in left
    for message_id in left:
        seen = [r for r in received if r["message_id"] == message_id]
        assert [r["attempt"] for r in seen] == [1, 2], seen
        wanted_s = 6 if message_id == changed[0] else 3
        assert seen[1]["at"] - seen[0]["at"] >= wanted_s - 0.3, (message_id, seen)
    # Any other message seen twice came back only after its invisible duration (an ack a
    # loaded machine delayed past it).
    for message_id in acked:
        times = [r["at"] for r in received if r["message_id"] == message_id]
        assert all(b - a >= 3 - 0.3 for a, b in itertools.pairwise(times)), (message_id, times)
    assert_nothing_pending(cluster, 1, "orders", "billing")


@pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                    reason="rocketmq-python-client (a dev dependency) is not installed")
def test_node_and_python_clients_read_each_others_messages(cluster: LocalCluster) -> None:
    make_topic(cluster, "mixed", ("js-reader", "py-reader"))
    from_python = python_client("produce", cluster.address(3), "mixed", "4", "py")
    events = node_client(cluster, 1, "mixed", "js-reader", send(4, "js"))
    from_node = [{"message_id": s["message_id"], "body": s["body"]} for s in of(events, "sent")]
    assert len(from_python) == len(from_node) == 4
    every = {s["message_id"]: s["body"] for s in from_python + from_node}

    def check(message_id: str, body: str, tag: str, keys: list[str], properties: Any) -> None:
        assert body == every[message_id]
        index = int(body.split("-")[1])
        assert tag == ("even" if index % 2 == 0 else "odd")
        assert keys == [f"key-{index}"] and properties == {"index": str(index)}

    events = node_client(cluster, 2, "mixed", "js-reader", receive(8))
    by_node = {e["message_id"]: e for e in of(events, "received")}
    assert {e["message_id"] for e in of(events, "acked")} == set(every), events[-5:]
    for message_id, r in by_node.items():
        check(message_id, r["body"], r["tag"], r["keys"], r["properties"])

    got = python_client("consume", cluster.address(1), "mixed", "py-reader", json.dumps({
        "expect": 8, "invisible_s": 3, "leave_unacked": 0, "change_invisible_s": 0,
        "timeout_s": 30}))
    by_python = {m["message_id"]: m for m in got["acked"]}
    assert set(by_python) == set(every), got["errors"]
    for message_id, m in by_python.items():
        check(message_id, m["body"], m["tag"], m["keys"], m["properties"])
    assert_nothing_pending(cluster, 3, "mixed", "js-reader")
    assert_nothing_pending(cluster, 3, "mixed", "py-reader")


def test_fifo_messages_keep_their_order_within_each_message_group(cluster: LocalCluster) -> None:
    """Nine messages in three message groups to a FIFO group's queue; the first is left
    unacked once, and nothing after it in its group comes before its redelivery."""
    make_topic(cluster, "sequence", ("in-order",), partitions=1, fifo=True)
    events = node_client(cluster, 1, "sequence", "in-order", send(9, "f", "fifo", groups=3))
    sent = of(events, "sent")
    assert [(s["body"], s["group"]) for s in sent] == [(f"f-{i}", f"g{i % 3}") for i in range(9)], \
        of(events, "send_failed")

    events = node_client(cluster, 2, "sequence", "in-order", receive(9, leave_unacked=1))
    received = of(events, "received")
    assert {e["message_id"] for e in of(events, "acked")} == {s["message_id"] for s in sent}
    by_id = {s["message_id"]: s for s in sent}
    assert all(r["group"] == by_id[r["message_id"]]["group"] for r in received), received
    for group in ("g0", "g1", "g2"):
        order = [r["body"] for r in received if r["group"] == group]
        firsts = list(dict.fromkeys(order))  # each message at its first delivery
        assert firsts == sorted(firsts, key=lambda body: int(body.split("-")[1])), order
    # f-0 (group g0) came back with attempt 2 before f-3, the next of its group, came at all.
    left = [e["message_id"] for e in of(events, "left")]
    assert [by_id[m]["body"] for m in left] == ["f-0"]
    g0 = [(r["body"], r["attempt"]) for r in received if r["group"] == "g0"]
    assert g0[:2] == [("f-0", 1), ("f-0", 2)], g0
    assert_nothing_pending(cluster, 3, "sequence", "in-order")


def test_the_consumer_receives_from_every_partition(cluster: LocalCluster) -> None:
    """Two messages published to each partition through raftlog.v1 (named by msg_id, which is
    the RocketMQ message id): the Node consumer gets all six."""
    make_topic(cluster, "spread", ("everywhere",))
    published = {}
    for i in range(PARTITIONS):
        for k in range(2):
            msg_id = f"spread-p{i}-{k}"
            when_available(lambda i=i, msg_id=msg_id: api(cluster, 3).PublishToTopic(
                topics_pb2.PublishToTopicRequest(topic="spread", partition=i, msg_id=msg_id,
                                                 payload=msg_id.encode()),
                timeout=call_timeout_s), f"{msg_id} published")
            published[msg_id] = i
    events = node_client(cluster, 1, "spread", "everywhere", receive(6))
    acked = {e["message_id"] for e in of(events, "acked")}
    assert acked == set(published), (of(events, "received"), of(events, "receive_failed"))
    assert all(r["body"] == r["message_id"] for r in of(events, "received"))
    assert_nothing_pending(cluster, 2, "spread", "everywhere")


def test_a_delayed_message_is_received_only_once_it_is_due(cluster: LocalCluster) -> None:
    make_topic(cluster, "reminders", ("nudges",))
    events = node_client(cluster, 1, "reminders", "nudges", send(1, "later", "delay",
                                                                 delay_ms=4_000))
    (sent,) = of(events, "sent")
    events = node_client(cluster, 2, "reminders", "nudges", receive(1))
    received = of(events, "received")
    assert [r["message_id"] for r in received] == [sent["message_id"]], events[-5:]
    assert received[0]["body"] == "later-0" and received[0]["attempt"] == 1
    # Both wall clocks are this machine's; the server appends it once due, never before.
    assert received[0]["wall_ms"] >= sent["due_ms"] - 50, (received, sent)
    assert [e["message_id"] for e in of(events, "acked")] == [sent["message_id"]]


def test_transactional_sends_commit_roll_back_and_are_recovered(cluster: LocalCluster) -> None:
    """Three transactional sends: committed, rolled back, left open. The producer stays up
    until the server (every 5 s, for transactions open 5 s) has asked its checker about the
    open one and the checker's COMMIT was sent."""
    make_topic(cluster, "ledger-txn", ("books",))
    events = node_client(cluster, 3, "ledger-txn", "books", send(
        3, "t", "transaction", resolutions=["commit", "rollback", "open"], hold_ms=40_000))
    sent = {s["resolution"]: s for s in of(events, "sent")}
    assert set(sent) == {"commit", "rollback", "open"}, of(events, "send_failed")
    asked = {e["message_id"] for e in of(events, "checked")}
    assert asked == {sent["open"]["message_id"]}, events  # only the open one, and it was
    assert sent["open"]["message_id"] in {e["message_id"] for e in of(events, "check_answered")}

    events = node_client(cluster, 1, "ledger-txn", "books", receive(2))
    assert sorted((e["body"], e["message_id"]) for e in of(events, "received")) == sorted(
        (sent[r]["body"], sent[r]["message_id"]) for r in ("commit", "open")), events[-5:]
    assert len(of(events, "acked")) == 2
    # The rolled back one was never appended: two messages past the warm-up, both acked.
    stored = offsets(cluster, 2, "ledger-txn", "books").partitions
    assert sum(p.last_seq - 1 for p in stored) == 2, stored
    assert_nothing_pending(cluster, 2, "ledger-txn", "books")


def test_a_message_past_its_attempts_moves_to_the_dead_letter_topic(
        cluster: LocalCluster) -> None:
    """max_deliver 3 gives two attempts: the message received and left unacked twice is, on
    the next receive, moved to %DLQ%<group>, where another group receives it with its
    original message id. (One queue, so that every receive polls the message's queue.)"""
    make_topic(cluster, "risky", ("fragile",), partitions=1, max_deliver=3)
    events = node_client(cluster, 1, "risky", "fragile", send(1, "doomed"))
    (sent,) = of(events, "sent")
    events = node_client(cluster, 2, "risky", "fragile", receive(
        1, never_ack=True, invisible_ms=1_000, await_ms=1_000, timeout_ms=8_000))
    # Attempts 1 and 2, never a third (a receive a loaded machine's client gave up on may
    # have taken attempt 2 unseen).
    assert [r["attempt"] for r in of(events, "received")] in ([1, 2], [1]), events
    assert not of(events, "acked")

    events = node_client(cluster, 3, "%DLQ%fragile", "inspect", receive(1))
    assert [(e["message_id"], e["body"]) for e in of(events, "received")] == [
        (sent["message_id"], "doomed-0")], events[-5:]
    assert [e["message_id"] for e in of(events, "acked")] == [sent["message_id"]]
    assert_nothing_pending(cluster, 1, "risky", "fragile")  # ended for the group


def test_a_killed_queue_primary_loses_nothing_acknowledged(cluster: LocalCluster) -> None:
    topic = "payments"
    make_topic(cluster, topic, ("ledger",))
    stream = topics.partition_stream(topic, 0)
    route = cluster.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(stream=stream),
                                            timeout=call_timeout_s)
    victim = cluster.index_of(route.primary)
    others = [i for i in (1, 2, 3) if i != victim]
    events = node_client(cluster, others[0], topic, "ledger", send(16, "p"))
    sent = {s["message_id"] for s in of(events, "sent")}
    assert len(sent) == 16, of(events, "send_failed")
    # The victim's queue took sends too.
    assert offsets(cluster, others[0], topic, "ledger").partitions[0].last_seq > 1
    before = node_client(cluster, others[1], topic, "ledger", receive(6))
    acked_before = {e["message_id"] for e in of(before, "acked")}
    assert len(acked_before) >= 6

    cluster.kill9(victim)

    def moved() -> bool:
        try:
            now = cluster.cluster(others[0]).ExplainRoute(
                cluster_pb2.ExplainRouteRequest(stream=stream), timeout=call_timeout_s)
        except grpc.RpcError:
            return False
        return bool(now.primary) and now.primary != route.primary

    wait_until(moved, failover_timeout_s, interval_s=0.2, what="queue 0 served by another node")
    after = node_client(cluster, others[1], topic, "ledger", receive(
        len(sent) - len(acked_before), timeout_ms=40_000))
    acked_after = {e["message_id"] for e in of(after, "acked")}
    assert acked_before.isdisjoint(acked_after)  # an ack made before the kill held
    assert acked_before | acked_after == sent, of(after, "receive_failed")[:5]
