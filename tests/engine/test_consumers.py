"""The consumer engine (node/consumers/manager.py, node/consumers/state.py) and the Consumers
gRPC service.

In-memory twins throughout (MemoryStreamLog, MemoryConsumerStore, FakeClock); async tests run
with `asyncio.run` through `run_async`. Each test is named after the rule it checks.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
)
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from raftlog.base import limits
from raftlog.base.clock import FakeClock, SystemClock
from raftlog.base.errors import InvariantViolation, RaftlogError, Reason
from raftlog.internal import storage_pb2
from raftlog.node.api.consumers import ConsumersService
from raftlog.node.consumers.manager import DLQ_HEADERS, ConsumerManager, Settled
from raftlog.node.consumers.store import MemoryConsumerStore
from raftlog.node.engine.log import LogEntry, MemoryStreamLog
from raftlog.node.ops.operations import local_consumers
from raftlog.node.transport import rpc
from raftlog.node.transport.rpc import grpc_status
from raftlog.v1 import consumers_pb2, consumers_pb2_grpc, types_pb2
from tests.async_tests import run_async

P = consumers_pb2.DeliverPolicy
LIMITS = types_pb2.RETENTION_POLICY_LIMITS
WORK_QUEUE = types_pb2.RETENTION_POLICY_WORK_QUEUE
INTEREST = types_pb2.RETENTION_POLICY_INTEREST
STREAM = "orders"
ACK_WAIT_S = limits.ack_wait_ms_default / 1000


@dataclass
class Env:
    log: MemoryStreamLog
    store: MemoryConsumerStore
    clock: FakeClock
    manager: ConsumerManager
    retention: int
    subjects: tuple[str, ...]

    async def create(self, name: str = "c", **fields: Any) -> consumers_pb2.ConsumerInfo:
        return await self.manager.create(STREAM, consumers_pb2.ConsumerConfig(name=name,
                                                                              **fields))

    async def fetch(self, name: str = "c", *, batch: int = 100, max_wait_ms: int = 0
                    ) -> list[int]:
        return [m.seq for m in await self.fetch_messages(name, batch=batch,
                                                          max_wait_ms=max_wait_ms)]

    async def fetch_messages(self, name: str = "c", *, batch: int = 100, max_wait_ms: int = 0
                             ) -> list[types_pb2.Message]:
        return await self.manager.fetch(STREAM, name, batch=batch, max_wait_ms=max_wait_ms)

    def state(self, name: str = "c") -> consumers_pb2.ConsumerState:
        return self.manager.info(STREAM, name).state

    def restart(self) -> None:
        """A new manager over the same store and log, as after a crash."""
        self.manager = ConsumerManager(store=self.store, clock=self.clock)
        self.manager.attach_stream(self.log, retention=self.retention, subjects=self.subjects)


def make_env(*published: str, retention: int = LIMITS, subjects: tuple[str, ...] = (),
             store: MemoryConsumerStore | None = None, log: MemoryStreamLog | None = None,
             clock: FakeClock | None = None) -> Env:
    log = log or MemoryStreamLog(name=STREAM)
    for subject in published:
        log.append(subject, b"payload")
    env = Env(log=log, store=store or MemoryConsumerStore(), clock=clock or FakeClock(),
              manager=ConsumerManager(store=MemoryConsumerStore(), clock=FakeClock()),
              retention=retention, subjects=subjects)
    env.restart()
    return env


def saved_acks(env: Env, name: str = "c") -> set[int]:
    """Seqs the store's record says are done: at or below the floor, or in `acked`."""
    (record,) = [r for r in env.store.load(STREAM) if r.config.name == name]
    return set(range(1, record.ack_floor + 1)) | set(record.acked)


def refusals(settled: Settled) -> dict[int, Reason]:
    """The refused seqs of an Ack/Nak/Term/InProgress call, with their reasons."""
    return {seq: error.reason for seq, error in settled.refused.items()}


async def raises(reason: Reason, awaitable: Awaitable[Any]) -> RaftlogError:
    with pytest.raises(RaftlogError) as caught:
        await awaitable
    assert caught.value.reason == reason, caught.value
    return caught.value


# --------------------------------------------------------------------------- lifecycle


@run_async
async def test_create_is_idempotent_for_the_same_config() -> None:
    env = make_env("a", "b")
    first = await env.create(filter_subject="a")
    again = await env.create(filter_subject="a", ack_wait_ms=limits.ack_wait_ms_default)
    assert again == first
    assert env.manager.consumer_count(STREAM) == 1


@run_async
async def test_create_with_a_different_config_is_consumer_exists() -> None:
    env = make_env()
    await env.create(filter_subject="a")
    await raises(Reason.CONSUMER_EXISTS, env.create(filter_subject="b"))


@run_async
async def test_create_is_durable_on_return() -> None:
    env = make_env("a")
    info = await env.create(description="d")
    (record,) = env.store.load(STREAM)
    assert record.config == info.config
    assert record.created_ms == env.clock.wall_ms() == info.created_ms


@run_async
async def test_create_beyond_consumers_per_stream_max_is_rejected(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "consumers_per_stream_max", 2)
    env = make_env()
    await env.create("c1")
    await env.create("c2")
    await raises(Reason.TOO_MANY_CONSUMERS, env.create("c3"))
    await env.create("c2")  # idempotent create of an existing one still works


@run_async
async def test_create_validates_against_the_stream_subjects() -> None:
    env = make_env(subjects=("orders.>",))
    error = await raises(Reason.INVALID_CONFIG, env.create(filter_subject="invoices.x"))
    assert error.metadata["field"] == "filter_subject"
    await env.create(filter_subject="orders.eu")
    env.manager.update_stream_subjects(STREAM, ["orders.>", "invoices.>"])
    await env.create("c2", filter_subject="invoices.x")


UNKNOWN = [
    ("info", lambda m, s, c: m.info(s, c)),
    ("fetch", lambda m, s, c: m.fetch(s, c, batch=1, max_wait_ms=0)),
    ("ack", lambda m, s, c: m.ack(s, c, [1])),
    ("nak", lambda m, s, c: m.nak(s, c, [1], delay_ms=0)),
    ("term", lambda m, s, c: m.term(s, c, [1])),
    ("in_progress", lambda m, s, c: m.in_progress(s, c, [1])),
    ("delete", lambda m, s, c: m.delete(s, c)),
]


@pytest.mark.parametrize(("method", "call"), UNKNOWN, ids=[case[0] for case in UNKNOWN])
@run_async
async def test_unknown_stream_and_consumer_are_not_found(
        method: str, call: Callable[[ConsumerManager, str, str], Any]) -> None:
    env = make_env()

    async def outcome(stream: str) -> Reason:
        try:
            result = call(env.manager, stream, "missing")
            if asyncio.iscoroutine(result):
                await result
        except RaftlogError as exc:
            return exc.reason
        raise AssertionError("no error")

    assert await outcome("nope") == Reason.STREAM_NOT_FOUND
    assert await outcome(STREAM) == Reason.CONSUMER_NOT_FOUND


@run_async
async def test_delete_removes_the_record_and_wakes_waiting_fetches() -> None:
    env = make_env()
    await env.create()
    waiting = asyncio.create_task(env.fetch(max_wait_ms=5000))
    await asyncio.sleep(0.01)
    await env.manager.delete(STREAM, "c")
    await raises(Reason.CONSUMER_NOT_FOUND, waiting)
    assert env.store.load(STREAM) == []
    assert env.manager.list(STREAM) == []


