"""Which open RocketMQ transaction to put to its producer next, for a front-end that asks one
question per call (the v1 PollCommand; docs/rocketmq-v1.md).

A transaction is due a question once it has been open for its recovery period (the
`orphaned_transaction_recovery_period` its send named, when that send came through this node;
else limits.rocketmq_txn_check_after_ms), and again every limits.rocketmq_txn_check_period_ms
while it stays open. The transactions looked at are the open ones of the producer's topics in
the whole cluster (ListTransactions by topic, routed to each half stream's primary), not only
the half streams this node leads: a v1 client calls the one node it was configured with.

The recovery periods and the time of the last question are kept in memory on this node, at
most limits.rocketmq_v1_txns_max of each (then cleared: the defaults apply again). Each
question is counted with `note_check` on this node; the janitor that rolls a transaction back
after limits.txn_checks_max questions counts on the half stream's primary, so questions asked
through other nodes let a transaction run to its timeout instead.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from raftlog.base import limits, topics
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError
from raftlog.node.ops.transactions import TransactionOps
from raftlog.node.transport.calls import Call
from raftlog.v1 import transactions_pb2, types_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Orphan:
    """A transaction to ask about: the message it would commit, and its queue."""

    txn_id: str
    topic: str  # the raftlog topic
    queue: int
    message: types_pb2.Message


class OrphanQuestions:
    def __init__(self, transactions: TransactionOps, *, clock: Clock) -> None:
        self._transactions = transactions
        self._clock = clock
        self._periods: dict[str, int] = {}  # txn id -> its recovery period (ms)
        self._asked: dict[str, int] = {}  # txn id -> when its producer was last asked (unix ms)

    def remember_period(self, txn_id: str, period_ms: int) -> None:
        """The recovery period a transactional send named (0: none, the default applies)."""
        if period_ms <= 0:
            return
        if len(self._periods) >= limits.rocketmq_v1_txns_max:
            self._periods.clear()
        self._periods[txn_id] = period_ms

    def forget(self, txn_id: str) -> None:
        """The transaction ended."""
        self._periods.pop(txn_id, None)
        self._asked.pop(txn_id, None)

    def _due_ms(self, txn: transactions_pb2.TransactionInfo) -> int:
        first = txn.prepared_ms + self._periods.get(txn.txn_id,
                                                    limits.rocketmq_txn_check_after_ms)
        asked = self._asked.get(txn.txn_id)
        return first if asked is None else max(first, asked + limits.rocketmq_txn_check_period_ms)

    async def next(self, topic_names: Iterable[str], via: Call) -> tuple[Orphan | None, int]:
        """The oldest open transaction of these raftlog topics that is due a question, counted
        as asked; else None and how long (ms, at most limits.rocketmq_txn_check_period_ms)
        until the next one known falls due. A topic that cannot be listed now (missing,
        between primaries) is passed over and logged."""
        now_ms = self._clock.wall_ms()
        wait_ms = limits.rocketmq_txn_check_period_ms
        for topic in topic_names:
            try:
                listed = await self._transactions.list_transactions(
                    transactions_pb2.ListTransactionsRequest(topic=topic), via)
            except RaftlogError as err:
                log.info("open transactions of topic %s: %s", topic, err.message)
                continue
            for txn in listed.transactions:
                if txn.committing:
                    continue  # decided; the half stream's primary finishes it
                due_ms = self._due_ms(txn)
                if due_ms > now_ms:
                    wait_ms = min(wait_ms, due_ms - now_ms)
                    continue
                where = topics.parse_partition_stream(txn.stream)
                try:
                    message = await self._transactions.prepared_message(txn.txn_id, via)
                except RaftlogError as err:  # ended meanwhile
                    log.info("transaction %s: %s", txn.txn_id, err.message)
                    continue
                if len(self._asked) >= limits.rocketmq_v1_txns_max:
                    self._asked.clear()
                self._asked[txn.txn_id] = now_ms
                self._transactions.note_check(txn.txn_id)
                return Orphan(txn_id=txn.txn_id, topic=topic,
                              queue=where[1] if where is not None else 0,
                              message=message), 0
        return None, max(wait_ms, 0)
