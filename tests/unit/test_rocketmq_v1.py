"""RocketMQ v1: the retry back-off and dead-letter rules (node/ops/rocketmq_dlq.py), the POP
receive over a topic's queues (node/ops/rocketmq_receive.py, on in-memory twins), delivery
times (node/ops/rocketmq_time.py) and which open transaction a PollCommand asks about
(node/ops/rocketmq_orphans.py, on an in-memory twin of the transaction ops), and the
served proto against the seed's (shared/seeds/000, found through RAFTLOG_SEEDS_DIR or
<repo>/../shared/seeds; only that comparison is skipped without it)."""

from __future__ import annotations

import asyncio
import os
import time
import types
from pathlib import Path
from typing import Any, cast

import pytest
from google.protobuf import descriptor_pb2, timestamp_pb2

from raftlog.base import limits, topics
from raftlog.base.clock import FakeClock, SystemClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.compat import rocketmq_v1_definition_pb2, rocketmq_v1_service_pb2
from raftlog.node.ops import rocketmq, rocketmq_dlq, rocketmq_time
from raftlog.node.ops.rocketmq_orphans import OrphanQuestions
from raftlog.node.ops.rocketmq_receive import ANY_QUEUE, Receive, Receiver
from raftlog.node.transport.calls import Call
from raftlog.v1 import transactions_pb2, types_pb2

ROOT = Path(__file__).resolve().parents[2]
SEED_FILE = "000_c625b1fb64ef6b83.txt"
S, M, H = 1_000, 60_000, 3_600_000


@pytest.mark.parametrize(("attempt", "delay_ms"), [
    (1, 30 * S),  # level 4: the first nack waits 30 s
    (2, 1 * M), (3, 2 * M), (4, 3 * M), (9, 8 * M), (10, 9 * M), (11, 10 * M),
    (12, 20 * M), (13, 30 * M), (14, 1 * H), (15, 2 * H),
    (16, 2 * H), (100, 2 * H),  # past the table: its last level
    (0, 30 * S), (-3, 30 * S),  # no attempt given counts as the first
])
def test_a_nack_waits_the_level_three_past_its_attempt(attempt: int, delay_ms: int) -> None:
    assert rocketmq_dlq.nack_delay_ms(attempt) == delay_ms


def test_the_level_table_is_rocketmqs() -> None:
    assert rocketmq_dlq.DELAY_LEVELS_MS[:4] == (1 * S, 5 * S, 10 * S, 30 * S)
    assert len(rocketmq_dlq.DELAY_LEVELS_MS) == 18
    assert rocketmq_dlq.DELAY_LEVELS_MS[-1] == 2 * H


@pytest.mark.parametrize(("policy", "allowed"), [(0, 16), (-1, 16), (1, 1), (5, 5), (32, 32)])
def test_a_policy_of_zero_attempts_allows_sixteen(policy: int, allowed: int) -> None:
    assert rocketmq_dlq.max_attempts(policy) == allowed


def test_the_dead_letter_topic_is_named_after_the_group() -> None:
    assert rocketmq_dlq.dlq_topic("billing") == "%DLQ%billing"
    assert rocketmq.raftlog_topic(rocketmq_dlq.dlq_topic("billing")) == ".DLQ.billing"
    assert rocketmq_dlq.dlq_msg_id("orders", 2, 7) != rocketmq_dlq.dlq_msg_id("orders", 7, 2)


# ------------------------------------------------------------------ the proto against the seed

def seed_path() -> Path | None:
    for folder in (os.environ.get("RAFTLOG_SEEDS_DIR"), ROOT.parent / "shared" / "seeds"):
        if folder and (Path(folder) / SEED_FILE).is_file():
            return Path(folder) / SEED_FILE
    return None


def seed_proto_text(document: str) -> str:
    """The seed's proto: the document frames each line as `| text |`."""
    lines = []
    for line in document.splitlines():
        inner = line.removeprefix("|").removesuffix("|")
        lines.append(inner.strip() if inner.strip() else "")
    return "\n".join(lines) + "\n"