@run_async
async def test_a_save_racing_a_delete_does_not_bring_the_record_back() -> None:
    env = make_env("a", "a", store=MemoryConsumerStore(delay_s=0.02))
    await env.create()
    await env.fetch()
    saves = env.store.saves
    in_flight = asyncio.create_task(env.manager.ack(STREAM, "c", [1]))
    await asyncio.sleep(0.005)
    assert env.store.saves == saves + 1  # its save is under way
    queued = asyncio.create_task(env.manager.ack(STREAM, "c", [2]))  # needs a second save
    await env.manager.delete(STREAM, "c")
    # Neither is reported durable: the consumer is gone, whatever its last save did.
    await raises(Reason.CONSUMER_NOT_FOUND, in_flight)
    await raises(Reason.CONSUMER_NOT_FOUND, queued)
    await asyncio.sleep(0.05)
    assert env.store.saves == saves + 1
    assert env.store.load(STREAM) == []


@run_async
async def test_a_delete_during_work_queue_removal_does_not_bring_the_record_back() -> None:
    env = make_env("a", retention=WORK_QUEUE)
    await env.create()
    await env.fetch()
    original_remove = env.log.remove

    async def slow_remove(seqs: list[int]) -> int:
        await asyncio.sleep(0.02)
        return await original_remove(seqs)

    env.log.remove = slow_remove  # type: ignore[method-assign]
    acking = asyncio.create_task(env.manager.ack(STREAM, "c", [1]))
    await asyncio.sleep(0.005)  # the flush has taken its snapshot and is removing seq 1
    await env.manager.delete(STREAM, "c")
    await raises(Reason.CONSUMER_NOT_FOUND, acking)
    await asyncio.sleep(0.05)  # the removal finishes; no save may follow it
    assert env.log.read(1) is None
    assert env.store.load(STREAM) == []


@run_async
async def test_detach_wakes_waiters_with_stream_not_found_and_records_can_be_deleted() -> None:
    env = make_env()
    await env.create()
    waiting = asyncio.create_task(env.fetch(max_wait_ms=5000))
    await asyncio.sleep(0.01)
    env.manager.detach_stream(STREAM)
    await raises(Reason.STREAM_NOT_FOUND, waiting)
    assert len(env.store.load(STREAM)) == 1
    await env.manager.delete_stream_consumers(STREAM)
    assert env.store.load(STREAM) == []


# --------------------------------------------------------------------------- delivery policies

# seq: 1 a.1 @1000, 2 a.2 @2000, 3 a.1 @3000, 4 b.1 @4000, 5 a.2 @5000; then 6 a.1 @6000.
POLICIES = [
    ("all", {}, [1, 2, 3, 4, 5, 6]),
    ("all_filtered", {"filter_subject": "a.*"}, [1, 2, 3, 5, 6]),
    ("last", {}, [5, 6]),
    ("last_filtered", {"filter_subject": "a.1"}, [3, 6]),
    ("last_without_match_starts_after_commit", {"filter_subject": "a.>",
                                                "deliver_policy": P.DELIVER_POLICY_LAST}, [5, 6]),
    ("new", {"deliver_policy": P.DELIVER_POLICY_NEW}, [6]),
    ("by_start_seq", {"deliver_policy": P.DELIVER_POLICY_BY_START_SEQ, "opt_start_seq": 3},
     [3, 4, 5, 6]),
    ("by_start_time", {"deliver_policy": P.DELIVER_POLICY_BY_START_TIME,
                       "opt_start_time_ms": 3500}, [4, 5, 6]),
    ("last_per_subject", {"deliver_policy": P.DELIVER_POLICY_LAST_PER_SUBJECT}, [3, 4, 5, 6]),
    ("last_per_subject_filtered", {"deliver_policy": P.DELIVER_POLICY_LAST_PER_SUBJECT,
                                   "filter_subject": "a.*"}, [3, 5, 6]),
]


def publish_timed(log: MemoryStreamLog, *subjects: str, first_ts_ms: int = 1000) -> None:
    for index, subject in enumerate(subjects):
        log.append(subject, b"x", ts_ms=first_ts_ms + 1000 * index)


@pytest.mark.parametrize(("rule", "fields", "expected"), POLICIES,
                         ids=[case[0] for case in POLICIES])
@run_async
async def test_deliver_policy_start_position(rule: str, fields: dict[str, Any],
                                             expected: list[int]) -> None:
    env = make_env()
    publish_timed(env.log, "a.1", "a.2", "a.1", "b.1", "a.2")
    if rule.startswith("last") and "deliver_policy" not in fields:
        fields["deliver_policy"] = P.DELIVER_POLICY_LAST
    await env.create(**fields)
    env.log.append("a.1", b"x", ts_ms=6000)
    assert await env.fetch() == expected


START_FLOORS = [
    (P.DELIVER_POLICY_ALL, {}, 0),
    (P.DELIVER_POLICY_NEW, {}, 5),
    (P.DELIVER_POLICY_LAST, {}, 4),
    (P.DELIVER_POLICY_BY_START_SEQ, {"opt_start_seq": 3}, 2),
    (P.DELIVER_POLICY_LAST_PER_SUBJECT, {}, 2),
]


@pytest.mark.parametrize(("policy", "fields", "floor"), START_FLOORS)
@run_async
async def test_messages_before_the_start_position_count_as_done(
        policy: int, fields: dict[str, Any], floor: int) -> None:
    env = make_env()
    publish_timed(env.log, "a.1", "a.2", "a.1", "b.1", "a.2")
    info = await env.create(deliver_policy=policy, **fields)
    assert info.state.ack_floor == floor
    if floor:  # acks at or below the floor are accepted and change nothing
        assert (await env.manager.ack(STREAM, "c", list(range(1, floor + 1)))).applied == 0


@run_async
async def test_last_per_subject_skips_older_messages_between_its_start_seqs() -> None:
    env = make_env("a.1", "a.2", "a.2")  # last per subject: 1 and 3; 2 is not delivered
    await env.create(deliver_policy=P.DELIVER_POLICY_LAST_PER_SUBJECT)
    assert env.state().num_pending == 2
    assert await env.fetch() == [1, 3]
    assert refusals(await env.manager.ack(STREAM, "c", [2])) == {2: Reason.NOT_DELIVERED}
    await env.manager.ack(STREAM, "c", [1, 3])
    assert env.state().ack_floor == 3


@run_async
async def test_last_per_subject_start_set_survives_a_restart() -> None:
    env = make_env("a.1", "a.2", "a.2")
    await env.create(deliver_policy=P.DELIVER_POLICY_LAST_PER_SUBJECT)
    assert await env.fetch(batch=1) == [1]
    await env.manager.ack(STREAM, "c", [1])
    env.restart()
    env.log.append("a.1")
    assert await env.fetch() == [3, 4]


# --------------------------------------------------------------------------- fetch


@run_async
async def test_fetch_stops_at_batch() -> None:
    env = make_env(*["a"] * 10)
    await env.create()
    assert await env.fetch(batch=3) == [1, 2, 3]
    assert await env.fetch(batch=3) == [4, 5, 6]


@run_async
async def test_fetch_stops_at_max_ack_pending_until_acks_free_room() -> None:
    env = make_env(*["a"] * 5)
    await env.create(max_ack_pending=2)
    assert await env.fetch() == [1, 2]
    assert await env.fetch() == []
    await env.manager.ack(STREAM, "c", [1])
    assert await env.fetch() == [3]
    assert env.state().num_ack_pending == 2


