"""Apache RocketMQ's first gRPC protocol (apache.rocketmq.v1.MessagingService, the seed's) on the
client port, over raftlog topics: a RocketMQ topic is a raftlog topic, a queue a partition, a
group a topic group (node/ops/rocketmq.py holds the names, headers and receipt handles;
ops/rocketmq_receive.py the POP receive; ops/rocketmq_dlq.py the back-off and the dead-letter
topic). What is served, RPC by RPC: docs/rocketmq-v1.md.

Delayed sends (a `delivery_timestamp` or a `delay_level`, ops/rocketmq_time.py) are scheduled
topic publishes (docs/scheduled.md); a TRANSACTION send prepares a raftlog transaction on its
queue and EndTransaction commits or rolls it back (docs/transactions.md); PollCommand hands a
producer one open transaction of its topics at a time to decide (ops/rocketmq_orphans.py),
else it holds and answers Noop.

Errors follow the v1 server: every business outcome is `common.status`, a google.rpc.Status
whose code is a google.rpc.Code number (a RaftlogError becomes the code of its gRPC status,
with its reason in `common.error_info`), and the gRPC call ends OK. Only an unexpected failure
ends the call with a gRPC error (INTERNAL, logged).

Addressing follows the RocketMQ proxy: QueryRoute and QueryAssignment name one broker whose
endpoints are the ones the request came with, so a client keeps calling the node it was
configured with and that node forwards to each queue's primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import timestamp_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import ERROR_DOMAIN, RaftlogError, Reason
from raftlog.compat import rocketmq_v1_definition_pb2 as rmq
from raftlog.compat import rocketmq_v1_service_pb2 as svc
from raftlog.compat import rocketmq_v1_service_pb2_grpc as svc_grpc
from raftlog.node.ops import rocketmq, rocketmq_dlq, rocketmq_time, schedule_layout
from raftlog.node.ops import transactions_layout as txn_layout
from raftlog.node.ops.operations import Operations
from raftlog.node.ops.partitions import partition_for
from raftlog.node.ops.rocketmq import Receipt, RocketGroups
from raftlog.node.ops.rocketmq_orphans import Orphan, OrphanQuestions
from raftlog.node.ops.rocketmq_receive import ANY_QUEUE, Receive, Receiver, header
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.v1 import consumers_pb2, streams_pb2, topics_pb2, transactions_pb2, types_pb2

Context = grpc.aio.ServicerContext[Any, Any]
Method = Callable[[Any, Any, Context], Awaitable[Any]]

SERVICE_NAME = svc.DESCRIPTOR.services_by_name["MessagingService"].full_name
BROKER_NAME = "raftlog"  # the one broker routes and assignments name

# User attribute keys RocketMQ keeps for itself (MessageConst); a send using one is refused.
RESERVED_KEYS = frozenset({
    "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID", "TRAN_MSG",
    "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG",
    "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME", "MSG_REGION", "TRACE_ON", "UNIQ_KEY",
    "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME",
    "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO", "EXTEND_UNIQ_INFO", "INSTANCE_ID",
    "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", "CLUSTER",
    "MSG_TYPE", "__STARTDELIVERTIME", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS",
    "SHARDING_KEY", "__transactionId__", "CHECK_IMMUNITY_TIME_IN_SECONDS",
})
_AS_INVALID = frozenset({Reason.INVALID_NAME, Reason.PARTITION_OUT_OF_RANGE,
                         Reason.NOT_DELIVERED, Reason.MESSAGE_TOO_LARGE})
# An EndTransaction whose id names no transaction that can still take the resolution: one never
# prepared, rolled back, forgotten, or (for a rollback) committed. All INVALID_ARGUMENT, the
# class of v2's INVALID_TRANSACTION_ID; error_info keeps the raftlog reason apart.
_UNKNOWN_TXN = frozenset({Reason.TRANSACTION_NOT_FOUND, Reason.TRANSACTION_ENDED,
                          Reason.INVALID_ARGUMENT})


class _Refused(Exception):
    """A request refused with a google.rpc code before (or instead of) any operation."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _invalid(message: str) -> _Refused:
    return _Refused(code_pb2.INVALID_ARGUMENT, message)


def _common(code: int = code_pb2.OK, message: str = "OK") -> svc.ResponseCommon:
    return svc.ResponseCommon(status=status_pb2.Status(code=code, message=message))