def compiled_seed(tmp_path: Path) -> descriptor_pb2.FileDescriptorSet:
    """The seed's service.proto with raftlog's restated definition.proto at the path the seed
    imports, compiled (with protoc, in this process) to descriptors."""
    import google.rpc
    from grpc_tools import protoc

    seed = seed_path()
    assert seed is not None
    folder = tmp_path / "apache" / "rocketmq" / "v1"
    folder.mkdir(parents=True)
    (folder / "service.proto").write_text(seed_proto_text(seed.read_text()))
    definition = ROOT / "protos" / "raftlog" / "compat" / "rocketmq_v1_definition.proto"
    (folder / "definition.proto").write_text(definition.read_text())
    googleapis = Path(google.rpc.__path__[0]).parents[1]
    well_known = Path(protoc.__file__).parent / "_proto"
    out = tmp_path / "seed.pb"
    status = protoc.main(["protoc", f"-I{tmp_path}", f"-I{googleapis}", f"-I{well_known}",
                          f"--descriptor_set_out={out}", "apache/rocketmq/v1/service.proto"])
    assert status == 0
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def test_the_served_service_is_the_seeds(tmp_path: Path) -> None:
    """Same package, service, methods (names, types, streaming) and messages (fields with
    their numbers, types, labels and oneofs; enums; reserved ranges) as the seed compiled
    against our restated definition.proto."""
    if seed_path() is None:
        pytest.skip(f"the RocketMQ v1 seed {SEED_FILE} is not in RAFTLOG_SEEDS_DIR or "
                    "../shared/seeds")
    (seed,) = compiled_seed(tmp_path).file
    for message in seed.message_type:  # protoc's descriptor sets add json names; the
        for field in message.field:    # generated modules' descriptors leave them out
            field.ClearField("json_name")
    ours = descriptor_pb2.FileDescriptorProto()
    rocketmq_v1_service_pb2.DESCRIPTOR.CopyToProto(ours)
    assert (ours.package, ours.syntax) == (seed.package, seed.syntax) == (
        "apache.rocketmq.v1", "proto3")
    assert list(ours.service) == list(seed.service)
    assert [m.name for m in ours.service[0].method] == [m.name for m in seed.service[0].method]
    assert len(seed.service[0].method) == 16
    assert {m.name: m for m in ours.message_type} == {m.name: m for m in seed.message_type}
    assert list(ours.enum_type) == list(seed.enum_type)


def test_the_definition_restates_every_type_the_seed_uses() -> None:
    """Each type the seed's messages name from definition.proto is defined there."""
    names = set(rocketmq_v1_definition_pb2.DESCRIPTOR.message_types_by_name) | set(
        rocketmq_v1_definition_pb2.DESCRIPTOR.enum_types_by_name)
    used = {field.message_type.name if field.message_type else field.enum_type.name
            for message in rocketmq_v1_service_pb2.DESCRIPTOR.message_types_by_name.values()
            for field in message.fields
            if (field.message_type or field.enum_type) is not None
            and (field.message_type or field.enum_type).file.name.endswith(
                "rocketmq_v1_definition.proto")}
    assert used and used <= names
    assert {"Resource", "Endpoints", "Partition", "Message", "Assignment"} <= used


# ------------------------------------------------------------------ the POP receive, on twins

class _Topics:
    """TopicOps' routing calls for a topic of `count` partitions (streams s0, s1, ...)."""

    def __init__(self, count: int) -> None:
        self.count = count

    async def partitions(self, topic: str, via: object) -> int:
        return self.count

    async def stream(self, topic: str, partition: int, via: object) -> str:
        return f"s{partition}"


class _Consumers:
    """ConsumerOps' delivery calls over in-memory queues; a wait with nothing is a short sleep."""

    def __init__(self, queued: dict[str, list[tuple[int, str]]]) -> None:
        self.queued = queued  # stream -> [(seq, tag)]
        self.acked: list[tuple[str, int]] = []
        self.waits = 0

    async def fetch(self, request: Any, via: object) -> Any:
        from raftlog.v1 import consumers_pb2, types_pb2

        waiting = self.queued.get(request.stream, [])
        taken, self.queued[request.stream] = waiting[:request.batch], waiting[request.batch:]
        if not taken and request.max_wait_ms:
            self.waits += 1
            await asyncio.sleep(request.max_wait_ms / 1000)
        return consumers_pb2.FetchResponse(messages=[types_pb2.Message(
            seq=seq, deliver_count=1, headers=[types_pb2.Header(key=rocketmq.TAG_HEADER,
                                                                value=tag)])
            for seq, tag in taken])

    async def ack(self, request: Any, via: object) -> Any:
        self.acked.extend((request.stream, seq) for seq in request.seqs)

    async def nak(self, request: Any, via: object) -> Any:
        raise AssertionError("the group's ack wait is the receive's invisible duration")


class _Groups:
    async def ensure(self, topic: str, group: str, invisible_ms: int, via: object) -> Any:
        return types.SimpleNamespace(ack_wait_ms=invisible_ms)

    def forget(self, topic: str, group: str) -> None:
        pass