@run_async
async def test_new_deliveries_pause_while_too_many_acks_sit_above_a_stuck_floor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "acked_above_floor_max", 2)
    env = make_env(*["a"] * 4)
    await env.create()
    assert await env.fetch(batch=3) == [1, 2, 3]
    await env.manager.ack(STREAM, "c", [2, 3])
    assert await env.fetch() == []
    await env.manager.ack(STREAM, "c", [1])
    assert await env.fetch() == [4]


@pytest.mark.parametrize(("payload_sizes", "expected"), [
    ([6, 6, 6], [1]),  # 12 bytes would pass the 10-byte cap
    ([4, 6, 1], [1, 2]),  # exactly at the cap; the next one would pass it
    ([25, 1], [1]),  # the first message always goes, even over the cap
])
@pytest.mark.parametrize("into_answer", [False, True], ids=["list", "answer"])
@run_async
async def test_fetch_stops_at_fetch_bytes_max(monkeypatch: pytest.MonkeyPatch,
                                              payload_sizes: list[int],
                                              expected: list[int], into_answer: bool) -> None:
    """Into a list, and into an answer's own field (the service's path, which hands a run of
    new messages out at once): the same cut, and the rest comes with the next fetch."""
    monkeypatch.setattr(limits, "fetch_bytes_max", 10)
    env = make_env()
    for size in payload_sizes:
        env.log.append("a", b"x" * size)
    await env.create()

    async def fetch() -> list[int]:
        if not into_answer:
            return await env.fetch()
        answer = consumers_pb2.FetchResponse()
        await env.manager.fetch(STREAM, "c", batch=100, max_wait_ms=0, into=answer.messages)
        return [m.seq for m in answer.messages]

    assert await fetch() == expected
    assert (env.state().delivered_seq, env.state().num_ack_pending) == \
        (expected[-1], len(expected))
    rest = []
    while batch := await fetch():
        rest += batch
    assert rest == list(range(expected[-1] + 1, len(payload_sizes) + 1))


@run_async
async def test_fetched_message_carries_every_field() -> None:
    env = make_env()
    seq = await env.log.publish_internal(subject="a.b", payload=b"hello", headers=(("k", "v"),))
    await env.create()
    (message,) = await env.fetch_messages()
    assert message == types_pb2.Message(
        seq=seq, subject="a.b", ts_ms=env.log.clock_ms, payload=b"hello", stream=STREAM,
        headers=[types_pb2.Header(key="k", value="v")], deliver_count=1)


@run_async
async def test_fetch_wait_wakes_on_append() -> None:
    env = make_env()
    await env.create(filter_subject="a")
    loop = asyncio.get_running_loop()
    started = loop.time()
    waiting = asyncio.create_task(env.fetch(max_wait_ms=5000))
    await asyncio.sleep(0.02)
    env.log.append("b")  # not for this consumer: keeps waiting
    await asyncio.sleep(0.02)
    assert not waiting.done()
    env.log.append("a")
    assert await waiting == [2]
    assert loop.time() - started < 1


@run_async
async def test_fetch_wait_returns_empty_after_max_wait_without_spinning() -> None:
    env = make_env()
    await env.create()
    scans = 0
    original_scan = env.log.scan

    def counting_scan(**kwargs: Any) -> Iterator[LogEntry]:
        nonlocal scans
        scans += 1
        return original_scan(**kwargs)

    env.log.scan = counting_scan  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await env.fetch(max_wait_ms=150) == []
    assert 0.14 <= loop.time() - started < 1
    assert scans <= 2


@run_async
async def test_fetch_wait_wakes_when_an_ack_frees_max_ack_pending() -> None:
    env = make_env("a", "a")
    await env.create(max_ack_pending=1)
    assert await env.fetch() == [1]
    waiting = asyncio.create_task(env.fetch(max_wait_ms=5000))
    await asyncio.sleep(0.02)
    assert not waiting.done()
    await env.manager.ack(STREAM, "c", [1])
    assert await asyncio.wait_for(waiting, 1) == [2]


@run_async
async def test_fetch_wait_wakes_at_the_redelivery_deadline() -> None:
    env = make_env("a")
    env.manager = ConsumerManager(store=env.store, clock=SystemClock())
    env.manager.attach_stream(env.log, retention=LIMITS, subjects=())
    await env.create(ack_wait_ms=50)
    assert await env.fetch() == [1]
    loop = asyncio.get_running_loop()
    started = loop.time()
    (message,) = await env.fetch_messages(max_wait_ms=5000)
    assert (message.seq, message.deliver_count) == (1, 2)
    assert 0.04 <= loop.time() - started < 1


@dataclass
class HeldBackLog(MemoryStreamLog):
    """Appended messages become visible only when `committed` reaches them."""

    committed: int = 0

    @property
    def commit_seq(self) -> int:
        return self.committed

    def read(self, seq: int) -> LogEntry | None:
        return super().read(seq) if seq <= self.committed else None

    def peek(self, seq: int) -> LogEntry | None:
        return super().peek(seq) if seq <= self.committed else None

    def scan(self, *, from_seq: int, filter_subject: str = "", limit: int
             ) -> Iterator[LogEntry]:
        for entry in super().scan(from_seq=from_seq, filter_subject=filter_subject, limit=limit):
            if entry.seq <= self.committed:
                yield entry


@run_async
async def test_fetch_never_hands_out_uncommitted_messages() -> None:
    env = make_env(log=HeldBackLog(name=STREAM))
    for _ in range(4):
        env.log.append("a")
    assert isinstance(env.log, HeldBackLog)
    env.log.committed = 2
    await env.create()
    assert await env.fetch() == [1, 2]
    assert await env.fetch() == []
    assert env.state().delivered_seq == 2
    env.log.committed = 4
    assert await env.fetch() == [3, 4]


@run_async
async def test_a_scan_that_offers_an_uncommitted_message_is_refused() -> None:
    env = make_env(log=HeldBackLog(name=STREAM))
    env.log.append("a")
    env.log.append("a")
    assert isinstance(env.log, HeldBackLog)
    env.log.committed = 1
    await env.create()
    env.log.scan = functools.partial(MemoryStreamLog.scan, env.log)  # type: ignore[method-assign]
    with pytest.raises(InvariantViolation):
        await env.fetch()
    # The run the scan offered is checked before any of it is handed out: neither seq 1 nor
    # seq 2 was, and the cursor did not move.
    assert env.state().delivered_seq == 0
    assert env.state().num_ack_pending == 0


# --------------------------------------------------------------------------- acks


@run_async
async def test_ack_floor_advances_over_gaps_and_unmatched_subjects() -> None:
    env = make_env("a", "b", "a", "a", "b")
    await env.create(filter_subject="a")
    assert await env.fetch() == [1, 3, 4]
    steps = [([3], 0), ([1], 3), ([4], 4)]
    for seqs, floor in steps:
        await env.manager.ack(STREAM, "c", seqs)
        assert env.state().ack_floor == floor, seqs
    assert await env.fetch() == []  # seq 5 does not match: the cursor moves past it
    assert env.state().ack_floor == 5


NOT_DELIVERED = [
    ("above_the_commit_seq", 9),
    ("committed_but_not_yet_handed_out", 4),
    ("skipped_because_unmatched", 2),
]
SETTLERS = [
    ("ack", lambda m, seqs: m.ack(STREAM, "c", seqs)),
    ("nak", lambda m, seqs: m.nak(STREAM, "c", seqs, delay_ms=0)),
    ("term", lambda m, seqs: m.term(STREAM, "c", seqs)),
    ("in_progress", lambda m, seqs: m.in_progress(STREAM, "c", seqs)),
]
# Pending after settling [1, bad seq] when 1 and 3 were pending: ack and term finish 1.
PENDING_AFTER = {"ack": 1, "nak": 2, "term": 1, "in_progress": 2}


