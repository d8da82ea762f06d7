"""The Telemetry stream of apache.rocketmq.v2 (a mixin of RocketMQService, rocketmq_v2.py): the
settings answer each client waits for (a producer's body limit, type check and send retry
policy; a consumer's batch size, long poll, FIFO flag and its group's attempts with their
back-off), and, for producers, the questions about their open transactions
(RecoverOrphanedTransactionCommand), asked every limits.rocketmq_txn_check_period_ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from raftlog.base import limits, topics
from raftlog.base.errors import RaftlogError
from raftlog.compat import rocketmq_v2_definition_pb2 as rmq
from raftlog.compat import rocketmq_v2_service_pb2 as svc
from raftlog.node.ops import rocketmq, rocketmq_dlq
from raftlog.node.ops.operations import Operations
from raftlog.node.ops.rocketmq import GroupSettings, RocketGroups
from raftlog.node.transport.calls import Call
from raftlog.v1 import types_pb2

Context = grpc.aio.ServicerContext[Any, Any]
log = logging.getLogger(__name__)
OK = rmq.Status(code=rmq.OK, message="OK")  # type: ignore[arg-type]


def _send_retry_policy(policy: rmq.RetryPolicy) -> None:
    """Fills in the exponential back-off RocketMQ's proxy gives every producer (a client that
    finds none in the settings answer, like rocketmq-client-nodejs, fails at start-up)."""
    policy.max_attempts = limits.rocketmq_send_attempts_max
    backoff = policy.exponential_backoff
    backoff.initial.FromMilliseconds(limits.rocketmq_send_backoff_initial_ms)
    backoff.max.FromMilliseconds(limits.rocketmq_send_backoff_max_ms)
    backoff.multiplier = limits.rocketmq_send_backoff_multiplier


class TelemetryCalls:
    """Set by RocketMQService."""

    _ops: Operations
    _groups: RocketGroups

    def _message(self, message: types_pb2.Message, topic: rmq.Resource, partition: int,
                 invisible_ms: int) -> rmq.Message:
        raise NotImplementedError

    async def Telemetry(self, request_iterator: AsyncIterator[svc.TelemetryCommand],
                        context: Context) -> AsyncIterator[svc.TelemetryCommand]:
        """Answers each Settings the client sends with the settings it must apply: its own,
        with the producer's body limit and type check filled in."""
        via = Call.from_grpc(context)
        out: asyncio.Queue[svc.TelemetryCommand | None] = asyncio.Queue()
        producing: set[str] = set()  # the raftlog topics of a producer on this stream
        checker: list[asyncio.Task[None]] = []

        async def read() -> None:
            try:
                async for command in request_iterator:
                    if command.WhichOneof("command") != "settings":
                        continue  # answers to commands sent to the client
                    settings = rmq.Settings()
                    settings.CopyFrom(command.settings)
                    if settings.WhichOneof("pub_sub") == "publishing":
                        settings.publishing.max_body_size = limits.rocketmq_max_body_bytes
                        settings.publishing.validate_message_type = True
                        _send_retry_policy(settings.backoff_policy)  # Node.js needs it
                        with contextlib.suppress(RaftlogError):
                            producing.update(rocketmq.raftlog_topic(t.name)
                                             for t in settings.publishing.topics)
                        if not checker:
                            checker.append(asyncio.get_running_loop().create_task(
                                self._ask_about_orphans(producing, out, via)))
                    elif settings.WhichOneof("pub_sub") == "subscription":
                        settings.subscription.receive_batch_size = limits.rocketmq_batch_max
                        await self._group_settings(settings, via)
                    await out.put(svc.TelemetryCommand(status=OK, settings=settings))
            finally:
                await out.put(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while (command := await out.get()) is not None:
                yield command
        finally:
            for task in (reader, *checker):
                task.cancel()
            await asyncio.gather(reader, *checker, return_exceptions=True)

    async def _ask_about_orphans(self, producing: set[str],
                                 out: asyncio.Queue[svc.TelemetryCommand | None],
                                 via: Call) -> None:
        """Every limits.rocketmq_txn_check_period_ms: each transaction of this producer's
        topics still open limits.rocketmq_txn_check_after_ms after its prepare (in the half
        streams this node leads) is sent to the producer, whose checker answers with
        EndTransaction; after limits.txn_checks_max questions the janitor rolls it back."""
        while True:
            await asyncio.sleep(limits.rocketmq_txn_check_period_ms / 1000)
            try:
                open_ones = await self._ops.transactions.orphans(
                    limits.rocketmq_txn_check_after_ms, via)
                for txn in open_ones:
                    where = topics.parse_partition_stream(txn.stream)
                    if where is None or where[0] not in producing:
                        continue
                    message = await self._ops.transactions.prepared_message(txn.txn_id, via)
                    recovered = self._message(message, rmq.Resource(
                        name=rocketmq.rocketmq_topic(where[0])), where[1], 0)
                    recovered.system_properties.message_type = rmq.TRANSACTION
                    self._ops.transactions.note_check(txn.txn_id)
                    await out.put(svc.TelemetryCommand(
                        recover_orphaned_transaction_command=svc.RecoverOrphanedTransactionCommand(
                            message=recovered, transaction_id=txn.txn_id)))
            except RaftlogError as err:  # ended meanwhile, or a node between owners: next round
                log.info("asking a producer about open transactions: %s", err.message)

    async def _group_settings(self, settings: rmq.Settings, via: Call) -> None:
        """A consumer's settings answer: whether its group is FIFO, and (for push consumers,
        which retry through ChangeInvisibleDuration and move a message to the dead-letter
        queue themselves) the group's attempts with RocketMQ's retry back-off."""
        subscription = settings.subscription
        found: GroupSettings | None = None
        with contextlib.suppress(RaftlogError):  # no such group or topic yet: the defaults
            group = rocketmq.group_name(subscription.group.name)
            for entry in subscription.subscriptions:
                found = await self._groups.lookup(rocketmq.raftlog_topic(entry.topic.name),
                                                  group, via)
                if found is not None:
                    break
        subscription.fifo = bool(found and found.fifo)
        if not subscription.HasField("long_polling_timeout"):
            subscription.long_polling_timeout.FromMilliseconds(limits.rocketmq_long_poll_ms_max)
        attempts = found.attempts if found else limits.rocketmq_attempts_default
        policy = settings.backoff_policy
        policy.max_attempts = attempts
        policy.customized_backoff.next.clear()
        for attempt in range(1, attempts + 1):
            if found and found.backoff_ms:  # the group's own, its last value repeating
                delay_ms = found.backoff_ms[min(attempt, len(found.backoff_ms)) - 1]
            else:
                delay_ms = rocketmq_dlq.nack_delay_ms(attempt)
            policy.customized_backoff.next.add().FromMilliseconds(delay_ms)
