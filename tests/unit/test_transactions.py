"""Transactions without a node (node/ops/transactions*.py): the id and half-stream names, the
janitor's rule as a table, and the flows over the in-memory engine with a fake clock: a
prepare out of sight, commit once however often it is asked, rollback, the refusals, the
janitor's timeout, and a commit finishing another's decision without a second copy. No disk,
no sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest

from raftlog.base import limits
from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.memory_store import MemoryMessageStore
from raftlog.node.engine.streams import NoConsumers, StreamEngine
from raftlog.node.ops import transactions_layout as layout
from raftlog.node.ops.consumers import ConsumerOps
from raftlog.node.ops.metadata import LocalStreamMetadata
from raftlog.node.ops.partitions import TopicOps
from raftlog.node.ops.route import LocalRoute
from raftlog.node.ops.streams import StreamOps
from raftlog.node.ops.transactions import TransactionOps
from raftlog.node.ops.transactions_janitor import TransactionJanitor
from raftlog.node.transport.calls import Call
from raftlog.v1 import streams_pb2, transactions_pb2, types_pb2

VIA = Call()

# ---------------------------------------------------------------------- names and ids


@pytest.mark.parametrize("target", ["orders", "a", "x" * limits.name_bytes_max,
                                    "TOPIC_orders_deu_p3"])
def test_txn_id_names_its_half_stream_and_seq(target: str) -> None:
    half = layout.half_stream(target)
    assert half.startswith(layout.HALF_PREFIX)
    assert len(half.encode()) <= limits.name_bytes_max
    for seq in (1, 17, 2**63):
        assert layout.parse_txn_id(layout.txn_id(half=half, seq=seq)) == (half, seq)


def test_a_short_target_keeps_its_name_and_long_ones_stay_apart() -> None:
    assert layout.half_stream("orders") == "TXN_orders"
    long_a, long_b = "a" * 127 + "b", "a" * 127 + "c"
    assert layout.half_stream(long_a) != layout.half_stream(long_b)
    assert layout.half_stream(long_a) == layout.half_stream(long_a)


@pytest.mark.parametrize("text", ["", "17", "orders:1", "TXN_orders", "TXN_orders:",
                                  "TXN_orders:0", "TXN_orders:01", "TXN_orders:-1",
                                  "TXN_orders:1x", "TXN_ord.ers:1", "TXN_orders:+1"])
def test_a_malformed_id_is_invalid_argument(text: str) -> None:
    with pytest.raises(RaftlogError) as info:
        layout.parse_txn_id(text)
    assert info.value.status_name == "INVALID_ARGUMENT"


def test_only_a_stream_made_as_a_half_stream_counts_as_one() -> None:
    made = layout.half_config(types_pb2.StreamConfig(name="orders", replicas=3))
    assert made.name == "TXN_orders" and made.replicas == 3
    assert made.max_age_ms == limits.txn_record_age_ms > limits.txn_timeout_ms_max
    assert layout.is_half_config(made)
    assert not layout.is_half_config(types_pb2.StreamConfig(name="TXN_orders"))


# ---------------------------------------------------------------------- the janitor's rule

PREPARED_MS = 1_000_000


def prepared(timeout_ms: int = 60_000) -> layout.Prepared:
    return layout.Prepared(txn_id="TXN_s:1", half_seq=1, half_subject="txn.half.ab",
                           target="s", subject="s", msg_id="", timeout_ms=timeout_ms,
                           prepared_ms=PREPARED_MS, payload_bytes=1)


def record(decision: layout.Decision) -> layout.Record:
    return layout.Record(decision=decision, record_seq=2)


@pytest.mark.parametrize(("decided", "age_ms", "checks", "action"), [
    (None, 0, 0, None),
    (None, 59_999, 0, None),
    (None, 60_000, 0, layout.JanitorAction.ROLLBACK_TIMEOUT),
    (None, 10, limits.txn_checks_max - 1, None),
    (None, 10, limits.txn_checks_max, layout.JanitorAction.ROLLBACK_CHECKS),
    (layout.Decision.COMMIT, 0, 0, layout.JanitorAction.FINISH_COMMIT),
    (layout.Decision.COMMIT, 10**9, 99, layout.JanitorAction.FINISH_COMMIT),
    (layout.Decision.LANDED, 10**9, 0, layout.JanitorAction.PURGE),
    (layout.Decision.FAILED, 0, 0, layout.JanitorAction.PURGE),
    (layout.Decision.ROLLBACK, 0, 0, layout.JanitorAction.PURGE),
])
def test_janitor_action(decided: layout.Decision | None, age_ms: int, checks: int,
                        action: layout.JanitorAction | None) -> None:
    found = None if decided is None else record(decided)
    assert layout.janitor_action(prepared(), found, now_ms=PREPARED_MS + age_ms,
                                 checks=checks) is action


def test_records_read_back_as_written() -> None:
    written = layout.Record(decision=layout.Decision.LANDED, record_seq=0, target_seq=42,
                            stream="orders", by="client")
    entry = layout.record_entry(7, written, half="TXN_orders", expected_subject_seq=5)
    assert entry.subject == "txn.end.7" and entry.expected_last_subject_seq == 5
    back = layout.parse_record(types_pb2.Message(seq=9, payload=entry.payload))
    assert back == layout.Record(decision=layout.Decision.LANDED, record_seq=9, target_seq=42,
                                 stream="orders", by="client")
    with pytest.raises(RaftlogError) as info:
        layout.parse_record(types_pb2.Message(seq=9, payload=b"{}"))
    assert info.value.reason is Reason.INTERNAL


# ---------------------------------------------------------------------- flows in memory


class Node:
    """One node on its own over the in-memory engine, its clock a FakeClock."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.engine = StreamEngine(store=MemoryMessageStore(), clock=self.clock,
                                   consumers=NoConsumers())
        self.engine.load()
        self.streams = StreamOps(self.engine, metadata=LocalStreamMetadata(self.engine),
                                 where=LocalRoute())
        topics = TopicOps(self.streams, cast(ConsumerOps, None), where=LocalRoute(),
                          consumer_state=None, clock=self.clock)
        self.txns = TransactionOps(self.streams, topics, engine=self.engine, clock=self.clock)
        self.janitor = TransactionJanitor(self.txns, clock=self.clock)

    async def prepare(self, payload: bytes = b"p", **fields: Any
                      ) -> transactions_pb2.PrepareResponse:
        fields.setdefault("stream", "orders")
        fields.setdefault("subject", "orders.eu")
        return await self.txns.prepare(transactions_pb2.PrepareRequest(payload=payload,
                                                                       **fields), VIA)

    def payloads(self, stream: str = "orders") -> list[bytes]:
        s = self.engine.get(stream)
        return [s.get_message(e.seq).payload for e in s.scan(from_seq=1, limit=100_000)]