def _error_common(err: RaftlogError, code: int | None = None) -> svc.ResponseCommon:
    if code is None:
        code = (code_pb2.INVALID_ARGUMENT if err.reason in _AS_INVALID
                else getattr(code_pb2, err.status_name, code_pb2.INTERNAL))
    common = _common(code, err.message)
    common.error_info.CopyFrom(error_details_pb2.ErrorInfo(
        reason=err.reason.name, domain=ERROR_DOMAIN, metadata=err.metadata))
    return common


def answered(response: type[Any]) -> Callable[[Method], Method]:
    """A unary call whose refusals and RaftlogErrors become `response(common=...)`."""
    def wrap(method: Method) -> Method:
        @functools.wraps(method)
        async def call(self: Any, request: Any, context: Context) -> Any:
            try:
                return await method(self, request, context)
            except _Refused as refused:
                return response(common=_common(refused.code, refused.message))
            except RaftlogError as err:
                return response(common=_error_common(err))
        return rpc.unary(call)  # anything else: a gRPC INTERNAL, logged
    return wrap


def _ms(duration: Any) -> int:
    return int(duration.seconds) * 1000 + int(duration.nanos) // 1_000_000


def _wait_ms(request: Any, field: str, via: Call) -> int:
    """A long poll's length: the request's await time if any, at most
    limits.rocketmq_long_poll_ms_max, ending limits.rocketmq_poll_reserve_ms before the
    caller's deadline."""
    wait_ms = limits.rocketmq_long_poll_ms_max
    if request.HasField(field):
        wait_ms = min(wait_ms, _ms(getattr(request, field)))
    remaining = via.remaining_s()
    if remaining is not None:
        wait_ms = min(wait_ms, int(remaining * 1000) - limits.rocketmq_poll_reserve_ms)
    return max(wait_ms, 0)


def _tags(expression: rmq.FilterExpression) -> frozenset[str] | None:
    """The tags asked for; None: every message."""
    if expression.type == rmq.SQL:
        raise _invalid("SQL92 filters are not supported; use a TAG filter (\"*\" or \"a || b\")")
    text = expression.expression.strip()
    if not text or text == "*":
        return None
    return frozenset(tag.strip() for tag in text.split("||") if tag.strip())


def _endpoints(endpoints: rmq.Endpoints) -> rmq.Endpoints:
    if not endpoints.addresses:
        raise _invalid("endpoints is empty: name the access point the client was given")
    return endpoints