@pytest.mark.parametrize(("case", "bad_seq"), NOT_DELIVERED, ids=[c[0] for c in NOT_DELIVERED])
@pytest.mark.parametrize(("method", "call"), SETTLERS, ids=[c[0] for c in SETTLERS])
@run_async
async def test_a_never_delivered_seq_is_refused_alone_and_the_rest_of_the_call_applies(
        case: str, bad_seq: int, method: str,
        call: Callable[[ConsumerManager, list[int]], Awaitable[Settled]]) -> None:
    env = make_env("a", "b", "a", "a")
    await env.create(filter_subject="a")
    await env.fetch(batch=2)  # 1 and 3
    settled = await call(env.manager, [1, bad_seq])
    assert settled.applied == 1
    assert refusals(settled) == {bad_seq: Reason.NOT_DELIVERED}
    error = settled.refused[bad_seq]
    assert error.metadata["seq"] == str(bad_seq)
    assert error.status_name == "FAILED_PRECONDITION"
    assert env.state().num_ack_pending == PENDING_AFTER[method]
    if method in ("ack", "term"):
        assert 1 in saved_acks(env)  # durable on return, despite the refused seq
    assert env.state().delivered_seq == 3


@pytest.mark.parametrize(("method", "call"), SETTLERS, ids=[c[0] for c in SETTLERS])
@run_async
async def test_a_call_whose_every_seq_is_refused_changes_and_saves_nothing(
        method: str, call: Callable[[ConsumerManager, list[int]], Awaitable[Settled]]) -> None:
    env = make_env("a", "b", "a", "a")
    await env.create(filter_subject="a", max_deliver=1)
    await env.fetch(batch=2)
    saves = env.store.saves
    settled = await call(env.manager, [2, 4, 9])
    assert (settled.applied, set(settled.refused)) == (0, {2, 4, 9})
    assert env.store.saves == saves
    assert (env.state().num_ack_pending, env.state().num_dead_lettered) == (2, 0)


@run_async
async def test_fetched_into_an_answer_the_messages_are_the_same() -> None:
    """A fetch that builds its messages in the answer's own field (the Consumers service's
    path) hands out exactly what a fetch into a list does, headers and redeliveries alike."""
    env = make_env()
    for i in range(5):
        await env.log.publish_internal(subject=f"a.{i}", payload=b"p%d" % i,
                                       headers=(("k", str(i)),) if i % 2 else ())
    await env.create("listed")
    await env.create("answered")
    listed = await env.fetch_messages("listed", batch=3)
    answer = consumers_pb2.FetchResponse()
    returned = await env.manager.fetch(STREAM, "answered", batch=3, max_wait_ms=0,
                                       into=answer.messages)
    assert returned is answer.messages
    assert [m.seq for m in answer.messages] == [1, 2, 3]
    assert [m.SerializeToString() for m in listed] == \
        [m.SerializeToString() for m in answer.messages]
    env.clock.advance(ACK_WAIT_S + 1)  # the next ones come with a redelivery first
    listed = await env.fetch_messages("listed", batch=5)
    answer = consumers_pb2.FetchResponse()
    await env.manager.fetch(STREAM, "answered", batch=5, max_wait_ms=0, into=answer.messages)
    assert [(m.seq, m.deliver_count) for m in answer.messages] == \
        [(1, 2), (2, 2), (3, 2), (4, 1), (5, 1)]
    assert list(listed) == list(answer.messages)


@run_async
async def test_an_ack_of_pending_seqs_takes_each_once_in_request_order() -> None:
    env = make_env(*["a"] * 6)
    await env.create()
    await env.fetch(batch=4)
    settled = await env.manager.ack(STREAM, "c", [3, 1, 3, 2])  # every one pending
    assert (settled.applied, settled.refused) == (3, {})
    assert env.state().ack_floor == 3 and env.state().num_ack_pending == 1
    assert saved_acks(env) == {1, 2, 3}
    # One seq not pending (never handed out) sends the whole call the per-seq way: the others
    # still apply, and the ack floor moves over them.
    settled = await env.manager.ack(STREAM, "c", [4, 6])
    assert settled.applied == 1 and refusals(settled) == {6: Reason.NOT_DELIVERED}
    assert env.state().ack_floor == 4 and saved_acks(env) == {1, 2, 3, 4}


@run_async
async def test_acks_a_fetch_carries_take_effect_at_once_and_save_behind_one_at_a_time(
) -> None:
    store = OverlapCountingStore(delay_s=0.02)
    env = make_env(*["a"] * 30, store=store)
    await env.create(max_ack_pending=10)
    assert await env.fetch(batch=10) == list(range(1, 11))
    saves = store.saves
    for first in range(1, 11, 2):  # five calls in a row, none waiting for a save
        settled = env.manager.ack_behind(STREAM, "c", [first, first + 1])
        assert (settled.applied, settled.refused) == (2, {})
    # In effect before any save: the floor moved, and max_ack_pending has room again.
    assert env.state().ack_floor == 10 and env.state().num_ack_pending == 0
    assert await env.fetch(batch=10) == list(range(11, 21))
    assert saved_acks(env) < set(range(1, 11))
    # Saved behind, one save at a time: the acks carried while one was in flight share the
    # next one.
    for _ in range(100):
        if saved_acks(env) >= set(range(1, 11)):
            break
        await asyncio.sleep(0.01)
    assert saved_acks(env) >= set(range(1, 11))
    assert store.running_max == 1 and store.saves - saves <= 3
    refused = env.manager.ack_behind(STREAM, "c", [11, 25])
    assert refused.applied == 1 and refusals(refused) == {25: Reason.NOT_DELIVERED}
    await env.manager.ack(STREAM, "c", [12])  # a waiting ack: its save covers 11 too
    assert {11, 12} <= saved_acks(env)


@run_async
async def test_acks_a_fetch_carries_on_a_work_queue_remove_the_messages_behind() -> None:
    env = make_env("a", "a", "a", retention=WORK_QUEUE)
    await env.create()
    await env.fetch()
    env.manager.ack_behind(STREAM, "c", [1, 2])
    for _ in range(100):
        if env.log.read(1) is None and env.log.read(2) is None:
            break
        await asyncio.sleep(0.01)
    assert env.log.read(1) is None and env.log.read(2) is None and env.log.read(3) is not None
    assert saved_acks(env) >= {1, 2}


@run_async
async def test_ack_is_idempotent_and_counts_only_changes() -> None:
    env = make_env("a", "a", "a")
    await env.create()
    await env.fetch()
    assert (await env.manager.ack(STREAM, "c", [2, 2])).applied == 1
    assert (await env.manager.ack(STREAM, "c", [2])).applied == 0
    assert (await env.manager.ack(STREAM, "c", [1, 2])).applied == 1
    assert (await env.manager.ack(STREAM, "c", [1])).applied == 0  # now below the floor
    assert env.state().ack_floor == 2
    assert (await env.manager.nak(STREAM, "c", [1, 3], delay_ms=0)).applied == 1


@run_async
async def test_acks_arriving_together_share_a_save_and_return_only_once_saved() -> None:
    env = make_env(*["a"] * 40, store=MemoryConsumerStore(delay_s=0.01))
    await env.create()
    await env.fetch()
    saves = env.store.saves

    async def ack_and_check(seq: int) -> None:
        await env.manager.ack(STREAM, "c", [seq])
        assert seq in saved_acks(env), seq

    await asyncio.gather(*(ack_and_check(seq) for seq in range(1, 41)))
    assert env.store.saves - saves <= 3
    assert saved_acks(env) == set(range(1, 41))