def run(body: Callable[[Node], Awaitable[None]]) -> None:
    async def main() -> None:
        node = Node()
        await node.engine.create(types_pb2.StreamConfig(name="orders",
                                                        subjects=["orders.>"]))
        await asyncio.wait_for(body(node), 30)

    asyncio.run(main())


async def expect(call: Awaitable[Any], reason: Reason) -> RaftlogError:
    with pytest.raises(RaftlogError) as info:
        await call
    assert info.value.reason is reason, info.value
    return info.value


def test_a_prepared_message_is_out_of_sight_until_its_commit_which_stores_it_once() -> None:
    async def body(node: Node) -> None:
        prepared_txn = await node.prepare(b"hello", headers=[types_pb2.Header(key="k",
                                                                              value="v")])
        assert prepared_txn.stream == "orders" and node.payloads() == []
        assert prepared_txn.expires_ms - prepared_txn.prepared_ms == \
            limits.txn_timeout_ms_default
        first = await node.txns.commit(prepared_txn.txn_id, VIA)
        again = await node.txns.commit(prepared_txn.txn_id, VIA)
        assert (first.seq, first.duplicate) == (1, False)
        assert (again.seq, again.stream, again.duplicate) == (1, "orders", True)
        assert node.payloads() == [b"hello"]
        stored = node.engine.get("orders").get_message(1)
        headers = {h.key: h.value for h in stored.headers}
        assert headers == {"k": "v", layout.ID_HEADER: prepared_txn.txn_id}
        assert stored.subject == "orders.eu"
        # The prepared message is gone; only the decision records stay.
        half = node.engine.get("TXN_orders")
        assert [e.subject for e in half.scan(from_seq=1, limit=100)] == ["txn.end.1"] * 2
        await expect(node.txns.rollback(prepared_txn.txn_id, VIA), Reason.TRANSACTION_ENDED)

    run(body)


