"""Apache RocketMQ's gRPC protocol v2 (apache.rocketmq.v2.MessagingService) on the client port,
so unmodified RocketMQ 5 clients (rocketmq-python-client, the Java, Go, Node.js clients) produce
to and consume from raftlog topics. Every call becomes topic and consumer operations
(node/ops/partitions.py, node/ops/rocketmq.py for the names, handles and groups), so a queue has
raftlog's guarantees: a send is answered once a majority holds it, acks are Raft-committed, a
queue's primary fails over in about a second.

What is served (docs/rocketmq.md): QueryRoute (a queue per partition: queue id 0 of a broker
of its own, `<node>#q<partition>`, at the node that leads the partition), Heartbeat,
NotifyClientTermination, Telemetry (the settings answer a client waits for, and the questions
about open transactions), SendMessage of NORMAL, FIFO, delayed and transactional messages,
EndTransaction, RecallMessage (a delayed message withdrawn before it is due), QueryAssignment,
ReceiveMessage (a long poll with an invisible duration; past a group's attempts a message moves
to `%DLQ%<group>`), AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue, and
the pull consumer's calls by offset: QueryOffset, PullMessage, GetOffset, UpdateOffset
(rocketmq_v2_pull.py over node/ops/rocketmq_offsets.py; an offset is the partition's seq).

Errors: the business outcome is the v2 `Status` of the answer (a RaftlogError becomes the code
`_code` picks and raftlog's message); the gRPC call itself ends OK.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import ipaddress
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc

from raftlog.base import limits, topics
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.compat import rocketmq_v2_definition_pb2 as rmq
from raftlog.compat import rocketmq_v2_service_pb2 as svc
from raftlog.compat import rocketmq_v2_service_pb2_grpc as svc_grpc
from raftlog.node.api.rocketmq_v2_pull import PullCalls, Refused, poll_ms, wanted_tags
from raftlog.node.api.rocketmq_v2_telemetry import TelemetryCalls
from raftlog.node.ops import rocketmq, rocketmq_dlq, rocketmq_offsets
from raftlog.node.ops.operations import Operations
from raftlog.node.ops.partitions import partition_for
from raftlog.node.ops.rocketmq import Receipt, RocketGroups
from raftlog.node.ops.rocketmq_offsets import RecallHandle
from raftlog.node.ops.rocketmq_receive import Receive, Receiver, header
from raftlog.node.ops.route import Route
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.v1 import consumers_pb2, topics_pb2, transactions_pb2, types_pb2

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
Method = Callable[[Any, Any, Context], Awaitable[Any]]

SERVICE_NAME = svc.DESCRIPTOR.services_by_name["MessagingService"].full_name

_CODES: dict[Reason, int] = {
    Reason.TOPIC_NOT_FOUND: rmq.TOPIC_NOT_FOUND,
    Reason.STREAM_NOT_FOUND: rmq.TOPIC_NOT_FOUND,
    Reason.TOPIC_INCOMPLETE: rmq.TOPIC_NOT_FOUND,
    Reason.CONSUMER_NOT_FOUND: rmq.CONSUMER_GROUP_NOT_FOUND,
    Reason.INVALID_ARGUMENT: rmq.BAD_REQUEST,
    Reason.PARTITION_OUT_OF_RANGE: rmq.BAD_REQUEST,
    Reason.MESSAGE_TOO_LARGE: rmq.MESSAGE_BODY_TOO_LARGE,
    Reason.REQUEST_TOO_LARGE: rmq.MESSAGE_BODY_TOO_LARGE,
    Reason.NOT_DELIVERED: rmq.INVALID_RECEIPT_HANDLE,
    Reason.OVERLOADED: rmq.TOO_MANY_REQUESTS,
    Reason.TOO_MANY_CONSUMERS: rmq.TOO_MANY_REQUESTS,
    Reason.STREAM_FULL: rmq.TOO_MANY_REQUESTS,
    Reason.TIMEOUT: rmq.PROXY_TIMEOUT,
    Reason.UNAUTHENTICATED: rmq.UNAUTHORIZED,
    Reason.PERMISSION_DENIED: rmq.FORBIDDEN,
}
_UNAVAILABLE = frozenset({Reason.NO_LEADER, Reason.NO_QUORUM, Reason.NOT_PRIMARY,
                          Reason.SHUTTING_DOWN, Reason.FORWARD_FAILED, Reason.CATCHING_UP,
                          Reason.NODE_UNREACHABLE, Reason.STALE_EPOCH})


def _code(err: RaftlogError, *, invalid_name: int = rmq.ILLEGAL_TOPIC) -> int:
    """The v2 status code of a RaftlogError (a bad name is the topic's or the group's)."""
    if err.reason == Reason.INVALID_NAME:
        return invalid_name
    if err.reason in _UNAVAILABLE:
        return rmq.HA_NOT_AVAILABLE  # the client retries its send on another queue
    return _CODES.get(err.reason, rmq.INTERNAL_ERROR)


def _delivery_ms(stamp: Any) -> int:
    """A delivery_timestamp in unix ms. rocketmq-python-client writes milliseconds into the
    seconds field: a seconds value past limits.rocketmq_seconds_max (year 5138) is read as
    milliseconds; any real seconds value is far below it."""
    if stamp.seconds > limits.rocketmq_seconds_max:
        return int(stamp.seconds)
    return int(stamp.seconds) * 1000 + int(stamp.nanos) // 1_000_000


def _status(code: int, message: str = "OK") -> rmq.Status:
    return rmq.Status(code=code, message=message)  # type: ignore[arg-type]


OK = _status(rmq.OK)


def _unsupported(what: str) -> rmq.Status:
    return _status(rmq.UNSUPPORTED, f"{what} are not served by raftlog yet (docs/rocketmq.md "
                                    "\"Not served yet\"); send NORMAL messages")


def answered(response: type[Any], *, invalid_name: int = rmq.ILLEGAL_TOPIC
             ) -> Callable[[Method], Method]:
    """A unary call whose refusals and RaftlogErrors become `response(status=...)`."""
    def wrap(method: Method) -> Method:
        @functools.wraps(method)
        async def call(self: Any, request: Any, context: Context) -> Any:
            try:
                return await method(self, request, context)
            except Refused as refused:
                return response(status=refused.status)
            except RaftlogError as err:
                return response(status=_status(_code(err, invalid_name=invalid_name),
                                               err.message))
        return rpc.unary(call)  # anything else: INTERNAL, logged
    return wrap


def _duration_ms(duration: Any) -> int:
    return int(duration.seconds) * 1000 + int(duration.nanos) // 1_000_000


def _invisible_ms(duration: Any, present: bool, *, least_ms: int = 1) -> int:
    if not present:
        return limits.rocketmq_invisible_ms_default
    ms = _duration_ms(duration)
    if not least_ms <= ms <= limits.rocketmq_invisible_ms_max:
        raise Refused(rmq.ILLEGAL_INVISIBLE_TIME, f"invisible duration {ms} ms is outside "
                      f"{least_ms} ms to {limits.rocketmq_invisible_ms_max} ms")
    return ms


def _address(text: str) -> rmq.Endpoints:
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    try:
        scheme = rmq.IPv4 if ipaddress.ip_address(host).version == 4 else rmq.IPv6
    except ValueError:
        scheme = rmq.DOMAIN_NAME
    return rmq.Endpoints(scheme=scheme, addresses=[rmq.Address(host=host, port=int(port))])


class RocketMQService(TelemetryCalls, PullCalls, svc_grpc.MessagingServiceServicer):
    def __init__(self, ops: Operations, *, where: Route, own_address: Callable[[], str],
                 clock: Clock) -> None:
        self._ops = ops
        self._topics = ops.topics
        self._consumers = ops.consumers
        self._where = where
        self._own_address = own_address
        self._groups = RocketGroups(ops.topics, ops.consumers)
        self._receiver = Receiver(ops.topics, ops.consumers, groups=self._groups, clock=clock)

    # ------------------------------------------------------------------ routes

    def _serving(self, stream: str) -> str:
        """The client address of the node serving `stream` now (this one when unsure)."""
        try:
            return self._where.primary(stream) or self._own_address()
        except RaftlogError:
            return self._own_address()

    def _broker(self, address: str, partition: int) -> rmq.Broker:
        """The broker of one queue: its own name (rocketmq.queue_broker), the serving node's
        endpoints, id 0 (the primary)."""
        names = {addr: node for node, addr in self._where.members().items()}
        return rmq.Broker(name=rocketmq.queue_broker(names.get(address, address), partition),
                          id=0, endpoints=_address(address))

    async def _queues(self, resource: rmq.Resource, via: Call) -> list[rmq.MessageQueue]:
        topic = rocketmq.raftlog_topic(resource.name)
        count = await self._topics.partitions(topic, via)
        accepted = [rmq.NORMAL, rmq.FIFO, rmq.DELAY, rmq.TRANSACTION]
        return [rmq.MessageQueue(
            topic=resource, id=0, permission=rmq.READ_WRITE,
            broker=self._broker(self._serving(topics.partition_stream(topic, index)), index),
            accept_message_types=accepted) for index in range(count)]  # type: ignore[misc]

    @answered(svc.QueryRouteResponse)
    async def QueryRoute(self, request: svc.QueryRouteRequest,
                         context: Context) -> svc.QueryRouteResponse:
        queues = await self._queues(request.topic, Call.from_grpc(context))
        return svc.QueryRouteResponse(status=OK, message_queues=queues)

    @answered(svc.QueryAssignmentResponse, invalid_name=rmq.ILLEGAL_CONSUMER_GROUP)
    async def QueryAssignment(self, request: svc.QueryAssignmentRequest,
                              context: Context) -> svc.QueryAssignmentResponse:
        rocketmq.group_name(request.group.name)
        queues = await self._queues(request.topic, Call.from_grpc(context))
        return svc.QueryAssignmentResponse(
            status=OK, assignments=[rmq.Assignment(message_queue=queue) for queue in queues])

    # ------------------------------------------------------------------ clients

    @answered(svc.HeartbeatResponse)
    async def Heartbeat(self, request: svc.HeartbeatRequest,
                        context: Context) -> svc.HeartbeatResponse:
        return svc.HeartbeatResponse(status=OK)

    @answered(svc.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request: svc.NotifyClientTerminationRequest,
                                      context: Context) -> svc.NotifyClientTerminationResponse:
        # The client's invisible messages come back when their durations end.
        return svc.NotifyClientTerminationResponse(status=OK)

    # ------------------------------------------------------------------ producing

    @answered(svc.SendMessageResponse)
    async def SendMessage(self, request: svc.SendMessageRequest,
                          context: Context) -> svc.SendMessageResponse:
        if not request.messages:
            raise Refused(rmq.BAD_REQUEST, "messages is empty")
        via = Call.from_grpc(context)
        if len(request.messages) == 1:
            entries = [await self._send(request.messages[0], via)]
        else:
            entries = await self._send_many(request.messages, via)
        if len(entries) == 1:
            status = entries[0].status
        elif all(entry.status.code == rmq.OK for entry in entries):
            status = OK
        else:
            status = _status(rmq.MULTIPLE_RESULTS, "some messages were refused")
        return svc.SendMessageResponse(status=status, entries=entries)

    async def _send_many(self, messages: Sequence[rmq.Message], via: Call
                         ) -> list[svc.SendResultEntry]:
        """A batch: its NORMAL and FIFO messages go to their queues as one PublishBatch per
        queue, in order (one group commit each); delayed and transactional ones one by one."""
        entries: list[svc.SendResultEntry | None] = [None] * len(messages)
        batched: list[tuple[int, topics_pb2.PublishToTopicRequest]] = []
        for index, message in enumerate(messages):
            props = message.system_properties
            if (props.message_type == rmq.TRANSACTION or props.HasField("delivery_timestamp")
                    or self._refusal(message) is not None):
                entries[index] = await self._send(message, via)
                continue
            try:
                batched.append((index, await self._request(message, via)))
            except RaftlogError as err:
                entries[index] = svc.SendResultEntry(message_id=props.message_id,
                                                     status=_status(_code(err), err.message))
        answers = await self._topics.publish_many([request for _, request in batched], via)
        for (index, _), answer in zip(batched, answers, strict=True):
            entry = svc.SendResultEntry(message_id=messages[index].system_properties.message_id)
            if isinstance(answer, RaftlogError):
                entry.status.CopyFrom(_status(_code(answer), answer.message))
            else:
                entry.status.CopyFrom(OK)
                entry.offset = answer.seq
            entries[index] = entry
        return [entry for entry in entries if entry is not None]

    async def _send(self, message: rmq.Message, via: Call) -> svc.SendResultEntry:
        props = message.system_properties
        entry = svc.SendResultEntry(message_id=props.message_id)
        refusal = self._refusal(message)
        if refusal is not None:
            entry.status.CopyFrom(refusal)
            return entry
        try:
            request = await self._request(message, via)
            if props.message_type == rmq.TRANSACTION:
                prepared = await self._ops.transactions.prepare(transactions_pb2.PrepareRequest(
                    topic=request.topic, partition=request.partition,
                    payload=request.payload, headers=request.headers, msg_id=request.msg_id,
                    timeout_ms=limits.rocketmq_txn_timeout_ms), via)
                entry.transaction_id = prepared.txn_id
            else:
                if props.HasField("delivery_timestamp"):
                    request.deliver_at_ms = _delivery_ms(props.delivery_timestamp)
                published = await self._topics.publish(request, via)
                entry.offset = published.seq
                if published.scheduled:  # names it in the schedule stream for RecallMessage
                    entry.recall_handle = RecallHandle(published.partition,
                                                       published.seq).handle()
        except RaftlogError as err:
            entry.status.CopyFrom(_status(_code(err), err.message))
            return entry
        entry.status.CopyFrom(OK)
        return entry

    async def _request(self, message: rmq.Message, via: Call
                       ) -> topics_pb2.PublishToTopicRequest:
        """The topic publish of a message: its properties as headers, a FIFO message keyed
        by its group, any other to the queue its message id hashes to (partition_for)."""
        props = message.system_properties
        topic = rocketmq.raftlog_topic(message.topic.name)
        headers = [types_pb2.Header(key=rocketmq.BORN_HEADER, value=(
            f"{props.born_timestamp.ToMilliseconds()} {props.born_host}"))]
        if props.HasField("tag"):
            headers.append(types_pb2.Header(key=rocketmq.TAG_HEADER, value=props.tag))
        if props.keys:
            headers.append(types_pb2.Header(key=rocketmq.KEYS_HEADER,
                                            value=rocketmq.keys_header(list(props.keys))))
        if message.user_properties:
            headers.append(types_pb2.Header(key=rocketmq.PROPERTIES_HEADER, value=(
                rocketmq.properties_header(dict(message.user_properties)))))
        request = topics_pb2.PublishToTopicRequest(
            topic=topic, payload=message.body, headers=headers, msg_id=props.message_id)
        if props.HasField("message_group"):  # FIFO: one queue per message group
            request.key = props.message_group.encode()
            request.headers.append(types_pb2.Header(key=rocketmq.GROUP_HEADER,
                                                    value=props.message_group))
        else:  # by its message id: a retry through any node lands where the first send did
            request.partition = partition_for(
                key=None, msg_id=props.message_id,
                partitions=await self._topics.partitions(topic, via))
        return request

    @staticmethod
    def _refusal(message: rmq.Message) -> rmq.Status | None:
        props = message.system_properties
        kind = props.message_type
        if kind == rmq.FIFO and not props.message_group:
            return _status(rmq.ILLEGAL_MESSAGE_GROUP, "a FIFO message needs a message_group")
        if kind == rmq.DELAY and not props.HasField("delivery_timestamp"):
            return _status(rmq.ILLEGAL_DELIVERY_TIME, "a DELAY message needs a "
                                                      "delivery_timestamp")
        if props.HasField("delivery_timestamp"):
            at_ms = _delivery_ms(props.delivery_timestamp)
            if at_ms > time.time() * 1000 + limits.scheduled_delay_ms_max:
                return _status(rmq.ILLEGAL_DELIVERY_TIME, f"delivery_timestamp {at_ms} ms is "
                               f"more than {limits.scheduled_delay_ms_max} ms ahead")
        if kind == rmq.TRANSACTION and (props.HasField("delivery_timestamp")
                                        or props.HasField("message_group")):
            return _status(rmq.BAD_REQUEST, "a transactional message has neither a "
                                            "delivery_timestamp nor a message_group")
        if kind not in (rmq.NORMAL, rmq.FIFO, rmq.DELAY, rmq.TRANSACTION,
                        rmq.MESSAGE_TYPE_UNSPECIFIED):
            return _unsupported(f"{rmq.MessageType.Name(kind)} messages")
        if not props.message_id:
            return _status(rmq.ILLEGAL_MESSAGE_ID, "system_properties.message_id is empty: "
                                                   "the producer names each message")
        if not message.body:
            return _status(rmq.MESSAGE_BODY_EMPTY, "the message body is empty")
        if len(message.body) > limits.rocketmq_max_body_bytes:
            return _status(rmq.MESSAGE_BODY_TOO_LARGE, f"the body is {len(message.body)} "
                           f"bytes; at most {limits.rocketmq_max_body_bytes}")
        if props.body_encoding == rmq.GZIP:
            return _status(rmq.BAD_REQUEST, "GZIP bodies are not supported; send IDENTITY")
        return None

    # ------------------------------------------------------------------ consuming

    @answered(svc.AckMessageResponse, invalid_name=rmq.ILLEGAL_CONSUMER_GROUP)
    async def AckMessage(self, request: svc.AckMessageRequest,
                         context: Context) -> svc.AckMessageResponse:
        if not request.entries:
            raise Refused(rmq.BAD_REQUEST, "entries is empty")
        via = Call.from_grpc(context)
        group = rocketmq.group_name(request.group.name)
        topic = rocketmq.raftlog_topic(request.topic.name)
        results = [svc.AckMessageResultEntry(message_id=entry.message_id,
                                             receipt_handle=entry.receipt_handle)
                   for entry in request.entries]
        by_queue: dict[int, list[tuple[int, Receipt]]] = {}
        for index, entry in enumerate(request.entries):
            try:
                receipt = Receipt.parse(entry.receipt_handle)
            except RaftlogError as err:
                results[index].status.CopyFrom(_status(rmq.INVALID_RECEIPT_HANDLE, err.message))
                continue
            by_queue.setdefault(receipt.partition, []).append((index, receipt))

        async def ack_queue(partition: int, items: list[tuple[int, Receipt]]) -> None:
            """The entries of one queue as one raftlog ack (one Raft entry for them all)."""
            try:
                stream = await self._topics.stream(topic, partition, via)
                answer = await self._consumers.ack(consumers_pb2.AckRequest(
                    stream=stream, consumer=group, seqs=[r.seq for _, r in items]), via)
            except RaftlogError as err:
                code = (rmq.INVALID_RECEIPT_HANDLE if err.reason == Reason.INVALID_ARGUMENT
                        else _code(err))
                for index, _ in items:
                    results[index].status.CopyFrom(_status(code, err.message))
                return
            for (index, _), outcome in zip(items, answer.results, strict=True):
                results[index].status.CopyFrom(
                    _status(rmq.INVALID_RECEIPT_HANDLE, outcome.error.message)
                    if outcome.HasField("error") else OK)

        await asyncio.gather(*(ack_queue(partition, items)
                               for partition, items in by_queue.items()))
        failed = [r.status for r in results if r.status.code != rmq.OK]
        status = OK if not failed else (failed[0] if len(results) == 1 else
                                         _status(rmq.MULTIPLE_RESULTS, "some acks failed"))
        return svc.AckMessageResponse(status=status, entries=results)

    @answered(svc.ChangeInvisibleDurationResponse, invalid_name=rmq.ILLEGAL_CONSUMER_GROUP)
    async def ChangeInvisibleDuration(self, request: svc.ChangeInvisibleDurationRequest,
                                      context: Context) -> svc.ChangeInvisibleDurationResponse:
        """The message comes back `invisible_duration` from now unless acked first; the
        handle stays the same (an ack with the old one works as well)."""
        via = Call.from_grpc(context)
        group = rocketmq.group_name(request.group.name)
        topic = rocketmq.raftlog_topic(request.topic.name)
        # 0 is "visible again now": a push consumer whose back-off is under a second sends
        # it (the Python client truncates to whole seconds).
        ms = _invisible_ms(request.invisible_duration, request.HasField("invisible_duration"),
                           least_ms=0)
        try:
            receipt = Receipt.parse(request.receipt_handle)
        except RaftlogError as err:
            raise Refused(rmq.INVALID_RECEIPT_HANDLE, err.message) from None
        stream = await self._topics.stream(topic, receipt.partition, via)
        answer = await self._consumers.nak(consumers_pb2.NakRequest(
            stream=stream, consumer=group, seqs=[receipt.seq], delay_ms=ms), via)
        refused = [r.error for r in answer.results if r.HasField("error")]
        if refused:
            raise Refused(rmq.INVALID_RECEIPT_HANDLE, refused[0].message)
        return svc.ChangeInvisibleDurationResponse(status=OK,
                                                   receipt_handle=request.receipt_handle)

    @rpc.server_stream
    async def ReceiveMessage(self, request: svc.ReceiveMessageRequest,
                             context: Context) -> AsyncIterator[svc.ReceiveMessageResponse]:
        """One long poll on the queue the client picked: the messages, then one status
        (MESSAGE_NOT_FOUND when nothing came within the poll)."""
        try:
            found = await self._receive(request, Call.from_grpc(context))
        except Refused as refused:
            yield svc.ReceiveMessageResponse(status=refused.status)
            return
        except RaftlogError as err:
            yield svc.ReceiveMessageResponse(status=_status(
                _code(err, invalid_name=rmq.ILLEGAL_CONSUMER_GROUP), err.message))
            return
        if found:  # when the server handed them out, as RocketMQ's proxy says before them
            stamp = svc.ReceiveMessageResponse()
            stamp.delivery_timestamp.FromMilliseconds(int(time.time() * 1000))
            yield stamp
        for message in found:
            yield svc.ReceiveMessageResponse(message=message)
        yield svc.ReceiveMessageResponse(status=OK if found else _status(
            rmq.MESSAGE_NOT_FOUND, "no new message"))

    async def _receive(self, request: svc.ReceiveMessageRequest, via: Call
                       ) -> list[rmq.Message]:
        """A receive (ops/rocketmq_receive.py) on the queue the client picked, served by any
        other queue of the topic when that one has nothing, as a RocketMQ broker serves one
        from any of its queues; each message names the queue it came from."""
        queue = request.message_queue
        topic = rocketmq.raftlog_topic(queue.topic.name)
        group = rocketmq.group_name(request.group.name)
        wanted = wanted_tags(request.filter_expression)
        invisible_ms = _invisible_ms(request.invisible_duration,
                                     request.HasField("invisible_duration"))
        received = await self._receiver.receive(Receive(
            topic=topic, group=group,
            queue=rocketmq.queue_partition(queue.id, queue.broker.name),  # or BAD_REQUEST
            batch=min(max(request.batch_size, 1), limits.rocketmq_batch_max),
            invisible_ms=invisible_ms,
            wait_ms=poll_ms(request.long_polling_timeout,
                            request.HasField("long_polling_timeout"), via),
            tags=wanted, others=True), via)
        attempts = (await self._groups.ensure(topic, group, invisible_ms, via)).attempts
        kept = []
        for message in received.messages:
            if message.deliver_count > attempts:  # its attempts are used up
                await rocketmq_dlq.dead_letter(self._ops, topic=topic, group=group,
                                               partition=received.queue, seq=message.seq,
                                               via=via)
            else:
                kept.append(self._message(message, queue.topic, received.queue, invisible_ms))
        return kept

    def _message(self, message: types_pb2.Message, topic: rmq.Resource, partition: int,
                 invisible_ms: int) -> rmq.Message:
        """`message` of queue `partition` as a v2 message (queue_id 0, as routes say)."""
        out = rmq.Message(topic=topic, body=message.payload)
        props = out.system_properties
        props.message_id = message.msg_id
        origin = header(message, rocketmq_dlq.ORIGIN_HEADER)
        if origin is not None:  # a dead letter keeps the id it was sent with, as RocketMQ's do
            props.message_id = json.loads(origin).get("message_id") or message.msg_id
        tag = header(message, rocketmq.TAG_HEADER)
        if tag is not None:
            props.tag = tag
        keys = header(message, rocketmq.KEYS_HEADER)
        if keys is not None:
            props.keys.extend(json.loads(keys))
        properties = header(message, rocketmq.PROPERTIES_HEADER)
        if properties is not None:
            out.user_properties.update(json.loads(properties))
        born = header(message, rocketmq.BORN_HEADER)
        if born is not None:
            born_ms, _, born_host = born.partition(" ")
            props.born_timestamp.FromMilliseconds(int(born_ms))
            props.born_host = born_host
        props.body_digest.type = rmq.MD5
        props.body_digest.checksum = hashlib.md5(message.payload).hexdigest().upper()
        props.body_encoding = rmq.IDENTITY
        group = header(message, rocketmq.GROUP_HEADER)
        if group is not None:
            props.message_group = group
        props.message_type = rmq.FIFO if group is not None else rmq.NORMAL
        props.store_timestamp.FromMilliseconds(message.ts_ms)
        props.store_host = self._own_address()
        props.receipt_handle = Receipt(partition, message.seq, message.deliver_count).handle()
        props.queue_id = 0
        props.queue_offset = message.seq
        props.invisible_duration.FromMilliseconds(invisible_ms)
        props.delivery_attempt = max(message.deliver_count, 1)
        return out

    # ------------------------------------------------------------------ transactions, dead letters

    @answered(svc.EndTransactionResponse)
    async def EndTransaction(self, request: svc.EndTransactionRequest,
                             context: Context) -> svc.EndTransactionResponse:
        """COMMIT appends the half message to its queue (once, however often it is said);
        ROLLBACK discards it. From the client, or its answer to a recovery command."""
        via = Call.from_grpc(context)
        if request.resolution not in (rmq.COMMIT, rmq.ROLLBACK):
            raise Refused(rmq.BAD_REQUEST, "resolution is COMMIT or ROLLBACK")
        try:
            if request.resolution == rmq.COMMIT:
                await self._ops.transactions.commit(request.transaction_id, via)
            else:
                await self._ops.transactions.rollback(request.transaction_id, via)
        except RaftlogError as err:
            if err.reason in (Reason.TRANSACTION_NOT_FOUND, Reason.TRANSACTION_ENDED,
                              Reason.INVALID_ARGUMENT):
                raise Refused(rmq.INVALID_TRANSACTION_ID, err.message) from None
            raise
        return svc.EndTransactionResponse(status=OK)

    @answered(svc.RecallMessageResponse)
    async def RecallMessage(self, request: svc.RecallMessageRequest,
                            context: Context) -> svc.RecallMessageResponse:
        """Cancels the delayed message the handle names before it is due (raftlog's
        CancelScheduled); NOT_FOUND once it was delivered or recalled (not MESSAGE_NOT_FOUND,
        which clients take as an empty success), BAD_REQUEST for a handle never issued."""
        via = Call.from_grpc(context)
        topic = rocketmq.raftlog_topic(request.topic.name)
        try:
            handle = RecallHandle.parse(request.recall_handle)
        except RaftlogError as err:
            raise Refused(rmq.BAD_REQUEST, err.message) from None
        try:
            message_id = await rocketmq_offsets.recall(self._ops, topic=topic, handle=handle,
                                                       via=via)
        except RaftlogError as err:
            if err.reason == Reason.MESSAGE_NOT_FOUND:
                raise Refused(rmq.NOT_FOUND, err.message) from None
            raise
        return svc.RecallMessageResponse(status=OK, message_id=message_id)

    @answered(svc.ForwardMessageToDeadLetterQueueResponse,
              invalid_name=rmq.ILLEGAL_CONSUMER_GROUP)
    async def ForwardMessageToDeadLetterQueue(
            self, request: svc.ForwardMessageToDeadLetterQueueRequest,
            context: Context) -> svc.ForwardMessageToDeadLetterQueueResponse:
        """The client gave up on the message (a push consumer past its attempts): it is copied
        to `%DLQ%<group>` and never delivered to the group again."""
        via = Call.from_grpc(context)
        group = rocketmq.group_name(request.group.name)
        topic = rocketmq.raftlog_topic(request.topic.name)
        try:
            receipt = Receipt.parse(request.receipt_handle)
        except RaftlogError as err:
            raise Refused(rmq.INVALID_RECEIPT_HANDLE, err.message) from None
        try:
            await rocketmq_dlq.dead_letter(self._ops, topic=topic, group=group,
                                           partition=receipt.partition, seq=receipt.seq,
                                           via=via)
        except RaftlogError as err:
            if err.reason in (Reason.NOT_DELIVERED, Reason.MESSAGE_NOT_FOUND):
                raise Refused(rmq.INVALID_RECEIPT_HANDLE, err.message) from None
            raise
        return svc.ForwardMessageToDeadLetterQueueResponse(status=OK)

    # ------------------------------------------------------------------ offsets (PullCalls)

    @answered(svc.QueryOffsetResponse)
    async def QueryOffset(self, request: svc.QueryOffsetRequest,
                          context: Context) -> svc.QueryOffsetResponse:
        return await self.query_offset(request, Call.from_grpc(context))

    @answered(svc.GetOffsetResponse, invalid_name=rmq.ILLEGAL_CONSUMER_GROUP)
    async def GetOffset(self, request: svc.GetOffsetRequest,
                        context: Context) -> svc.GetOffsetResponse:
        return await self.get_offset(request, Call.from_grpc(context))

    @answered(svc.UpdateOffsetResponse, invalid_name=rmq.ILLEGAL_CONSUMER_GROUP)
    async def UpdateOffset(self, request: svc.UpdateOffsetRequest,
                           context: Context) -> svc.UpdateOffsetResponse:
        return await self.update_offset(request, Call.from_grpc(context))

    @rpc.server_stream
    async def PullMessage(self, request: svc.PullMessageRequest,
                          context: Context) -> AsyncIterator[svc.PullMessageResponse]:
        """The queue's messages from `offset` on (a long poll while there are none), then the
        offset to pull from next, then one status (MESSAGE_NOT_FOUND when none came)."""
        try:
            messages, next_offset = await self.pull(request, Call.from_grpc(context))
        except Refused as refused:
            yield svc.PullMessageResponse(status=refused.status)
            return
        except RaftlogError as err:
            yield svc.PullMessageResponse(status=_status(
                _code(err, invalid_name=rmq.ILLEGAL_CONSUMER_GROUP), err.message))
            return
        for message in messages:
            yield svc.PullMessageResponse(message=message)
        yield svc.PullMessageResponse(next_offset=next_offset)
        yield svc.PullMessageResponse(status=OK if messages else _status(
            rmq.MESSAGE_NOT_FOUND, "no new message"))