class OverlapCountingStore(MemoryConsumerStore):
    """Counts how many saves run at once (the most seen)."""

    def __init__(self, *, delay_s: float) -> None:
        super().__init__(delay_s=delay_s)
        self.running = 0
        self.running_max = 0

    async def save(self, stream: str, record: storage_pb2.ConsumerRecord) -> None:
        self.running += 1
        self.running_max = max(self.running_max, self.running)
        try:
            await super().save(stream, record)
        finally:
            self.running -= 1


async def _acks_one_turn_apart(env: Env, seqs: range) -> None:
    async def ack_and_check(seq: int) -> None:
        await env.manager.ack(STREAM, "c", [seq])
        assert seq in saved_acks(env), seq

    tasks = []
    for seq in seqs:
        tasks.append(asyncio.create_task(ack_and_check(seq)))
        await asyncio.sleep(0)  # the next ack comes a loop turn later
    await asyncio.gather(*tasks)


@run_async
async def test_acks_of_successive_turns_save_in_parallel_up_to_the_bound() -> None:
    store = OverlapCountingStore(delay_s=0.02)
    env = make_env(*["a"] * 12, store=store)
    await env.create()
    await env.fetch()
    await _acks_one_turn_apart(env, range(1, 13))
    assert 1 < store.running_max <= limits.consumer_saves_inflight_max
    assert saved_acks(env) == set(range(1, 13))


@run_async
async def test_a_work_queue_consumer_saves_one_at_a_time() -> None:
    store = OverlapCountingStore(delay_s=0.02)
    env = make_env(*["a"] * 12, store=store, retention=WORK_QUEUE)
    await env.create()
    await env.fetch()
    await _acks_one_turn_apart(env, range(1, 13))
    assert store.running_max == 1
    assert saved_acks(env) == set(range(1, 13))


@run_async
async def test_ack_that_could_not_be_saved_fails_and_a_retry_saves_it() -> None:
    env = make_env("a")
    await env.create()
    await env.fetch()
    env.store.error = OSError("disk gone")
    with pytest.raises(OSError):
        await env.manager.ack(STREAM, "c", [1])
    assert 1 not in saved_acks(env)
    env.store.error = None
    assert (await env.manager.ack(STREAM, "c", [1])).applied == 0  # already acked in memory
    assert 1 in saved_acks(env)


@run_async
async def test_nak_redelivers_after_its_delay() -> None:
    env = make_env("a", "a")
    await env.create()
    await env.fetch()
    assert (await env.manager.nak(STREAM, "c", [1], delay_ms=5000)).applied == 1
    assert (await env.manager.nak(STREAM, "c", [2], delay_ms=0)).applied == 1
    assert await env.fetch() == [2]
    env.clock.advance(4.9)
    assert await env.fetch() == []
    env.clock.advance(0.2)
    (message,) = await env.fetch_messages()
    assert (message.seq, message.deliver_count) == (1, 2)
    await raises(Reason.INVALID_ARGUMENT,
                 env.manager.nak(STREAM, "c", [1], delay_ms=limits.nak_delay_ms_max + 1))


@run_async
async def test_term_never_redelivers_and_counts_as_acked() -> None:
    env = make_env("a", "a")
    await env.create()
    await env.fetch()
    assert (await env.manager.term(STREAM, "c", [1])).applied == 1
    assert 1 in saved_acks(env)
    env.clock.advance(10 * ACK_WAIT_S)
    assert await env.fetch() == [2]
    assert env.state().ack_floor == 1


@run_async
async def test_in_progress_restarts_the_ack_wait() -> None:
    env = make_env("a")
    await env.create()
    await env.fetch()
    env.clock.advance(20)
    assert (await env.manager.in_progress(STREAM, "c", [1])).applied == 1
    env.clock.advance(20)  # 40 s after delivery, 20 s after InProgress
    assert await env.fetch() == []
    env.clock.advance(10.5)
    assert await env.fetch() == [1]


@run_async
async def test_redelivery_after_ack_wait_increments_deliver_count() -> None:
    env = make_env("a", "a")
    await env.create()
    await env.fetch()
    await env.manager.ack(STREAM, "c", [2])
    env.clock.advance(ACK_WAIT_S - 0.1)
    assert await env.fetch() == []
    for deliver_count in (2, 3):
        env.clock.advance(ACK_WAIT_S + 0.2)
        messages = await env.fetch_messages()
        assert [(m.seq, m.deliver_count) for m in messages] == [(1, deliver_count)]
    assert env.state().num_redelivered == 1


@run_async
async def test_due_redeliveries_come_first_in_seq_order() -> None:
    env = make_env("a", "a", "a")
    await env.create()
    await env.fetch(batch=2)
    await env.manager.nak(STREAM, "c", [2], delay_ms=0)
    env.clock.advance(ACK_WAIT_S + 1)
    env.log.append("a")
    assert await env.fetch() == [1, 2, 3, 4]


@run_async
async def test_backoff_schedule_sets_each_redelivery_wait() -> None:
    env = make_env("a")
    await env.create(backoff_ms=[1000, 5000])
    await env.fetch()
    schedule = [(0.9, None), (0.2, 2), (4.8, None), (0.3, 3), (4.8, None), (0.3, 4)]
    for advance_s, deliver_count in schedule:
        env.clock.advance(advance_s)
        messages = await env.fetch_messages()
        assert [m.deliver_count for m in messages] == ([deliver_count] if deliver_count else [])


# --------------------------------------------------------------------------- dead letters


@run_async
async def test_max_deliver_dead_letters_to_the_subject_with_headers() -> None:
    env = make_env(subjects=("orders.>", "dlq.>"))
    env.log.entries[env.log.append("orders.eu", b"body")] = LogEntry(
        seq=1, subject="orders.eu", ts_ms=1, payload=b"body", headers=(("trace", "t1"),))
    await env.create(filter_subject="orders.*", max_deliver=2, dead_letter_subject="dlq.orders")
    assert await env.fetch() == [1]
    env.clock.advance(ACK_WAIT_S + 1)
    assert await env.fetch() == [1]
    env.clock.advance(ACK_WAIT_S + 1)
    assert await env.fetch() == []
    dead = env.log.read(2)
    assert dead is not None and dead.subject == "dlq.orders" and dead.payload == b"body"
    assert dead.headers == (("trace", "t1"), *zip(DLQ_HEADERS, (STREAM, "c", "1", "orders.eu",
                                                                 "2"), strict=True))
    state = env.state()  # the dead letter itself (seq 2) is not for this consumer: skipped
    assert (state.num_dead_lettered, state.ack_floor, state.num_ack_pending) == (1, 2, 0)
    (record,) = env.store.load(STREAM)  # saved before the fetch returned
    assert (record.num_dead_lettered, record.ack_floor) == (1, 2)


@run_async
async def test_nak_of_a_message_out_of_deliveries_dead_letters_it() -> None:
    env = make_env("a", "a")
    await env.create(filter_subject="a", max_deliver=1, dead_letter_subject="dlq")
    await env.fetch()
    assert (await env.manager.nak(STREAM, "c", [1], delay_ms=0)).applied == 1
    assert [e.subject for e in env.log.entries.values()] == ["a", "a", "dlq"]
    assert await env.fetch() == []
    assert env.state().num_dead_lettered == 1