def test_rollback_discards_and_a_later_commit_finds_nothing() -> None:
    async def body(node: Node) -> None:
        txn = await node.prepare()
        assert (await node.txns.rollback(txn.txn_id, VIA)).duplicate is False
        assert (await node.txns.rollback(txn.txn_id, VIA)).duplicate is True
        await expect(node.txns.commit(txn.txn_id, VIA), Reason.TRANSACTION_NOT_FOUND)
        assert node.payloads() == []
        listed = await node.txns.list_transactions(transactions_pb2.ListTransactionsRequest(), VIA)
        assert list(listed.transactions) == []

    run(body)


def test_unknown_ids_and_bad_prepares_are_refused() -> None:
    async def body(node: Node) -> None:
        await expect(node.txns.commit("TXN_orders:1", VIA), Reason.TRANSACTION_NOT_FOUND)
        await expect(node.txns.rollback("TXN_nothing:1", VIA), Reason.TRANSACTION_NOT_FOUND)
        await expect(node.txns.commit("nonsense", VIA), Reason.INVALID_ARGUMENT)
        txn = await node.prepare()
        decided = (await node.txns.commit(txn.txn_id, VIA)).seq
        assert decided == 1
        # seq 2 of the half stream is a decision record, not a prepared message
        await expect(node.txns.commit("TXN_orders:2", VIA), Reason.TRANSACTION_NOT_FOUND)
        await expect(node.prepare(subject="payments.eu"), Reason.SUBJECT_NOT_IN_STREAM)
        await expect(node.prepare(stream="missing"), Reason.STREAM_NOT_FOUND)
        await expect(node.prepare(stream="TXN_orders"), Reason.INVALID_ARGUMENT)
        await expect(node.prepare(stream="", topic=""), Reason.INVALID_ARGUMENT)
        await expect(node.prepare(timeout_ms=limits.txn_timeout_ms_max + 1),
                     Reason.INVALID_ARGUMENT)
        await expect(node.prepare(b"x" * (limits.message_bytes_max + 1)),
                     Reason.MESSAGE_TOO_LARGE)
        assert node.payloads() == [b"p"]

    run(body)


def test_listing_shows_open_transactions_with_their_age_and_checks() -> None:
    async def body(node: Node) -> None:
        old = await node.prepare(b"old", msg_id="m-1")
        node.clock.advance(5)
        young = await node.prepare(b"young")
        node.txns.note_check(old.txn_id)
        listed = await node.txns.list_transactions(transactions_pb2.ListTransactionsRequest(
            stream="orders"), VIA)
        assert [t.txn_id for t in listed.transactions] == [old.txn_id, young.txn_id]
        first = listed.transactions[0]
        assert (first.age_ms, first.checks, first.msg_id, first.payload_bytes,
                first.subject) == (5_000, 1, "m-1", 3, "orders.eu")
        older = await node.txns.list_transactions(transactions_pb2.ListTransactionsRequest(
            older_than_ms=1_000), VIA)
        assert [t.txn_id for t in older.transactions] == [old.txn_id]
        assert [t.txn_id for t in await node.txns.orphans(1_000, VIA)] == [old.txn_id]
        shown = await node.txns.prepared_message(old.txn_id, VIA)
        assert (shown.stream, shown.subject, shown.payload, shown.msg_id) == (
            "orders", "orders.eu", b"old", "m-1")
        assert [(h.key, h.value) for h in shown.headers] == [(layout.ID_HEADER, old.txn_id)]
        # A prepare repeated with its msg_id is the same transaction.
        assert (await node.prepare(b"old", msg_id="m-1")).txn_id == old.txn_id

    run(body)