def _receiver(count: int, queued: dict[str, list[tuple[int, str]]]
              ) -> tuple[Receiver, _Consumers]:
    consumers = _Consumers(queued)
    return Receiver(cast(Any, _Topics(count)), cast(Any, consumers),
                    groups=cast(Any, _Groups()), clock=SystemClock()), consumers


def _asking(*, queue: int = ANY_QUEUE, wait_ms: int = 0,
            tags: frozenset[str] | None = None, others: bool = False) -> Receive:
    return Receive(topic="t", group="g", queue=queue, batch=8, invisible_ms=1_000,
                   wait_ms=wait_ms, tags=tags, others=others)


def test_any_queue_takes_the_queues_with_messages_in_turn() -> None:
    receiver, _ = _receiver(3, {"s0": [(1, "a"), (2, "a")], "s2": [(5, "a")]})
    via = Call()

    async def rounds() -> list[tuple[int, list[int]]]:
        served = []
        for _ in range(3):
            found = await receiver.receive(_asking(), via)
            served.append((found.queue, [m.seq for m in found.messages]))
        return served

    assert asyncio.run(rounds()) == [(0, [1, 2]), (2, [5]), (ANY_QUEUE, [])]


def test_a_named_queue_serves_first_and_any_other_queue_when_it_has_nothing() -> None:
    """A v2 receive (`others`): its own queue while that has messages, then whichever other
    queue has some, at once rather than after its poll (5 s here); all empty, it waits out its
    poll a slice at a time."""
    receiver, consumers = _receiver(3, {"s0": [(1, "a")], "s1": [(7, "a")], "s2": [(5, "a")]})
    via = Call()

    async def rounds() -> list[tuple[int, list[int]]]:
        served = []
        for _ in range(3):
            found = await receiver.receive(_asking(queue=1, wait_ms=5_000, others=True), via)
            served.append((found.queue, [m.seq for m in found.messages]))
        return served

    started = time.monotonic()
    assert asyncio.run(rounds()) == [(1, [7]), (2, [5]), (0, [1])]
    assert consumers.waits == 0 and time.monotonic() - started < 2.0
    started = time.monotonic()
    found = asyncio.run(receiver.receive(_asking(queue=1, wait_ms=300, others=True), via))
    assert (found.queue, list(found.messages)) == (1, [])
    assert time.monotonic() - started >= 0.3 and consumers.waits >= 2


def test_a_message_on_another_queue_ends_a_waiting_receive_within_a_slice() -> None:
    receiver, _ = _receiver(3, {})

    async def late_message() -> tuple[float, int, list[int]]:
        started = time.monotonic()
        waiting = asyncio.ensure_future(
            receiver.receive(_asking(queue=0, wait_ms=10_000, others=True), Call()))
        await asyncio.sleep(0.1)
        receiver_consumers.queued["s2"] = [(9, "a")]
        found = await waiting
        return time.monotonic() - started, found.queue, [m.seq for m in found.messages]

    receiver_consumers = cast(Any, receiver)._consumers
    took_s, queue, seqs = asyncio.run(late_message())
    assert (queue, seqs) == (2, [9])
    assert took_s < 0.1 + 3 * limits.rocketmq_poll_slice_ms / 1000, took_s


def test_a_named_queue_alone_waits_on_itself_only() -> None:
    receiver, consumers = _receiver(3, {"s2": [(5, "a")]})
    found = asyncio.run(receiver.receive(_asking(queue=1, wait_ms=100), Call()))
    assert found.messages == [] and consumers.queued["s2"] == [(5, "a")]


def test_a_tag_filter_acks_what_it_skips_and_polls_on() -> None:
    receiver, consumers = _receiver(1, {"s0": [(1, "us"), (2, "eu")]})
    found = asyncio.run(receiver.receive(_asking(tags=frozenset({"eu"})), Call()))
    assert [m.seq for m in found.messages] == [2]
    assert consumers.acked == [("s0", 1)]


def test_an_empty_poll_waits_slices_until_its_time_is_up() -> None:
    receiver, consumers = _receiver(3, {})
    started = time.monotonic()
    found = asyncio.run(receiver.receive(_asking(wait_ms=300), Call()))
    assert found.messages == [] and time.monotonic() - started >= 0.3
    assert consumers.waits >= 2  # one slice of a queue at a time, at most
    # limits.rocketmq_poll_slice_ms each