@run_async
async def test_max_deliver_without_a_subject_drops_the_message() -> None:
    env = make_env("a")
    await env.create(max_deliver=1)
    await env.fetch()
    env.clock.advance(ACK_WAIT_S + 1)
    assert await env.fetch() == []
    assert env.log.last_seq == 1
    assert env.state().num_dead_lettered == 1


# --------------------------------------------------------------------------- retention


@run_async
async def test_work_queue_ack_and_term_remove_the_message_before_returning() -> None:
    env = make_env("a", "a", "a", retention=WORK_QUEUE)
    await env.create()
    await env.fetch()
    await env.manager.ack(STREAM, "c", [1])
    assert env.log.read(1) is None
    await env.manager.term(STREAM, "c", [3])
    assert env.log.read(3) is None
    assert env.log.read(2) is not None


@run_async
async def test_work_queue_rejects_an_overlapping_filter() -> None:
    env = make_env(retention=WORK_QUEUE)
    await env.create("c1", filter_subject="orders.*")
    error = await raises(Reason.WORK_QUEUE_OVERLAP, env.create("c2", filter_subject="orders.eu"))
    assert error.metadata["consumer"] == "c1"
    await raises(Reason.WORK_QUEUE_OVERLAP, env.create("c3"))
    await env.create("c4", filter_subject="invoices.*")
    await env.create("c1", filter_subject="orders.*")  # idempotent create is no overlap


@run_async
async def test_interest_removes_what_every_consumer_is_done_with() -> None:
    env = make_env("a", "b", "a", retention=INTEREST)
    await env.create("c1", filter_subject="a")
    await env.create("c2", filter_subject="b")
    assert await env.fetch("c1") == [1, 3]
    await env.manager.ack(STREAM, "c1", [1, 3])
    assert sorted(env.log.entries) == [2]  # c2 has not seen 2 yet; 1 and 3 are not for it
    assert await env.fetch("c2") == [2]
    await env.manager.ack(STREAM, "c2", [2])
    assert env.log.entries == {}
    assert await env.manager.maybe_trim_interest(STREAM) == 0


@run_async
async def test_interest_a_consumer_whose_filter_does_not_match_never_holds_a_message_back(
) -> None:
    env = make_env("a", "b", "a", "b", retention=INTEREST)
    await env.create("ca", filter_subject="a")
    await env.create("cb", filter_subject="b")  # lags: fetches nothing until the end
    await env.create("all")
    assert await env.fetch("ca") == [1, 3]
    await env.manager.ack(STREAM, "ca", [1, 3])
    assert sorted(env.log.entries) == [1, 2, 3, 4]  # "all" wants them too
    assert await env.fetch("all") == [1, 2, 3, 4]
    await env.manager.ack(STREAM, "all", [3, 2])
    assert sorted(env.log.entries) == [1, 2, 4]  # 3 is done for ca and all; cb wants 2
    await env.manager.ack(STREAM, "all", [1, 4])
    assert sorted(env.log.entries) == [2, 4]
    assert await env.fetch("cb") == [2, 4]
    await env.manager.ack(STREAM, "cb", [4])
    assert sorted(env.log.entries) == [2]
    await env.manager.ack(STREAM, "cb", [2])
    assert env.log.entries == {}


@run_async
async def test_interest_trims_when_the_lagging_consumer_is_deleted() -> None:
    env = make_env("a", "a", retention=INTEREST)
    await env.create("c1")
    await env.create("c2")
    await env.fetch("c1")
    await env.manager.ack(STREAM, "c1", [1, 2])
    assert len(env.log.entries) == 2
    await env.manager.delete(STREAM, "c2")
    assert env.log.entries == {}


@run_async
async def test_interest_trim_is_bounded_per_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "retention_sweep_deletes_max", 3)
    env = make_env(*["a"] * 10, retention=INTEREST)
    await env.create(deliver_policy=P.DELIVER_POLICY_NEW)
    batches: list[int] = []
    original_remove = env.log.remove

    async def recording_remove(seqs: list[int]) -> int:
        batches.append(len(seqs))
        return await original_remove(seqs)

    env.log.remove = recording_remove  # type: ignore[method-assign]
    assert await env.manager.maybe_trim_interest(STREAM) == 10
    assert batches == [3, 3, 3, 1]
    assert await env.manager.maybe_trim_interest(STREAM) == 0


@run_async
async def test_interest_trim_never_spins_when_the_log_keeps_its_head() -> None:
    env = make_env("a", "a", retention=INTEREST)
    await env.create()
    await env.fetch()
    calls = 0

    async def refusing_remove(seqs: list[int]) -> int:
        nonlocal calls
        calls += 1
        return 0

    env.log.remove = refusing_remove  # type: ignore[method-assign]
    await env.manager.ack(STREAM, "c", [1, 2])
    assert calls == 1
    assert await env.manager.maybe_trim_interest(STREAM) == 0
    assert calls == 2


@run_async
async def test_limits_stream_never_removes_acked_messages() -> None:
    env = make_env("a", retention=LIMITS)
    await env.create()
    await env.fetch()
    await env.manager.ack(STREAM, "c", [1])
    assert await env.manager.maybe_trim_interest(STREAM) == 0
    assert env.log.read(1) is not None


# --------------------------------------------------------------------------- removed messages


@run_async
async def test_removed_messages_are_skipped_and_count_as_done() -> None:
    env = make_env("a", "a", "a", "a", "a")
    await env.create()
    assert await env.fetch(batch=3) == [1, 2, 3]
    await env.log.remove([2, 4])  # 2 pending, 4 not yet delivered
    env.manager.on_purged(STREAM)
    assert env.state().num_ack_pending == 2
    assert (await env.manager.ack(STREAM, "c", [2])).applied == 0  # accepted: nothing left
    assert await env.fetch() == [5]
    await env.manager.ack(STREAM, "c", [1, 3])
    assert env.state().ack_floor == 4


@run_async
async def test_a_pending_message_removed_without_notice_is_not_redelivered() -> None:
    env = make_env("a", "a")
    await env.create()
    await env.fetch()
    await env.log.remove([1])
    env.clock.advance(ACK_WAIT_S + 1)
    assert await env.fetch() == [2]
    assert env.state().ack_floor == 1


@run_async
async def test_purge_below_the_cursor_moves_undelivered_consumers_forward() -> None:
    env = make_env("a", "a", "a")
    await env.create()
    await env.log.remove([1, 2])
    env.manager.on_purged(STREAM)
    assert env.state().ack_floor == 2
    assert await env.fetch() == [3]


# --------------------------------------------------------------------------- restart


@run_async
async def test_restart_never_redelivers_an_acked_seq_and_redelivers_unacked_ones() -> None:
    env = make_env("a", "a", "a", "a")
    await env.create()
    assert await env.fetch(batch=3) == [1, 2, 3]
    await env.manager.ack(STREAM, "c", [2])
    env.restart()
    assert await env.fetch() == [4]  # restored deliveries get a fresh ack wait
    assert refusals(await env.manager.ack(STREAM, "c", [5])) == {5: Reason.NOT_DELIVERED}
    env.clock.advance(ACK_WAIT_S + 1)
    messages = await env.fetch_messages()
    assert [(m.seq, m.deliver_count) for m in messages] == [(1, 2), (3, 2), (4, 2)]
    for _ in range(3):
        env.clock.advance(10 * ACK_WAIT_S)
        assert 2 not in await env.fetch()


@run_async
async def test_restart_after_fetch_only_redelivers_from_the_last_save() -> None:
    env = make_env("a", "a")
    await env.create()
    assert await env.fetch() == [1, 2]
    env.restart()
    messages = await env.fetch_messages()
    assert [(m.seq, m.deliver_count) for m in messages] == [(1, 1), (2, 1)]