def test_the_janitor_rolls_back_what_timed_out_or_was_checked_too_often() -> None:
    async def body(node: Node) -> None:
        short = await node.prepare(b"short", timeout_ms=1_000)
        checked = await node.prepare(b"checked")
        kept = await node.prepare(b"kept")
        assert node.txns.half_streams_here() == ["TXN_orders"]
        assert await node.janitor.sweep("TXN_orders") == 0
        for _ in range(limits.txn_checks_max):
            node.txns.note_check(checked.txn_id)
        node.clock.advance(1)
        assert await node.janitor.sweep("TXN_orders") == 2
        await expect(node.txns.commit(short.txn_id, VIA), Reason.TRANSACTION_NOT_FOUND)
        await expect(node.txns.commit(checked.txn_id, VIA), Reason.TRANSACTION_NOT_FOUND)
        assert (await node.txns.commit(kept.txn_id, VIA)).seq == 1
        assert node.payloads() == [b"kept"]
        assert await node.janitor.sweep("TXN_orders") == 0

    run(body)


async def decide_commit_and_die(node: Node, txn_id: str, *, landed: bool) -> None:
    """What a committer leaves when it dies after writing its decision (and maybe after
    appending the message, before recording where)."""
    half, seq = layout.parse_txn_id(txn_id)
    await node.streams.publish(layout.record_entry(seq, layout.Record(
        decision=layout.Decision.COMMIT, record_seq=0), half=half, expected_subject_seq=0),
        VIA)
    if landed:
        message = node.engine.get(half).get_message(seq)
        found = layout.prepared(message, half=half)
        assert found is not None
        await node.streams.publish(layout.landing_entry(message, found), VIA)


@pytest.mark.parametrize("landed", [False, True])
def test_a_commit_after_a_dead_committer_stores_the_message_once(landed: bool) -> None:
    async def body(node: Node) -> None:
        await node.engine.publish("orders", [streams_pb2.PublishEntry(subject="orders.x",
                                                                      payload=b"before")])
        txn = await node.prepare(b"t")
        await decide_commit_and_die(node, txn.txn_id, landed=landed)
        # Past the dedupe window: only the read-back can tell the copy is there.
        node.clock.advance(limits.dedupe_window_ms_default / 1000 + 1)
        listed = await node.txns.list_transactions(transactions_pb2.ListTransactionsRequest(), VIA)
        assert [t.committing for t in listed.transactions] == [True]
        await expect(node.txns.rollback(txn.txn_id, VIA), Reason.TRANSACTION_ENDED)
        reply = await node.txns.commit(txn.txn_id, VIA)
        assert (reply.seq, reply.duplicate) == (2, landed)
        assert node.payloads() == [b"before", b"t"]
        assert (await node.txns.commit(txn.txn_id, VIA)).seq == 2

    run(body)


def test_the_janitor_finishes_a_commit_whose_writer_died() -> None:
    async def body(node: Node) -> None:
        txn = await node.prepare(b"t")
        await decide_commit_and_die(node, txn.txn_id, landed=False)
        assert await node.janitor.sweep("TXN_orders") == 1
        assert node.payloads() == [b"t"]
        assert (await node.txns.commit(txn.txn_id, VIA)).duplicate is True

    run(body)


def test_a_target_that_refuses_for_good_ends_the_transaction() -> None:
    async def body(node: Node) -> None:
        txn = await node.prepare(b"t")
        await node.engine.update(streams_pb2.UpdateStreamRequest(
            name="orders", subjects=streams_pb2.SubjectList(subjects=["other.>"])))
        await expect(node.txns.commit(txn.txn_id, VIA), Reason.SUBJECT_NOT_IN_STREAM)
        await expect(node.txns.commit(txn.txn_id, VIA), Reason.SUBJECT_NOT_IN_STREAM)
        assert node.payloads() == []
        listed = await node.txns.list_transactions(transactions_pb2.ListTransactionsRequest(), VIA)
        assert list(listed.transactions) == []

    run(body)


def test_the_first_decision_wins_and_the_second_reads_it() -> None:
    async def body(node: Node) -> None:
        txn = await node.prepare()
        half, seq = layout.parse_txn_id(txn.txn_id)
        wanted = {d: layout.Record(decision=d, record_seq=0, by="test")
                  for d in (layout.Decision.ROLLBACK, layout.Decision.COMMIT)}
        first, mine = await node.txns._decide(half, seq, wanted[layout.Decision.ROLLBACK], VIA)
        assert mine and first.decision is layout.Decision.ROLLBACK
        second, mine = await node.txns._decide(half, seq, wanted[layout.Decision.COMMIT], VIA)
        assert not mine and second == first
        await expect(node.txns.commit(txn.txn_id, VIA), Reason.TRANSACTION_NOT_FOUND)

    run(body)
