"""Transactions: two-phase publishes over the stream operations (docs/transactions.md; the
layout on streams is transactions_layout.py, the janitor transactions_janitor.py).

Prepare stores the message in the target's half stream (made on first use with the target's
replicas), so it is majority-committed and survives a failover like any message. Commit and
Rollback first write the decision as `txn.end.<seq>` with expected_last_subject_seq = 0: one
decision wins whoever races (a client and the janitor, two retries through two nodes). A
commit then appends the message to the target and records `landed` with the target seq; a
commit that finds the decision but no `landed` (its writer died, or is still at it) first reads
the target's newest messages at the subject for the copy (the Raftlog-Txn-Id header), and the
append carries a msg_id the target's dedupe window knows: so the message is stored once. The
prepared message is purged once its transaction ended.

Every call works through any node: each step is a stream operation routed to the half stream's
or the target's primary. Front-ends call:
- `prepare(request, via) -> PrepareResponse`
- `commit(txn_id, via) -> CommitResponse`     `rollback(txn_id, via) -> RollbackResponse`
- `list_transactions(request, via) -> ListTransactionsResponse`
- `orphans(older_than_ms, via)` open transactions of the half streams this node leads, and
  `note_check(txn_id)` to count a question to their producer (kept here, in memory), and
  `prepared_message(txn_id, via)` the message to show that producer
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import secrets
from collections.abc import Awaitable, Callable
from typing import TypeVar

from raftlog.base import limits, subjects, topics
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.ops import transactions_layout as layout
from raftlog.node.ops.partitions import KEY_HEADER, TopicOps, partition_for
from raftlog.node.ops.sources import leads
from raftlog.node.ops.streams import StreamOps
from raftlog.node.transport.calls import Call
from raftlog.v1 import streams_pb2, transactions_pb2, types_pb2

T = TypeVar("T")

_NOT_FOUND = (Reason.MESSAGE_NOT_FOUND, Reason.STREAM_NOT_FOUND)


def _not_found(txn_id: str, why: str) -> RaftlogError:
    return RaftlogError(Reason.TRANSACTION_NOT_FOUND, f"transaction {txn_id!r} {why}",
                        txn_id=txn_id)


def _refused_for_good(error: RaftlogError) -> bool:
    """A target's answer that an append would meet again (the message or target is the
    problem, not the moment)."""
    return error.status_name == "INVALID_ARGUMENT" or error.reason == Reason.STREAM_NOT_FOUND


class CheckCounts:
    """How often a front-end asked a producer about each transaction (on this node only)."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def note(self, txn_id: str) -> int:
        if txn_id not in self._counts and len(self._counts) >= limits.txn_checks_tracked_max:
            self._counts.clear()
        self._counts[txn_id] = self._counts.get(txn_id, 0) + 1
        return self._counts[txn_id]

    def of(self, txn_id: str) -> int:
        return self._counts.get(txn_id, 0)

    def forget(self, txn_id: str) -> None:
        self._counts.pop(txn_id, None)