@run_async
async def test_restart_keeps_acks_above_the_floor_and_dead_letter_count() -> None:
    env = make_env("a", "a", "a")
    await env.create(max_deliver=1)
    await env.fetch()
    await env.manager.ack(STREAM, "c", [3])
    await env.manager.nak(STREAM, "c", [2], delay_ms=0)  # dead-lettered (dropped)
    env.restart()
    state = env.state()
    assert (state.ack_floor, state.num_ack_pending, state.num_dead_lettered) == (0, 1, 1)
    assert (await env.manager.ack(STREAM, "c", [1, 2, 3])).applied == 1
    assert env.state().ack_floor == 3


@run_async
async def test_restart_skips_messages_removed_while_down() -> None:
    env = make_env("a", "a", "a")
    await env.create()
    await env.fetch()
    await env.manager.ack(STREAM, "c", [3])
    await env.log.remove([1])
    env.restart()
    assert env.state().ack_floor == 1
    assert env.state().num_ack_pending == 1


@run_async
async def test_after_a_restore_acks_of_seqs_handed_out_before_it_are_accepted_and_final(
) -> None:
    env = make_env(*["a"] * 6)
    await env.create()
    assert await env.fetch(batch=4) == [1, 2, 3, 4]  # never saved: fetches do not save
    env.restart()  # as a new primary after failover: the record says nothing was handed out
    settled = await env.manager.ack(STREAM, "c", [2, 4, 3, 1])
    assert (settled.applied, settled.refused) == (4, {})
    assert saved_acks(env) >= {1, 2, 3, 4}  # durable on return
    assert env.state().ack_floor == 4  # the cursor moved over them at once
    assert await env.fetch() == [5, 6]
    env.clock.advance(10 * ACK_WAIT_S)
    assert await env.fetch() == [5, 6]  # redeliveries of 5 and 6 only: 1-4 never come back


@run_async
async def test_acks_ahead_of_the_cursor_are_passed_over_and_the_gaps_delivered() -> None:
    env = make_env(*["a"] * 5)
    await env.create()
    await env.fetch()
    env.restart()
    assert (await env.manager.ack(STREAM, "c", [2, 4])).applied == 2
    assert env.state().ack_floor == 0
    assert env.state().num_pending == 3
    assert await env.fetch() == [1, 3, 5]
    await env.manager.ack(STREAM, "c", [1, 3, 5])
    assert env.state().ack_floor == 5
    env.restart()
    assert await env.fetch() == []


RESTORED_REFUSALS = [
    # (seq, reason): the log holds "a" at 1-4 and "b" at 5; seqs 1-4 are committed; the
    # consumer (filter "a") was restored with the log's last seq 5.
    ("above_the_last_seq_at_restore", 7, Reason.NOT_DELIVERED),
    ("filter_does_not_match", 5, Reason.NOT_DELIVERED),
]


@pytest.mark.parametrize(("case", "bad_seq", "reason"), RESTORED_REFUSALS,
                         ids=[c[0] for c in RESTORED_REFUSALS])
@run_async
async def test_after_a_restore_a_seq_nobody_can_have_handed_out_is_refused_alone(
        case: str, bad_seq: int, reason: Reason) -> None:
    env = make_env("a", "a", "a", "a", "b")
    await env.create(filter_subject="a")
    env.restart()
    env.log.append("a", b"after the restore")  # seq 6: only this manager can hand it out
    settled = await env.manager.ack(STREAM, "c", [3, bad_seq, 6])
    assert refusals(settled) == {bad_seq: reason, 6: Reason.NOT_DELIVERED}
    assert settled.applied == 1
    assert 3 in saved_acks(env)


@run_async
async def test_a_new_primary_behind_on_its_commit_seq_answers_catching_up_per_seq() -> None:
    log = HeldBackLog(name=STREAM)
    for _ in range(4):
        log.append("a", b"x")
    log.committed = 4
    env = make_env(log=log)
    await env.create()
    await env.fetch()
    log.committed = 2  # a new primary whose commit seq has not caught up yet
    env.restart()
    settled = await env.manager.ack(STREAM, "c", [1, 3])
    assert refusals(settled) == {3: Reason.CATCHING_UP}
    assert settled.refused[3].status_name == "UNAVAILABLE"
    log.committed = 4
    assert (await env.manager.ack(STREAM, "c", [3])).applied == 1


@run_async
async def test_a_restore_behind_on_the_commit_seq_keeps_the_pending_deliveries_above_it(
) -> None:
    """A restarted or promoted primary attaches its consumers before its commit seq is
    re-established: deliveries above it are still stored, not removed, and are redelivered
    (at-least-once), not forgotten as if their messages were gone."""
    log = HeldBackLog(name=STREAM)
    for _ in range(5):
        log.append("a", b"x")
    log.committed = 5
    env = make_env(log=log)
    await env.create()
    assert await env.fetch(batch=4) == [1, 2, 3, 4]
    await env.manager.ack(STREAM, "c", [1])  # saved: 2-4 pending
    await log.remove([4])  # really gone
    log.committed = 1
    env.restart()
    assert env.state().num_ack_pending == 2  # 2 and 3; 4 was removed
    log.committed = 5
    env.clock.advance(10 * ACK_WAIT_S)
    messages = await env.fetch_messages()
    assert [(m.seq, m.deliver_count) for m in messages] == [(2, 2), (3, 2), (5, 1)]


@run_async
async def test_acks_ahead_of_the_cursor_are_bounded_and_never_pause_delivery(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "acked_above_floor_max", 2)
    env = make_env(*["a"] * 6)
    await env.create()
    await env.fetch()
    env.restart()
    settled = await env.manager.ack(STREAM, "c", [2, 4, 6])
    assert refusals(settled) == {6: Reason.OVERLOADED}
    assert await env.fetch() == [1, 3, 5, 6]  # two acks ahead of the cursor hold nothing up


@run_async
async def test_a_corrupt_record_is_refused_on_load() -> None:
    env = make_env("a")
    await env.create()
    key = (STREAM, "c")
    (record,) = env.store.load(STREAM)
    record.ack_floor = 5
    env.store.records[key] = record.SerializeToString()
    with pytest.raises(RaftlogError) as caught:
        env.restart()
    assert caught.value.reason == Reason.CORRUPT_RECORD


# --------------------------------------------------------------------------- gRPC service


# grpc-stubs types the generated stub for the sync API; on an aio channel its calls return
# awaitables and async iterators, so tests hold it as Any.
AioStub = Any


