"""The transaction janitor of a node: every limits.txn_janitor_period_ms it looks at each half
stream this node leads (transactions_layout.py) and, per prepared message still stored,
applies `janitor_action`: rolls back one past its timeout (or whose producer was asked
limits.txn_checks_max times), finishes a commit whose writer died between its decision and its
landing, purges one whose end was recorded but not yet purged.

It keeps nothing but what the half stream holds (the check counts aside, which start again from
0 on a new primary), so after a failover the new primary's janitor goes on where the old one
stopped; and every decision goes through the same first-record-wins write as a client's, so a
client racing the janitor sees one outcome. Started and stopped by the node (server.py).
"""

from __future__ import annotations

import asyncio
import logging
import time

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops import transactions_layout as layout
from raftlog.node.ops.transactions import TransactionOps
from raftlog.node.transport.calls import Call

log = logging.getLogger(__name__)


def _call() -> Call:
    return Call(deadline=time.monotonic() + limits.forward_timeout_s_default)


class TransactionJanitor:
    def __init__(self, transactions: TransactionOps, *, clock: Clock) -> None:
        self._transactions = transactions
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self.ended = 0  # transactions this janitor rolled back or finished (for tests and logs)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run_forever(),
                                                            name="transaction janitor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run_forever(self) -> None:
        while True:
            await asyncio.sleep(limits.txn_janitor_period_ms / 1000)
            for half in self._transactions.half_streams_here():
                try:
                    await self.sweep(half)
                except RaftlogError as err:  # failing over, target away: next round
                    log.info("transaction janitor on %s: %s: %s", half, err.reason.name,
                             err.message)
                except Exception:
                    log.exception("transaction janitor on %s failed", half)

    async def sweep(self, half: str) -> int:
        """One look at `half`: the transactions it ended."""
        ended = 0
        found = await self._transactions.prepared_in(half, limit=limits.txn_janitor_batch_max,
                                                     via=_call())
        for txn, record in found:
            action = layout.janitor_action(
                txn, record, now_ms=self._clock.wall_ms(),
                checks=self._transactions.checks.of(txn.txn_id))
            if action is None:
                continue
            try:
                await self._act(txn, action)
            except RaftlogError as err:
                log.info("transaction %s: %s failed: %s: %s", txn.txn_id, action.value,
                         err.reason.name, err.message)
                continue
            ended += 1
        self.ended += ended
        return ended

    async def _act(self, txn: layout.Prepared, action: layout.JanitorAction) -> None:
        if action is layout.JanitorAction.FINISH_COMMIT:
            await self._transactions.commit(txn.txn_id, _call())
        elif action is layout.JanitorAction.PURGE:
            await self._transactions.purge_ended(txn, _call())
        else:
            by = "timeout" if action is layout.JanitorAction.ROLLBACK_TIMEOUT else "checks"
            log.info("transaction %s rolled back (%s)", txn.txn_id, by)
            try:
                await self._transactions.rollback(txn.txn_id, _call(), by=by)
            except RaftlogError as err:
                if err.reason != Reason.TRANSACTION_ENDED:
                    raise
                # A commit won the race: it finishes on its own (or next round).