def test_receives_past_the_waiting_limit_are_polling_full(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setattr(limits, "rocketmq_receives_waiting_max", 1)
    receiver, _ = _receiver(1, {})

    async def two() -> RaftlogError:
        first = asyncio.ensure_future(receiver.receive(_asking(wait_ms=200), Call()))
        await asyncio.sleep(0.05)
        with pytest.raises(RaftlogError) as refused:
            await receiver.receive(_asking(), Call())
        await first
        await receiver.receive(_asking(), Call())  # the first one done: room again
        return refused.value

    assert asyncio.run(two()).reason == Reason.OVERLOADED


# ------------------------------------------------------------------ delayed sends, orphans

def test_delivery_times_read_seconds_as_seconds_and_huge_seconds_as_ms() -> None:
    stamp = timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=250_000_000)
    assert rocketmq_time.timestamp_ms(stamp) == 1_700_000_000_250
    lenient = timestamp_pb2.Timestamp(seconds=1_700_000_000_123)  # ms in the seconds field
    assert rocketmq_time.timestamp_ms(lenient) == 1_700_000_000_123


def test_delay_levels_and_due_times_are_checked() -> None:
    now = 1_700_000_000_000
    assert rocketmq_time.delay_level_due_ms(1, now_ms=now) == now + S
    assert rocketmq_time.delay_level_due_ms(18, now_ms=now) == now + 2 * H
    for level in (0, 19, -1):
        with pytest.raises(RaftlogError) as refused:
            rocketmq_time.delay_level_due_ms(level, now_ms=now)
        assert refused.value.reason == Reason.INVALID_ARGUMENT
    assert rocketmq_time.checked_due_ms(now - 5, now_ms=now) == 0  # past: send it now
    assert rocketmq_time.checked_due_ms(now + S, now_ms=now) == now + S
    with pytest.raises(RaftlogError):
        rocketmq_time.checked_due_ms(now + limits.scheduled_delay_ms_max + 1, now_ms=now)


class _Transactions:
    """TransactionOps' listing, message and check count, over a list of open ones."""

    def __init__(self, open_ones: list[transactions_pb2.TransactionInfo]) -> None:
        self.open = open_ones
        self.checks: list[str] = []

    async def list_transactions(self, request: transactions_pb2.ListTransactionsRequest,
                                via: Call) -> transactions_pb2.ListTransactionsResponse:
        if request.topic != "pay":
            raise RaftlogError(Reason.TOPIC_NOT_FOUND, f"no topic {request.topic}")
        return transactions_pb2.ListTransactionsResponse(transactions=self.open)

    async def prepared_message(self, txn_id: str, via: Call) -> types_pb2.Message:
        return types_pb2.Message(msg_id=f"msg of {txn_id}", payload=b"x")

    def note_check(self, txn_id: str) -> int:
        self.checks.append(txn_id)
        return self.checks.count(txn_id)


def test_an_open_transaction_is_asked_about_after_its_period_then_every_check_period() -> None:
    clock = FakeClock()
    now = clock.wall_ms()
    stream = topics.partition_stream("pay", 2)
    open_ones = [
        transactions_pb2.TransactionInfo(txn_id="T:1", stream=stream, prepared_ms=now - 100),
        transactions_pb2.TransactionInfo(txn_id="T:2", stream=stream, prepared_ms=now - 100,
                                         committing=True),
    ]
    fake = _Transactions(open_ones)
    questions = OrphanQuestions(cast(Any, fake), clock=clock)
    questions.remember_period("T:1", 1_000)
    via = Call()

    def ask() -> tuple[Any, int]:
        return asyncio.run(questions.next(["nope", "pay"], via))

    assert ask() == (None, 900)  # its own period (1 s), 100 ms of it gone
    clock.advance(0.9)
    orphan, _ = ask()
    assert (orphan.txn_id, orphan.topic, orphan.queue) == ("T:1", "pay", 2)
    assert orphan.message.msg_id == "msg of T:1" and fake.checks == ["T:1"]
    assert ask() == (None, limits.rocketmq_txn_check_period_ms)  # asked; T:2 is committing
    clock.advance(limits.rocketmq_txn_check_period_ms / 1000)
    assert ask()[0].txn_id == "T:1" and fake.checks == ["T:1", "T:1"]
    questions.forget("T:1")
    fake.open = [transactions_pb2.TransactionInfo(txn_id="T:3", stream=stream,
                                                  prepared_ms=clock.wall_ms())]
    assert ask() == (None, limits.rocketmq_txn_check_after_ms)  # no period given: the default