@asynccontextmanager
async def serving(env: Env) -> AsyncIterator[AioStub]:
    server = grpc.aio.server()
    consumers_pb2_grpc.add_ConsumersServicer_to_server(
        ConsumersService(local_consumers(env.manager)), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield consumers_pb2_grpc.ConsumersStub(channel)
    finally:
        await server.stop(grace=None)


BAD_REQUESTS = [
    ("fetch_batch_max", "Fetch", consumers_pb2.FetchRequest(
        stream=STREAM, consumer="c", batch=limits.fetch_batch_max + 1), Reason.INVALID_ARGUMENT),
    ("fetch_ack_seqs_max", "Fetch", consumers_pb2.FetchRequest(
        stream=STREAM, consumer="c", ack_seqs=range(1, limits.ack_seqs_max + 2)),
     Reason.INVALID_ARGUMENT),
    ("fetch_ack_seq_0", "Fetch", consumers_pb2.FetchRequest(
        stream=STREAM, consumer="c", ack_seqs=[1, 0]), Reason.INVALID_ARGUMENT),
    ("fetch_wait_ms_max", "Fetch", consumers_pb2.FetchRequest(
        stream=STREAM, consumer="c", max_wait_ms=limits.fetch_wait_ms_max + 1),
     Reason.INVALID_ARGUMENT),
    ("consumer_name", "Fetch", consumers_pb2.FetchRequest(stream=STREAM, consumer="a b"),
     Reason.INVALID_NAME),
    ("stream_name", "ListConsumers", consumers_pb2.ListConsumersRequest(stream=""),
     Reason.INVALID_NAME),
    ("seqs_not_empty", "Ack", consumers_pb2.AckRequest(stream=STREAM, consumer="c"),
     Reason.INVALID_ARGUMENT),
    ("seqs_positive", "Term", consumers_pb2.TermRequest(stream=STREAM, consumer="c",
                                                        seqs=[1, 0]), Reason.INVALID_ARGUMENT),
    ("ack_seqs_max", "InProgress", consumers_pb2.InProgressRequest(
        stream=STREAM, consumer="c", seqs=[1] * (limits.ack_seqs_max + 1)),
     Reason.INVALID_ARGUMENT),
    ("nak_delay_ms_max", "Nak", consumers_pb2.NakRequest(
        stream=STREAM, consumer="c", seqs=[1], delay_ms=limits.nak_delay_ms_max + 1),
     Reason.INVALID_ARGUMENT),
    ("consumer_not_found", "GetConsumerInfo", consumers_pb2.GetConsumerInfoRequest(
        stream=STREAM, consumer="nobody"), Reason.CONSUMER_NOT_FOUND),
    ("config_checked", "CreateConsumer", consumers_pb2.CreateConsumerRequest(
        stream=STREAM, config=consumers_pb2.ConsumerConfig(name="x", opt_start_seq=3)),
     Reason.INVALID_CONFIG),
]


@run_async
async def test_service_rejects_bad_requests_with_catalogued_reasons() -> None:
    env = make_env("a")
    await env.create()
    async with serving(env) as stub:
        for rule, method, request, reason in BAD_REQUESTS:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await getattr(stub, method)(request)
            error = rpc.from_rpc_error(caught.value)
            assert error is not None and error.reason == reason, (rule, caught.value)
            assert caught.value.code() == grpc_status(reason), rule
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in stub.Subscribe(consumers_pb2.SubscribeRequest(
                    stream=STREAM, consumer="c", heartbeat_ms=1)):
                pass
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@run_async
async def test_service_round_trip_create_fetch_ack_info() -> None:
    env = make_env("a", "b")
    async with serving(env) as stub:
        config = consumers_pb2.ConsumerConfig(name="c", filter_subject="b")
        info = await stub.CreateConsumer(consumers_pb2.CreateConsumerRequest(stream=STREAM,
                                                                             config=config))
        assert info.state.num_pending == 1
        fetched = await stub.Fetch(consumers_pb2.FetchRequest(stream=STREAM, consumer="c"))
        assert [(m.seq, m.stream, m.deliver_count) for m in fetched.messages] == [(2, STREAM, 1)]
        acked = await stub.Ack(consumers_pb2.AckRequest(stream=STREAM, consumer="c", seqs=[2]))
        assert acked.applied == 1
        listed = await stub.ListConsumers(consumers_pb2.ListConsumersRequest(stream=STREAM))
        assert [c.state.ack_floor for c in listed.consumers] == [2]


@run_async
async def test_service_fetch_carries_acks_and_answers_them_per_seq() -> None:
    env = make_env("a", "a", "a", "a")
    async with serving(env) as stub:
        await stub.CreateConsumer(consumers_pb2.CreateConsumerRequest(
            stream=STREAM, config=consumers_pb2.ConsumerConfig(name="c", max_ack_pending=2)))
        first = await stub.Fetch(consumers_pb2.FetchRequest(stream=STREAM, consumer="c",
                                                            batch=2))
        assert [m.seq for m in first.messages] == [1, 2] and not first.HasField("acks")
        # max_ack_pending is 2: only the acks carried make room for the next two.
        second = await stub.Fetch(consumers_pb2.FetchRequest(
            stream=STREAM, consumer="c", batch=2, ack_seqs=[2, 9, 1]))
        assert [m.seq for m in second.messages] == [3, 4]
        assert second.acks.applied == 2
        assert [(r.seq, r.error.reason) for r in second.acks.results] == [
            (2, ""), (9, "NOT_DELIVERED"), (1, "")]
        last = await stub.Ack(consumers_pb2.AckRequest(stream=STREAM, consumer="c",
                                                       seqs=[3, 4]))
        assert last.applied == 2
    assert saved_acks(env) == {1, 2, 3, 4}  # the Ack's save covers the carried ones


@run_async
async def test_service_answers_settling_calls_per_seq_in_request_order() -> None:
    env = make_env("a", "a", "a")
    await env.create()
    await env.fetch(batch=2)
    async with serving(env) as stub:
        acked = await stub.Ack(consumers_pb2.AckRequest(stream=STREAM, consumer="c",
                                                        seqs=[7, 1, 3, 1]))
        assert acked.applied == 1
        assert [(r.seq, r.error.reason) for r in acked.results] == [
            (7, "NOT_DELIVERED"), (1, ""), (3, "NOT_DELIVERED"), (1, "")]
        assert not acked.results[1].HasField("error")
        assert acked.results[0].error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        nak = await stub.Nak(consumers_pb2.NakRequest(stream=STREAM, consumer="c", seqs=[2, 9]))
        assert (nak.applied, [r.error.reason for r in nak.results]) == (1, ["", "NOT_DELIVERED"])


async def events(stub: AioStub, **fields: Any
                 ) -> AsyncGenerator[consumers_pb2.SubscribeEvent, None]:
    async for event in stub.Subscribe(consumers_pb2.SubscribeRequest(stream=STREAM,
                                                                     consumer="c", **fields)):
        yield event


@run_async
async def test_subscribe_stop_when_empty_ends_drained() -> None:
    env = make_env("a", "a", "a")
    await env.create()
    async with serving(env) as stub:
        received = [event async for event in events(stub, batch=2, stop_when_empty=True)]
    assert [e.message.seq for e in received[:-1]] == [1, 2, 3]
    assert received[-1].stopped.reason == "drained"


@run_async
async def test_subscribe_sends_heartbeats_when_idle_and_messages_when_woken() -> None:
    env = make_env("a")
    await env.create()
    async with serving(env) as stub:
        stream = events(stub, heartbeat_ms=limits.subscribe_heartbeat_ms_min)
        assert (await anext(stream)).message.seq == 1
        heartbeat = (await anext(stream)).heartbeat
        assert heartbeat.commit_seq == 1
        env.log.append("a")
        event = await anext(stream)
        while event.HasField("heartbeat"):
            event = await anext(stream)
        assert event.message.seq == 2
        await stream.aclose()


@pytest.mark.parametrize(("rule", "reason"), [("consumer", "consumer deleted"),
                                              ("stream", "stream deleted")])
@run_async
async def test_subscribe_stops_when_its_consumer_or_stream_goes_away(rule: str,
                                                                     reason: str) -> None:
    env = make_env()
    await env.create()
    async with serving(env) as stub:
        stream = events(stub)
        receiving = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0.05)
        if rule == "consumer":
            await env.manager.delete(STREAM, "c")
        else:
            env.manager.detach_stream(STREAM)
        event = await asyncio.wait_for(receiving, 2)
        assert event.stopped.reason == reason
        await stream.aclose()