class RocketMQv1Service(svc_grpc.MessagingServiceServicer):
    def __init__(self, ops: Operations, *, clock: Clock, own_address: Callable[[], str]) -> None:
        self._ops = ops
        self._clock = clock
        self._own_address = own_address
        self._receiver = Receiver(ops.topics, ops.consumers,
                                  groups=RocketGroups(ops.topics, ops.consumers), clock=clock)
        self._clients: dict[str, svc.HeartbeatRequest] = {}  # client_id -> last heartbeat
        self._attempts: dict[str, int] = {}  # group -> max_delivery_attempts it reported
        self._leaving: dict[str, asyncio.Event] = {}  # client_id -> set when it terminates
        self._orphans = OrphanQuestions(ops.transactions, clock=clock)

    # ------------------------------------------------------------------ routes and clients

    def _partition(self, topic: rmq.Resource, index: int, endpoints: rmq.Endpoints
                   ) -> rmq.Partition:
        return rmq.Partition(topic=topic, id=index, permission=rmq.READ_WRITE, broker=rmq.Broker(
            name=BROKER_NAME, id=0, endpoints=endpoints))

    @answered(svc.QueryRouteResponse)
    async def QueryRoute(self, request: svc.QueryRouteRequest,
                         context: Context) -> svc.QueryRouteResponse:
        endpoints = _endpoints(request.endpoints)
        count = await self._ops.topics.partitions(
            rocketmq.raftlog_topic(request.topic.name), Call.from_grpc(context))
        return svc.QueryRouteResponse(common=_common(), partitions=[
            self._partition(request.topic, index, endpoints) for index in range(count)])

    @answered(svc.QueryAssignmentResponse)
    async def QueryAssignment(self, request: svc.QueryAssignmentRequest,
                              context: Context) -> svc.QueryAssignmentResponse:
        endpoints = _endpoints(request.endpoints)
        rocketmq.group_name(request.group.name)
        await self._ops.topics.partitions(rocketmq.raftlog_topic(request.topic.name),
                                          Call.from_grpc(context))
        return svc.QueryAssignmentResponse(common=_common(), assignments=[
            rmq.Assignment(Partition=self._partition(request.topic, ANY_QUEUE, endpoints))])

    @answered(svc.HeartbeatResponse)
    async def Heartbeat(self, request: svc.HeartbeatRequest,
                        context: Context) -> svc.HeartbeatResponse:
        if len(self._clients) >= limits.rocketmq_v1_clients_max:
            self._clients.clear()
            self._attempts.clear()
        self._clients[request.client_id] = request
        if request.WhichOneof("client_data") == "consumer_data":
            data = request.consumer_data
            self._attempts[data.group.name] = data.dead_letter_policy.max_delivery_attempts
        return svc.HeartbeatResponse(common=_common())

    @answered(svc.HealthCheckResponse)
    async def HealthCheck(self, request: svc.HealthCheckRequest,
                          context: Context) -> svc.HealthCheckResponse:
        return svc.HealthCheckResponse(common=_common())

    @answered(svc.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request: svc.NotifyClientTerminationRequest,
                                      context: Context) -> svc.NotifyClientTerminationResponse:
        """Forgets the client and ends its PollCommand; its invisible messages come back when
        their durations end."""
        self._clients.pop(request.client_id, None)
        leaving = self._leaving.pop(request.client_id, None)
        if leaving is not None:
            leaving.set()
        return svc.NotifyClientTerminationResponse(common=_common())

    @rpc.unary
    async def PollCommand(self, request: svc.PollCommandRequest,
                          context: Context) -> svc.PollCommandResponse:
        """For a producer: the first open transaction of its `topics` that is due a question
        (ops/rocketmq_orphans.py), as a RecoverOrphanedTransactionCommand, looked for at once
        and again whenever one may fall due. Otherwise (and for consumers) the poll is held
        (limits.rocketmq_v1_command_poll_ms at most, ending before the deadline) and answers
        Noop; the client's NotifyClientTermination ends the hold early. Never an error."""
        via = Call.from_grpc(context)
        wait_ms = limits.rocketmq_v1_command_poll_ms
        remaining = via.remaining_s()
        if remaining is not None:
            wait_ms = max(min(wait_ms, int(remaining * 1000) - limits.rocketmq_poll_reserve_ms), 0)
        if len(self._leaving) >= limits.rocketmq_v1_clients_max:
            self._leaving.clear()
        leaving = self._leaving.setdefault(request.client_id, asyncio.Event())
        producing = _producer_topics(request)
        loop = asyncio.get_running_loop()
        ends = loop.time() + wait_ms / 1000
        while not leaving.is_set():
            look_ms = wait_ms
            if producing:
                orphan, look_ms = await self._orphans.next(producing, via)
                if orphan is not None:
                    return svc.PollCommandResponse(
                        recover_orphaned_transaction_command=self._recovery(orphan))
            left_s = ends - loop.time()
            if left_s <= 0:
                break
            with contextlib.suppress(TimeoutError):  # time to look again, or the hold ran out
                await asyncio.wait_for(leaving.wait(), timeout=min(left_s, look_ms / 1000))
        return svc.PollCommandResponse(noop_command=svc.NoopCommand())

    def _recovery(self, orphan: Orphan) -> svc.RecoverOrphanedTransactionCommand:
        """The question about an open transaction: its message as it would be committed."""
        shown = self._message(orphan.message, rmq.Resource(
            name=rocketmq.rocketmq_topic(orphan.topic)), orphan.queue)
        shown.system_attribute.message_type = rmq.TRANSACTION
        return svc.RecoverOrphanedTransactionCommand(orphaned_transactional_message=shown,
                                                     transaction_id=orphan.txn_id)

    @answered(svc.ReportThreadStackTraceResponse)
    async def ReportThreadStackTrace(self, request: svc.ReportThreadStackTraceRequest,
                                     context: Context) -> svc.ReportThreadStackTraceResponse:
        return svc.ReportThreadStackTraceResponse(common=_common())  # never asked for

    @answered(svc.ReportMessageConsumptionResultResponse)
    async def ReportMessageConsumptionResult(
            self, request: svc.ReportMessageConsumptionResultRequest,
            context: Context) -> svc.ReportMessageConsumptionResultResponse:
        return svc.ReportMessageConsumptionResultResponse(common=_common())  # never asked for

    # ------------------------------------------------------------------ producing

    @answered(svc.SendMessageResponse)
    async def SendMessage(self, request: svc.SendMessageRequest,
                          context: Context) -> svc.SendMessageResponse:
        message, via = request.message, Call.from_grpc(context)
        attrs = message.system_attribute
        self._check_send(message)
        deliver_at_ms = self._deliver_at_ms(attrs)
        topic = rocketmq.raftlog_topic(message.topic.name)
        count = await self._ops.topics.partitions(topic, via)
        if request.HasField("partition") and request.partition.id >= 0:
            partition = request.partition.id
        else:  # FIFO: by its message group; else by its id, so a retry is stored once
            partition = partition_for(key=attrs.message_group.encode() or None,
                                      msg_id=attrs.message_id, partitions=count)
        if attrs.message_type == rmq.TRANSACTION:
            prepared = await self._ops.transactions.prepare(transactions_pb2.PrepareRequest(
                topic=topic, partition=partition, payload=message.body,
                headers=_headers(message), msg_id=attrs.message_id,
                timeout_ms=limits.rocketmq_txn_timeout_ms), via)
            self._orphans.remember_period(prepared.txn_id,
                                          _ms(attrs.orphaned_transaction_recovery_period))
            return svc.SendMessageResponse(common=_common(), message_id=attrs.message_id,
                                           transaction_id=prepared.txn_id)
        await self._ops.topics.publish(topics_pb2.PublishToTopicRequest(
            topic=topic, partition=partition, payload=message.body, headers=_headers(message),
            msg_id=attrs.message_id, deliver_at_ms=deliver_at_ms), via)
        return svc.SendMessageResponse(common=_common(), message_id=attrs.message_id)

    def _deliver_at_ms(self, attrs: rmq.SystemAttribute) -> int:
        """When a delayed message is due (unix ms); 0 to append it now. INVALID_ARGUMENT for a
        delay level outside 1..18 or a time more than limits.scheduled_delay_ms_max ahead."""
        timing = attrs.WhichOneof("timed_delivery")
        if timing is None:
            return 0
        now_ms = self._clock.wall_ms()
        due_ms = (rocketmq_time.timestamp_ms(attrs.delivery_timestamp)
                  if timing == "delivery_timestamp"
                  else rocketmq_time.delay_level_due_ms(attrs.delay_level, now_ms=now_ms))
        return rocketmq_time.checked_due_ms(due_ms, now_ms=now_ms)

    @staticmethod
    def _check_send(message: rmq.Message) -> None:
        attrs = message.system_attribute
        timed = attrs.WhichOneof("timed_delivery") is not None
        if attrs.message_type not in (rmq.NORMAL, rmq.FIFO, rmq.DELAY, rmq.TRANSACTION):
            raise _invalid(f"message_type {attrs.message_type} is not one RocketMQ defines")
        if attrs.message_type == rmq.DELAY and not timed:
            raise _invalid("a DELAY message needs system_attribute.delivery_timestamp or "
                           "delay_level")
        if attrs.message_type == rmq.TRANSACTION and (timed or attrs.message_group):
            raise _invalid("a TRANSACTION message has neither a delivery time nor a "
                           "message_group")
        if not attrs.message_id:
            raise _invalid("system_attribute.message_id is empty: the producer names each "
                           "message")
        reserved = sorted(key for key in message.user_attribute if key in RESERVED_KEYS)
        if reserved:
            raise _invalid(f"user attribute keys {reserved} are reserved by RocketMQ")
        if attrs.message_type == rmq.FIFO and not attrs.message_group:
            raise _invalid("a FIFO message needs system_attribute.message_group")
        if not message.body:
            raise _invalid("the message body is empty")
        if len(message.body) > limits.rocketmq_max_body_bytes:
            raise _invalid(f"the body is {len(message.body)} bytes; at most "
                           f"{limits.rocketmq_max_body_bytes}")
        if attrs.body_encoding == rmq.GZIP:
            raise _invalid("GZIP bodies are not supported; send IDENTITY")

    # ------------------------------------------------------------------ consuming

    @answered(svc.ReceiveMessageResponse)
    async def ReceiveMessage(self, request: svc.ReceiveMessageRequest,
                             context: Context) -> svc.ReceiveMessageResponse:
        via = Call.from_grpc(context)
        invisible_ms = limits.rocketmq_invisible_ms_default
        if request.HasField("invisible_duration"):
            invisible_ms = _ms(request.invisible_duration)
            if not 0 < invisible_ms <= limits.rocketmq_invisible_ms_max:
                raise _invalid(f"invisible_duration {invisible_ms} ms is outside 1 ms to "
                               f"{limits.rocketmq_invisible_ms_max} ms")
        queue = request.partition.id if request.partition.id >= 0 else ANY_QUEUE
        received = await self._receiver.receive(Receive(
            topic=rocketmq.raftlog_topic(request.partition.topic.name),
            group=rocketmq.group_name(request.group.name), queue=queue,
            batch=min(max(request.batch_size, 1), limits.rocketmq_batch_max),
            invisible_ms=invisible_ms, wait_ms=_wait_ms(request, "await_time", via),
            tags=_tags(request.filter_expression)), via)
        answer = svc.ReceiveMessageResponse(
            common=_common() if received.messages else _common(message="no new message"),
            messages=[self._message(m, request.partition.topic, received.queue,
                                    invisible_ms=invisible_ms) for m in received.messages])
        answer.delivery_timestamp.FromMilliseconds(self._clock.wall_ms())
        answer.invisible_duration.FromMilliseconds(invisible_ms)
        return answer

    async def _settle(self, topic_name: str, group_name: str, handle: str, via: Call,
                      settle: Callable[[str, str, int], Awaitable[consumers_pb2.AckResponse]]
                      ) -> None:
        """Acks or naks the message a receipt handle names; INVALID_ARGUMENT for a handle
        this server did not issue to this group."""
        topic, group = rocketmq.raftlog_topic(topic_name), rocketmq.group_name(group_name)
        receipt = Receipt.parse(handle)
        stream = await self._ops.topics.stream(topic, receipt.partition, via)
        answer = await settle(stream, group, receipt.seq)
        refused = [result.error for result in answer.results if result.HasField("error")]
        if refused:
            raise _invalid(f"receipt handle {handle!r}: {refused[0].message}")

    @answered(svc.AckMessageResponse)
    async def AckMessage(self, request: svc.AckMessageRequest,
                         context: Context) -> svc.AckMessageResponse:
        """An ack of a message acked before succeeds again."""
        if request.WhichOneof("handle") != "receipt_handle":
            raise _invalid("acks name the receipt_handle the receive gave (offsets are for "
                           "pull consumers, which do not ack)")
        via = Call.from_grpc(context)

        async def ack(stream: str, group: str, seq: int) -> consumers_pb2.AckResponse:
            return await self._ops.consumers.ack(consumers_pb2.AckRequest(
                stream=stream, consumer=group, seqs=[seq]), via)

        await self._settle(request.topic.name, request.group.name, request.receipt_handle,
                           via, ack)
        return svc.AckMessageResponse(common=_common())

    @answered(svc.NackMessageResponse)
    async def NackMessage(self, request: svc.NackMessageRequest,
                          context: Context) -> svc.NackMessageResponse:
        """Delivery attempt n (the request's, else the handle's) of at most the allowed
        attempts (the request's, else the group's heartbeat policy, else 16) comes back after
        RocketMQ's back-off; the last one goes to the group's dead-letter topic."""
        via = Call.from_grpc(context)
        attempt = request.delivery_attempt or Receipt.parse(request.receipt_handle).delivery
        allowed = rocketmq_dlq.max_attempts(request.max_delivery_attempts
                                            or self._attempts.get(request.group.name, 0))
        if attempt >= allowed:
            await self._dead_letter(request, via)
            return svc.NackMessageResponse(common=_common())

        async def nak(stream: str, group: str, seq: int) -> consumers_pb2.AckResponse:
            return await self._ops.consumers.nak(consumers_pb2.NakRequest(
                stream=stream, consumer=group, seqs=[seq],
                delay_ms=rocketmq_dlq.nack_delay_ms(attempt)), via)

        await self._settle(request.topic.name, request.group.name, request.receipt_handle,
                           via, nak)
        return svc.NackMessageResponse(common=_common())

    @answered(svc.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(
            self, request: svc.ForwardMessageToDeadLetterQueueRequest,
            context: Context) -> svc.ForwardMessageToDeadLetterQueueResponse:
        await self._dead_letter(request, Call.from_grpc(context))
        return svc.ForwardMessageToDeadLetterQueueResponse(common=_common())

    async def _dead_letter(self, request: Any, via: Call) -> None:
        receipt = Receipt.parse(request.receipt_handle)
        try:
            await rocketmq_dlq.dead_letter(
                self._ops, topic=rocketmq.raftlog_topic(request.topic.name),
                group=rocketmq.group_name(request.group.name), partition=receipt.partition,
                seq=receipt.seq, via=via)
        except RaftlogError as err:
            if err.reason in (Reason.NOT_DELIVERED, Reason.MESSAGE_NOT_FOUND):
                raise _invalid(f"receipt handle {request.receipt_handle!r}: "
                               f"{err.message}") from None
            raise

    @answered(svc.EndTransactionResponse)
    async def EndTransaction(self, request: svc.EndTransactionRequest,
                             context: Context) -> svc.EndTransactionResponse:
        """COMMIT appends the prepared message to its queue (once, however often it is said),
        ROLLBACK discards it; from the client or (source SERVER_CHECK) its answer to a
        PollCommand question. Saying the same again is OK; an id naming no transaction that can
        take the resolution (malformed, unknown, rolled back or timed out, or committed for a
        ROLLBACK) is INVALID_ARGUMENT with the raftlog reason in error_info."""
        via = Call.from_grpc(context)
        if request.resolution not in (svc.EndTransactionRequest.COMMIT,
                                      svc.EndTransactionRequest.ROLLBACK):
            raise _invalid("resolution is COMMIT or ROLLBACK")
        try:
            if request.resolution == svc.EndTransactionRequest.COMMIT:
                await self._ops.transactions.commit(request.transaction_id, via)
            else:
                await self._ops.transactions.rollback(request.transaction_id, via)
        except RaftlogError as err:
            if err.reason in _UNKNOWN_TXN:
                self._orphans.forget(request.transaction_id)
                return svc.EndTransactionResponse(common=_error_common(
                    err, code_pb2.INVALID_ARGUMENT))
            raise
        self._orphans.forget(request.transaction_id)
        return svc.EndTransactionResponse(common=_common())

    # ------------------------------------------------------------------ pull consumers

    async def _queue_stream(self, partition: rmq.Partition, via: Call) -> str:
        if partition.id < 0:
            raise _invalid("name one queue: partition.id is a queue id from QueryRoute")
        return await self._ops.topics.stream(rocketmq.raftlog_topic(partition.topic.name),
                                             partition.id, via)

    @answered(svc.QueryOffsetResponse)
    async def QueryOffset(self, request: svc.QueryOffsetRequest,
                          context: Context) -> svc.QueryOffsetResponse:
        """An offset is a seq: BEGINNING the first stored, END the next to be written,
        TIME_POINT the first stored at or after the time (END when there is none)."""
        via = Call.from_grpc(context)
        stream = await self._queue_stream(request.partition, via)
        state = (await self._ops.streams.info(
            streams_pb2.GetStreamInfoRequest(name=stream), via)).state
        offset = {rmq.BEGINNING: state.first_seq, rmq.END: state.last_seq + 1}.get(
            request.policy)
        if offset is None:  # TIME_POINT
            at_ms = max(request.time_point.ToMilliseconds(), 1)
            found = await self._ops.streams.read_messages(streams_pb2.ReadMessagesRequest(
                stream=stream, start_time_ms=at_ms, limit=1), via)
            offset = found.messages[0].seq if found.messages else found.last_seq + 1
        return svc.QueryOffsetResponse(common=_common(), offset=offset)

    @answered(svc.PullMessageResponse)
    async def PullMessage(self, request: svc.PullMessageRequest,
                          context: Context) -> svc.PullMessageResponse:
        """Messages from `offset` on (waiting up to the await time for a first one), with
        the queue's first offset, the next offset to pull from and the end offset."""
        via = Call.from_grpc(context)
        if request.offset < 0:
            raise _invalid(f"offset {request.offset} is negative")
        wanted = _tags(request.filter_expression)
        stream = await self._queue_stream(request.partition, via)
        read = await self._ops.streams.read_messages(streams_pb2.ReadMessagesRequest(
            stream=stream, from_seq=request.offset,
            limit=min(max(request.batch_size, 1), limits.rocketmq_batch_max),
            max_wait_ms=_wait_ms(request, "await_time", via)), via)
        kept = [m for m in read.messages
                if wanted is None or header(m, rocketmq.TAG_HEADER) in wanted]
        return svc.PullMessageResponse(
            common=_common(), min_offset=read.first_seq, next_offset=read.next_seq,
            max_offset=read.last_seq + 1, messages=[
                self._message(m, request.partition.topic, request.partition.id)
                for m in kept])

    # ------------------------------------------------------------------ messages

    def _message(self, message: types_pb2.Message, topic: rmq.Resource, queue: int, *,
                 invisible_ms: int | None = None) -> rmq.Message:
        out = rmq.Message(topic=topic, body=message.payload)
        attrs = out.system_attribute
        origin = header(message, rocketmq_dlq.ORIGIN_HEADER)
        attrs.message_id = json.loads(origin)["message_id"] if origin else message.msg_id
        tag = header(message, rocketmq.TAG_HEADER)
        if tag is not None:
            attrs.tag = tag
        keys = header(message, rocketmq.KEYS_HEADER)
        if keys is not None:
            attrs.keys.extend(json.loads(keys))
        properties = header(message, rocketmq.PROPERTIES_HEADER)
        if properties is not None:
            out.user_attribute.update(json.loads(properties))
        born = header(message, rocketmq.BORN_HEADER)
        if born is not None:
            born_ms, _, born_host = born.partition(" ")
            attrs.born_timestamp.FromMilliseconds(int(born_ms))
            attrs.born_host = born_host
        group = header(message, rocketmq.GROUP_HEADER)
        scheduled_at = header(message, schedule_layout.SCHEDULED_AT_HEADER)
        attrs.message_type = rmq.NORMAL
        if group is not None:
            attrs.message_type = rmq.FIFO
            attrs.message_group = group
        elif header(message, txn_layout.ID_HEADER) is not None:
            attrs.message_type = rmq.TRANSACTION
        elif scheduled_at is not None and scheduled_at.isdigit():
            attrs.message_type = rmq.DELAY
            attrs.delivery_timestamp.FromMilliseconds(int(scheduled_at))
        attrs.body_digest.type = rmq.MD5
        attrs.body_digest.checksum = hashlib.md5(message.payload).hexdigest().upper()
        attrs.body_encoding = rmq.IDENTITY
        attrs.store_timestamp.CopyFrom(_timestamp(message.ts_ms))
        attrs.store_host = self._own_address()
        attrs.partition_id = queue
        attrs.partition_offset = message.seq
        if invisible_ms is not None:  # a POP delivery (pull reads carry no handle)
            attrs.receipt_handle = Receipt(queue, message.seq, message.deliver_count).handle()
            attrs.invisible_period.FromMilliseconds(invisible_ms)
            attrs.delivery_attempt = max(message.deliver_count, 1)
        return out


def _timestamp(ms: int) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromMilliseconds(ms)
    return stamp


def _producer_topics(request: svc.PollCommandRequest) -> list[str]:
    """The raftlog topics of a producer's PollCommand (none for a consumer's; bad names are
    passed over, a poll is never refused)."""
    if request.WhichOneof("group") != "producer_group":
        return []
    found: list[str] = []
    for resource in request.topics:
        with contextlib.suppress(RaftlogError):
            name = rocketmq.raftlog_topic(resource.name)
            if name not in found:
                found.append(name)
    return found


def _headers(message: rmq.Message) -> list[types_pb2.Header]:
    """The message's RocketMQ attributes as raftlog headers (ops/rocketmq.py's, shared with
    v2, plus the FIFO message group)."""
    attrs = message.system_attribute
    headers = [types_pb2.Header(key=rocketmq.BORN_HEADER, value=(
        f"{attrs.born_timestamp.ToMilliseconds()} {attrs.born_host}"))]
    if attrs.tag:
        headers.append(types_pb2.Header(key=rocketmq.TAG_HEADER, value=attrs.tag))
    if attrs.keys:
        headers.append(types_pb2.Header(key=rocketmq.KEYS_HEADER,
                                        value=rocketmq.keys_header(list(attrs.keys))))
    if message.user_attribute:
        headers.append(types_pb2.Header(key=rocketmq.PROPERTIES_HEADER,
                                        value=rocketmq.properties_header(
                                            dict(message.user_attribute))))
    if attrs.message_group:
        headers.append(types_pb2.Header(key=rocketmq.GROUP_HEADER, value=attrs.message_group))
    return headers