class TransactionOps:
    def __init__(self, streams: StreamOps, topics_ops: TopicOps, *, engine: StreamEngine,
                 clock: Clock) -> None:
        self._streams = streams
        self._topics = topics_ops
        self._engine = engine
        self._clock = clock
        self.checks = CheckCounts()
        self._floors: dict[str, int] = {}  # half stream -> seq below which nothing is prepared

    # ------------------------------------------------------------------ prepare

    async def prepare(self, request: transactions_pb2.PrepareRequest, via: Call
                      ) -> transactions_pb2.PrepareResponse:
        timeout_ms = _timeout_ms(request.timeout_ms)
        target, subject, partition, extra = await self._target(request, via)
        target_info = await self._streams.info(streams_pb2.GetStreamInfoRequest(name=target),
                                               via)
        half = layout.half_stream(target)
        entry = layout.half_entry(request, half=half, target=target, subject=subject,
                                  token=secrets.token_hex(8), timeout_ms=timeout_ms,
                                  extra=extra)
        _check_fits(target_info.config, subject=subject, size=layout.landing_size_max(
            request, half=half, subject=subject, extra=extra))
        now_ms = self._clock.wall_ms()
        ack = await self._publish_half(entry, target_info.config, via)
        return transactions_pb2.PrepareResponse(
            txn_id=layout.txn_id(half=half, seq=ack.seq), stream=target, partition=partition,
            prepared_ms=now_ms, expires_ms=now_ms + timeout_ms)

    async def _target(self, request: transactions_pb2.PrepareRequest, via: Call
                      ) -> tuple[str, str, int, list[types_pb2.Header]]:
        """(target stream, subject, partition, headers to add) of a prepare."""
        if bool(request.stream) == bool(request.topic):
            raise RaftlogError(Reason.INVALID_ARGUMENT, "a prepare names a stream or a topic "
                               "(exactly one)", field="stream")
        if request.stream:
            subjects.validate_name(request.stream, what="stream")
            if request.stream.startswith(layout.HALF_PREFIX):
                raise RaftlogError(Reason.INVALID_ARGUMENT, f"{request.stream!r} holds "
                                   "prepared messages; it cannot be a transaction's target",
                                   field="stream")
            if request.HasField("partition_choice"):
                raise RaftlogError(Reason.INVALID_ARGUMENT, "key and partition are for a "
                                   "topic target", field="partition")
            return request.stream, subjects.validate_subject(request.subject), 0, []
        count = await self._topics.partitions(request.topic, via)
        choice = request.WhichOneof("partition_choice")
        extra = []
        if choice == "partition":
            partition = request.partition
            await self._topics.stream(request.topic, partition, via)  # range-checked
        else:
            partition = partition_for(key=request.key if choice == "key" else None,
                                      msg_id=request.msg_id, partitions=count)
        if choice == "key":
            extra.append(types_pb2.Header(key=KEY_HEADER,
                                          value=base64.b64encode(request.key).decode()))
        subject = request.subject or layout.default_topic_subject(request.topic)
        return (topics.partition_stream(request.topic, partition),
                subjects.validate_subject(subject), partition, extra)

    async def _publish_half(self, entry: streams_pb2.PublishRequest,
                            target: types_pb2.StreamConfig, via: Call) -> streams_pb2.PublishAck:
        """Publishes the prepared message, making the half stream first when it is missing
        and waiting up to limits.txn_ready_wait_s_max for a new one to take writes."""
        try:
            return await self._streams.publish(entry, via)
        except RaftlogError as err:
            if err.reason != Reason.STREAM_NOT_FOUND:
                raise
        try:
            await self._streams.create(streams_pb2.CreateStreamRequest(
                config=layout.half_config(target)), via)
        except RaftlogError as refused:
            if refused.reason != Reason.STREAM_EXISTS:
                raise
        return await _when_ready(lambda: self._streams.publish(entry, via))

    # ------------------------------------------------------------------ commit, rollback

    async def commit(self, txn_id: str, via: Call) -> transactions_pb2.CommitResponse:
        half, seq = layout.parse_txn_id(txn_id)
        record = await self._record(half, seq, via)
        message: types_pb2.Message | None = None
        mine = False
        if record is None:
            message = await self._half_message(txn_id, half, seq, via)
            record, mine = await self._decide(half, seq, layout.Record(
                decision=layout.Decision.COMMIT, record_seq=0, by="client"), via)
        if record.decision is layout.Decision.ROLLBACK:
            raise _not_found(txn_id, f"was rolled back ({record.by or 'client'})")
        if record.decision is layout.Decision.FAILED:
            raise _failed(record)
        if record.decision is layout.Decision.LANDED:
            return self._committed(txn_id, record)
        if message is None:
            message = await self._half_message(txn_id, half, seq, via)
        return await self._land(message, half, record, look_first=not mine, via=via)

    async def rollback(self, txn_id: str, via: Call, *, by: str = "client"
                       ) -> transactions_pb2.RollbackResponse:
        half, seq = layout.parse_txn_id(txn_id)
        record = await self._record(half, seq, via)
        mine = False
        message = None
        if record is None:
            message = await self._half_message(txn_id, half, seq, via)
            record, mine = await self._decide(half, seq, layout.Record(
                decision=layout.Decision.ROLLBACK, record_seq=0, by=by), via)
        if record.decision is not layout.Decision.ROLLBACK:
            raise RaftlogError(Reason.TRANSACTION_ENDED, f"transaction {txn_id!r} was "
                               f"committed ({record.decision.value}); it cannot be rolled "
                               "back", txn_id=txn_id, decision=record.decision.value)
        if message is not None:
            await self._purge(half, message.subject, via)
        self.checks.forget(txn_id)
        return transactions_pb2.RollbackResponse(txn_id=txn_id, duplicate=not mine)

    def _committed(self, txn_id: str, record: layout.Record
                   ) -> transactions_pb2.CommitResponse:
        self.checks.forget(txn_id)
        return transactions_pb2.CommitResponse(txn_id=txn_id, stream=record.stream,
                                               seq=record.target_seq, duplicate=True)

    async def _land(self, message: types_pb2.Message, half: str, decided: layout.Record, *,
                    look_first: bool, via: Call) -> transactions_pb2.CommitResponse:
        """Appends a decided commit's message to its target (unless a look at the target finds
        it there already) and records where it went."""
        txn = layout.prepared(message, half=half)
        if txn is None:
            raise RaftlogError(Reason.INTERNAL, f"seq {message.seq} of {half!r} is not a "
                               "prepared message")
        found = await self._find_landed(txn, via) if look_first else None
        duplicate = found is not None
        if found is None:
            try:
                ack = await self._streams.publish(layout.landing_entry(message, txn), via)
            except RaftlogError as err:
                if not _refused_for_good(err):
                    raise
                failed = layout.Record(decision=layout.Decision.FAILED, record_seq=0,
                                       reason=err.reason.name, text=err.message)
                await self._finish(txn, failed, decided, via)
                raise
            found, duplicate = ack.seq, ack.duplicate
        landed = await self._finish(txn, layout.Record(
            decision=layout.Decision.LANDED, record_seq=0, target_seq=found, stream=txn.target),
            decided, via)
        self.checks.forget(txn.txn_id)
        return transactions_pb2.CommitResponse(txn_id=txn.txn_id, stream=txn.target,
                                               seq=landed.target_seq, duplicate=duplicate)

    async def _finish(self, txn: layout.Prepared, outcome: layout.Record,
                      decided: layout.Record, via: Call) -> layout.Record:
        """Records a commit's outcome after its decision (one outcome wins) and purges the
        prepared message; the outcome that won."""
        record, _ = await self._write_record(txn.half_seq, outcome, half=_half_of(txn),
                                             expected=decided.record_seq, via=via)
        await self._purge(_half_of(txn), txn.half_subject, via)
        return record

    async def _find_landed(self, txn: layout.Prepared, via: Call) -> int | None:
        """The target seq of the transaction's message when one of the target's newest
        limits.txn_land_scan_max messages at its subject is it."""
        info = await self._streams.info(streams_pb2.GetStreamInfoRequest(name=txn.target), via)
        from_seq = max(info.state.last_seq - limits.txn_land_scan_max + 1,
                       info.state.first_seq, 1)
        while from_seq <= info.state.last_seq:
            page = await self._streams.read_messages(streams_pb2.ReadMessagesRequest(
                stream=txn.target, from_seq=from_seq, filter_subject=txn.subject,
                limit=limits.scan_limit_max), via)
            for message in page.messages:
                if layout.is_landing_of(message, txn.txn_id):
                    return message.seq
            if page.next_seq > page.last_seq or page.next_seq <= from_seq:
                break
            from_seq = page.next_seq
        return None

    # ------------------------------------------------------------------ records

    async def _record(self, half: str, seq: int, via: Call) -> layout.Record | None:
        """The latest decision record of the prepared message at `seq` (None: undecided)."""
        try:
            message = await self._streams.read_latest(streams_pb2.ReadLatestAtSubjectRequest(
                stream=half, subject=layout.end_subject(seq)), via)
        except RaftlogError as err:
            if err.reason == Reason.STREAM_NOT_FOUND:
                raise _not_found(layout.txn_id(half=half, seq=seq), "is unknown (no half "
                                 "stream)") from None
            if err.reason != Reason.MESSAGE_NOT_FOUND:
                raise
            return None
        return layout.parse_record(message)

    async def _decide(self, half: str, seq: int, wanted: layout.Record, via: Call
                      ) -> tuple[layout.Record, bool]:
        """The decision on the prepared message at `seq`: `wanted` when it is the first,
        else the one recorded first; and whether it was this call's."""
        return await self._write_record(seq, wanted, half=half, expected=0, via=via)

    async def _write_record(self, seq: int, record: layout.Record, *, half: str,
                            expected: int, via: Call) -> tuple[layout.Record, bool]:
        """`record` at `txn.end.<seq>` if the last record there is `expected`; else the
        record found there (and False)."""
        try:
            ack = await self._streams.publish(layout.record_entry(
                seq, record, half=half, expected_subject_seq=expected), via)
        except RaftlogError as err:
            if err.reason != Reason.WRONG_LAST_SUBJECT_SEQ:
                raise
            found = await self._record(half, seq, via)
            if found is None:
                raise RaftlogError(Reason.INTERNAL, f"the decision at {half}:{seq} changed "
                                   "and is gone") from None
            return found, False
        return dataclasses.replace(record, record_seq=ack.seq), True

    async def _half_message(self, txn_id: str, half: str, seq: int, via: Call
                            ) -> types_pb2.Message:
        try:
            message = await self._streams.get_message(
                streams_pb2.GetMessageRequest(stream=half, seq=seq), via)
        except RaftlogError as err:
            if err.reason not in _NOT_FOUND:
                raise
            raise _not_found(txn_id, "is unknown (never prepared, or ended and forgotten)"
                             ) from None
        if layout.prepared(message, half=half) is None:
            raise _not_found(txn_id, "is unknown")
        return message

    async def purge_ended(self, txn: layout.Prepared, via: Call) -> None:
        """Removes the prepared message of a transaction whose end is recorded."""
        await self._purge(_half_of(txn), txn.half_subject, via)
        self.checks.forget(txn.txn_id)

    async def _purge(self, half: str, subject: str, via: Call) -> None:
        await self._streams.purge(streams_pb2.PurgeStreamRequest(name=half, subject=subject),
                                  via)

    # ------------------------------------------------------------------ listing

    async def list_transactions(self, request: transactions_pb2.ListTransactionsRequest,
                                via: Call) -> transactions_pb2.ListTransactionsResponse:
        limit = request.limit or limits.txn_list_limit_default
        if limit > limits.txn_list_limit_max:
            raise RaftlogError(Reason.INVALID_ARGUMENT, f"limit may be at most "
                               f"{limits.txn_list_limit_max}", limit=limits.txn_list_limit_max)
        found: list[transactions_pb2.TransactionInfo] = []
        truncated = False
        for half in await self._halves(request, via):
            room = limit - len(found)
            if room <= 0:
                truncated = True
                break
            more, cut = await self.open_transactions(half, older_than_ms=request.older_than_ms,
                                                     limit=room, via=via)
            found.extend(more)
            truncated = truncated or cut
        return transactions_pb2.ListTransactionsResponse(transactions=found,
                                                         truncated=truncated)

    async def _halves(self, request: transactions_pb2.ListTransactionsRequest, via: Call
                      ) -> list[str]:
        """The half streams a listing looks at (existing ones only)."""
        if request.stream and request.topic:
            raise RaftlogError(Reason.INVALID_ARGUMENT, "a listing names a stream, a topic "
                               "or neither", field="stream")
        if request.stream:
            subjects.validate_name(request.stream, what="stream")
            targets = [request.stream]
        elif request.topic:
            count = await self._topics.partitions(request.topic, via)
            targets = [topics.partition_stream(request.topic, i) for i in range(count)]
        else:
            listed = await self._streams.list(
                streams_pb2.ListStreamsRequest(prefix=layout.HALF_PREFIX), via)
            return sorted(i.config.name for i in listed.streams
                          if layout.is_half_config(i.config))
        wanted = {layout.half_stream(t) for t in targets}
        listed = await self._streams.list(
            streams_pb2.ListStreamsRequest(prefix=layout.HALF_PREFIX), via)
        return sorted(i.config.name for i in listed.streams if i.config.name in wanted
                      and layout.is_half_config(i.config))

    async def open_transactions(self, half: str, *, older_than_ms: int, limit: int, via: Call
                                ) -> tuple[list[transactions_pb2.TransactionInfo], bool]:
        """The undecided and committing transactions of one half stream, oldest first, at
        most `limit`; and whether there were more."""
        found: list[transactions_pb2.TransactionInfo] = []
        for txn, record in await self.prepared_in(half, limit=limit + 1, via=via):
            if record is not None and record.decision is not layout.Decision.COMMIT:
                continue  # ended; the janitor purges it
            now_ms = self._clock.wall_ms()
            if now_ms - txn.prepared_ms < older_than_ms:
                continue
            found.append(layout.info(txn, now_ms=now_ms, checks=self.checks.of(txn.txn_id),
                                     committing=record is not None))
        return found[:limit], len(found) > limit

    async def prepared_in(self, half: str, *, limit: int, via: Call
                          ) -> list[tuple[layout.Prepared, layout.Record | None]]:
        """The prepared messages still stored in `half` (oldest first, at most `limit`),
        each with its latest decision record."""
        found: list[tuple[layout.Prepared, layout.Record | None]] = []
        from_seq = self._floors.get(half, 1)
        while len(found) < limit:
            page = await self._streams.read_messages(streams_pb2.ReadMessagesRequest(
                stream=half, from_seq=from_seq, filter_subject=layout.HALF_FILTER,
                limit=min(limits.scan_limit_max, limit - len(found))), via)
            if page.last_seq + 1 < from_seq:  # deleted and made again: from the start
                self._floors.pop(half, None)
                return await self.prepared_in(half, limit=limit, via=via)
            for message in page.messages:
                txn = layout.prepared(message, half=half)
                if txn is not None:
                    found.append((txn, await self._record(half, txn.half_seq, via)))
            if page.next_seq > page.last_seq or page.next_seq <= from_seq:
                from_seq = page.next_seq
                break
            from_seq = page.next_seq
        self._remember_floor(half, found[0][0].half_seq if found else from_seq)
        return found

    def _remember_floor(self, half: str, seq: int) -> None:
        """Prepared messages are only ever removed below the oldest one still stored, so the
        next look at `half` can start there."""
        if half not in self._floors and len(self._floors) >= limits.txn_floors_max:
            self._floors.clear()
        self._floors[half] = seq

    # ------------------------------------------------------------------ this node's half streams

    def half_streams_here(self) -> list[str]:
        """The half streams this node is the primary of (its janitor's)."""
        return sorted(name for name, stream in list(self._engine.streams.items())
                      if name.startswith(layout.HALF_PREFIX)
                      and layout.is_half_config(stream.config) and leads(stream))

    async def orphans(self, older_than_ms: int, via: Call
                      ) -> list[transactions_pb2.TransactionInfo]:
        """Open (undecided) transactions prepared at least `older_than_ms` ago in the half
        streams this node leads, at most limits.txn_list_limit_default: the ones a front-end
        asks their producers about."""
        found: list[transactions_pb2.TransactionInfo] = []
        for half in self.half_streams_here():
            room = limits.txn_list_limit_default - len(found)
            if room <= 0:
                break
            more, _ = await self.open_transactions(half, older_than_ms=older_than_ms,
                                                   limit=room, via=via)
            found.extend(t for t in more if not t.committing)
        return found

    async def prepared_message(self, txn_id: str, via: Call) -> types_pb2.Message:
        """The message an open transaction would commit, as the target would store it (its
        subject, payload and headers with Raftlog-Txn-Id; seq and time those of the prepared
        message): what a front-end shows a producer it asks about the transaction.
        TRANSACTION_NOT_FOUND once the transaction ended."""
        half, seq = layout.parse_txn_id(txn_id)
        message = await self._half_message(txn_id, half, seq, via)
        txn = layout.prepared(message, half=half)
        if txn is None:
            raise _not_found(txn_id, "is unknown")
        entry = layout.landing_entry(message, txn)
        return types_pb2.Message(seq=message.seq, ts_ms=message.ts_ms, stream=txn.target,
                                 subject=entry.subject, payload=entry.payload,
                                 headers=entry.headers, msg_id=entry.msg_id)

    def note_check(self, txn_id: str) -> int:
        """Counts one question to the producer about `txn_id`; the count so far."""
        layout.parse_txn_id(txn_id)
        return self.checks.note(txn_id)


def _half_of(txn: layout.Prepared) -> str:
    return layout.parse_txn_id(txn.txn_id)[0]


def _failed(record: layout.Record) -> RaftlogError:
    reason = Reason.__members__.get(record.reason, Reason.TRANSACTION_ENDED)
    return RaftlogError(reason, f"the commit was refused by the target: {record.text}")


def _timeout_ms(asked: int) -> int:
    if asked > limits.txn_timeout_ms_max:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"timeout_ms may be at most "
                           f"{limits.txn_timeout_ms_max}", field="timeout_ms",
                           limit=limits.txn_timeout_ms_max)
    return asked or limits.txn_timeout_ms_default


def _check_fits(config: types_pb2.StreamConfig, *, subject: str, size: int) -> None:
    """Refuses at prepare what the target would refuse at commit: a subject it does not take,
    a message larger than it stores."""
    if config.subjects and not subjects.matches_any(list(config.subjects), subject):
        raise RaftlogError(Reason.SUBJECT_NOT_IN_STREAM, f"stream {config.name!r} does not "
                           f"take subject {subject!r}", stream=config.name, subject=subject)
    largest = min(config.max_msg_bytes or limits.message_bytes_max, limits.message_bytes_max)
    if size > largest:
        raise RaftlogError(Reason.MESSAGE_TOO_LARGE, f"the message is {size} bytes; stream "
                           f"{config.name!r} takes at most {largest}", limit=largest)


async def _when_ready(call: Callable[[], Awaitable[T]]) -> T:
    """`call()`, tried again while it answers UNAVAILABLE (a new stream's primary waits for
    its first lease), for at most limits.txn_ready_wait_s_max."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.txn_ready_wait_s_max
    while True:
        try:
            return await call()
        except RaftlogError as err:
            if err.status_name != "UNAVAILABLE" or loop.time() >= deadline:
                raise
        await asyncio.sleep(limits.txn_ready_poll_ms / 1000)
