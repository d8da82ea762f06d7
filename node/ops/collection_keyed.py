"""Hashes and sets: keys of fields with values, keys of members (collection_layout.py has the
subjects). A set member is a field whose value is empty, so both kinds share every step here.

- Set a value: one publish to the value subject; the stream keeps one message per subject, so
  it replaces the one before. A bounded collection also expects the value subject's seq and the
  stream's last seq it read, so its size check is exact (`_room`).
- Delete (DeleteHashField, RemoveSetMember): read the field; absent, nothing is written. Else
  publish the delete mark, then the tombstone to the value subject expecting the seq read there.
  Of two deletes of one value exactly one tombstone lands; the other one reads again, finds the
  field gone and clears what is left. Then purge the tombstone (only up to its seq: a newer
  value stays) and then the mark (only up to its seq: another delete's newer mark stays).
  Marks go only after the tombstones they may stand for, so a tombstone never stands without a
  mark: should the purges not happen, every reader reads the value subject's message before it
  believes it (`Slot.doubtful`), and the next delete of that field clears both.
- Add a member: read it; present, nothing is written. Else publish the empty value expecting
  the value subject's seq read (0, or the seq of a leftover tombstone), so of two adds one lands.
- A write whose expectation failed (another write came first) reads again
  (`collection_base.retrying`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops import collection_layout as layout
from raftlog.node.ops.collection_base import CollectionBase, full, on, retrying
from raftlog.node.ops.collection_layout import HASH, SET, Settings, Slot, Target
from raftlog.node.transport.calls import Call
from raftlog.v1 import collections_pb2 as pb
from raftlog.v1 import streams_pb2, types_pb2

log = logging.getLogger(__name__)


def _list_limit(limit: int) -> int:
    if limit > limits.collection_list_limit_max:
        raise RaftlogError(Reason.INVALID_ARGUMENT,
                           f"limit may be at most {limits.collection_list_limit_max}",
                           field="limit", limit=limits.collection_list_limit_max)
    return limit or limits.collection_list_limit_default


class KeyedOps(CollectionBase):
    # ------------------------------------------------------------------------------- hash

    async def set_field(self, request: pb.SetHashFieldRequest, via: Call
                        ) -> pb.SetHashFieldResponse:
        collection = layout.target(HASH, request.collection)
        prefix = layout.item_prefix(HASH, request.key, request.field, what="field")
        settings, _ = await self._stream_info(collection, via)
        subject = layout.value_subject(prefix)
        if not settings.bounded:
            ack = await self._publish(collection, streams_pb2.PublishRequest(
                subject=subject, payload=request.value), via)
            return pb.SetHashFieldResponse(revision=ack.seq)

        async def bounded() -> pb.SetHashFieldResponse:
            current = await self._latest_message(collection, subject, via)
            ack = await self._publish(collection, await self._room(
                collection, settings, subject, request.value, replacing=current, via=via), via)
            return pb.SetHashFieldResponse(revision=ack.seq)

        return await retrying(bounded, what="SetHashField")

    async def get_field(self, request: pb.HashFieldRequest, via: Call) -> pb.HashFieldEntry:
        collection = layout.target(HASH, request.collection)
        prefix = layout.item_prefix(HASH, request.key, request.field, what="field")
        for _ in range(limits.collection_write_attempts_max):
            item = await self._item(collection, prefix, via)
            if not item.value_seq:
                break
            message = await self._message(collection, item.value_seq, via)
            if message is None:
                continue  # replaced or purged since it was listed: look again
            if layout.is_tombstone(message):
                break
            return pb.HashFieldEntry(field=request.field, value=message.payload,
                                     revision=message.seq)
        raise RaftlogError(Reason.FIELD_NOT_FOUND,
                           f"hash {collection.name!r} key {request.key!r} has no field "
                           f"{request.field!r}", collection=collection.name, key=request.key,
                           field=request.field)

    async def field_exists(self, request: pb.HashFieldRequest, via: Call
                           ) -> pb.HashFieldExistsResponse:
        collection = layout.target(HASH, request.collection)
        prefix = layout.item_prefix(HASH, request.key, request.field, what="field")
        current = await self._current(collection, prefix, via)
        return pb.HashFieldExistsResponse(exists=_live(current))

    async def delete_field(self, request: pb.HashFieldRequest, via: Call
                           ) -> pb.DeleteHashFieldResponse:
        collection = layout.target(HASH, request.collection)
        prefix = layout.item_prefix(HASH, request.key, request.field, what="field")
        deleted = await self._remove(collection, prefix, via, what="DeleteHashField")
        return pb.DeleteHashFieldResponse(deleted=deleted)

    async def get_hash(self, request: pb.HashKeyRequest, via: Call) -> pb.GetHashResponse:
        collection = layout.target(HASH, request.collection)
        found, truncated = await self._listing(collection, HASH, request.key, request.limit, via)
        entries = [pb.HashFieldEntry(field=layout.decode_token(item.token),
                                     value=message.payload, revision=message.seq)
                   for item, message in found]
        return pb.GetHashResponse(entries=entries, truncated=truncated)

    async def list_fields(self, request: pb.HashKeyRequest, via: Call
                          ) -> pb.ListHashFieldsResponse:
        collection = layout.target(HASH, request.collection)
        found, truncated = await self._listing(collection, HASH, request.key, request.limit, via,
                                               values=False)
        return pb.ListHashFieldsResponse(fields=[layout.decode_token(item.token)
                                                 for item, _ in found], truncated=truncated)

    async def count_fields(self, request: pb.HashKeyRequest, via: Call) -> pb.CollectionCount:
        collection = layout.target(HASH, request.collection)
        return await self._count(collection, HASH, request.key, via)

    # -------------------------------------------------------------------------------- set

    async def add_member(self, request: pb.SetMemberRequest, via: Call
                         ) -> pb.AddSetMemberResponse:
        collection = layout.target(SET, request.collection)
        prefix = layout.item_prefix(SET, request.key, request.member, what="member")
        settings, _ = await self._stream_info(collection, via)
        subject = layout.value_subject(prefix)

        async def add() -> pb.AddSetMemberResponse:
            current = await self._current(collection, prefix, via)
            if _live(current):
                return pb.AddSetMemberResponse(added=False)
            seq = current.seq if current is not None else 0
            if settings.bounded:
                publish = await self._room(collection, settings, subject, b"",
                                           replacing=current, via=via)
            else:
                publish = streams_pb2.PublishRequest(subject=subject,
                                                     expected_last_subject_seq=seq)
            await self._publish(collection, publish, via)
            return pb.AddSetMemberResponse(added=True)

        return await retrying(add, what="AddSetMember")

    async def remove_member(self, request: pb.SetMemberRequest, via: Call
                            ) -> pb.RemoveSetMemberResponse:
        collection = layout.target(SET, request.collection)
        prefix = layout.item_prefix(SET, request.key, request.member, what="member")
        removed = await self._remove(collection, prefix, via, what="RemoveSetMember")
        return pb.RemoveSetMemberResponse(removed=removed)

    async def is_member(self, request: pb.SetMemberRequest, via: Call
                        ) -> pb.IsSetMemberResponse:
        collection = layout.target(SET, request.collection)
        prefix = layout.item_prefix(SET, request.key, request.member, what="member")
        current = await self._current(collection, prefix, via)
        return pb.IsSetMemberResponse(is_member=_live(current))

    async def list_members(self, request: pb.SetKeyRequest, via: Call
                           ) -> pb.ListSetMembersResponse:
        collection = layout.target(SET, request.collection)
        found, truncated = await self._listing(collection, SET, request.key, request.limit, via,
                                               values=False)
        return pb.ListSetMembersResponse(members=[layout.decode_token(item.token)
                                                  for item, _ in found], truncated=truncated)

    async def count_members(self, request: pb.SetKeyRequest, via: Call) -> pb.CollectionCount:
        collection = layout.target(SET, request.collection)
        return await self._count(collection, SET, request.key, via)

    # ------------------------------------------------------------------------ shared steps

    async def _current(self, collection: Target, prefix: str, via: Call,
                       item: Slot | None = None) -> types_pb2.Message | None:
        """The message at one field's value subject (a value or a tombstone), None when it
        has none. Reads it only when the listing (`item`, listed here when not given) leaves a
        doubt; a certain value comes back as a message with its seq only."""
        if item is None:
            item = await self._item(collection, prefix, via)
        if not item.value_seq:
            return None
        if item.live:
            return types_pb2.Message(seq=item.value_seq)
        return await self._latest_message(collection, layout.value_subject(prefix), via)

    async def _remove(self, collection: Target, prefix: str, via: Call, *, what: str) -> bool:
        """Deletes one field or member: True when this call deleted a live value."""
        await self._stream_info(collection, via)  # a stream made by hand is not touched
        value_subject, mark_subject = layout.value_subject(prefix), layout.mark_subject(prefix)

        async def remove() -> tuple[bool, int, int]:
            """(deleted, the seq up to which to purge the value subject, and the mark's)"""
            item = await self._item(collection, prefix, via)
            current = await self._current(collection, prefix, via, item)
            if current is None or layout.is_tombstone(current):
                # Absent. Clear what a delete cut short left: its tombstone and mark.
                return False, current.seq if current is not None else 0, item.mark_seq
            # The mark first. When the tombstone loses its race the mark stays (it may stand
            # for another delete's tombstone now): the retry finds the field absent and clears.
            mark = await self._publish(collection, streams_pb2.PublishRequest(
                subject=mark_subject), via)
            tombstone = await self._publish(collection, streams_pb2.PublishRequest(
                subject=value_subject, headers=[layout.TOMBSTONE],
                expected_last_subject_seq=current.seq), via)
            return True, tombstone.seq, mark.seq

        deleted, value_seq, mark_seq = await retrying(remove, what=what)
        try:  # first the tombstone, then the mark: never a tombstone without a mark
            if value_seq:
                await self._purge_below(collection, value_subject, seq=value_seq, via=via)
            if mark_seq:
                await self._purge_below(collection, mark_subject, seq=mark_seq, via=via)
        except RaftlogError as err:  # done all the same: the next delete of it clears up
            log.info("%s %s: a delete's clean-up was cut short: %s", collection.word,
                     collection.name, err)
        return deleted

    async def _resolved(self, collection: Target, items: Sequence[Slot], via: Call, *,
                        values: bool) -> list[tuple[Slot, types_pb2.Message]]:
        """The live ones of `items` with their messages, in order. Reads a message only when
        `values` are asked for or the listing leaves a doubt (at most
        limits.collection_reads_parallel_max at once); without `values` a certain one comes
        with its seq only."""
        gate = asyncio.Semaphore(limits.collection_reads_parallel_max)

        async def resolve(item: Slot) -> types_pb2.Message | None:
            if not item.value_seq:
                return None
            if item.live and not values:
                return types_pb2.Message(seq=item.value_seq)
            async with gate:
                message = await self._message(collection, item.value_seq, via)
            # Gone since it was listed: deleted, or replaced by a newer value (listed next time).
            return message if message is not None and not layout.is_tombstone(message) else None

        messages = await asyncio.gather(*(resolve(item) for item in items))
        return [(item, m) for item, m in zip(items, messages, strict=True) if m is not None]

    async def _listing(self, collection: Target, kind: int, key: str, limit: int, via: Call, *,
                       values: bool = True
                       ) -> tuple[list[tuple[Slot, types_pb2.Message]], bool]:
        """Up to `limit` live fields or members of a key, in token order, and whether there
        may be more."""
        wanted = _list_limit(limit)
        found, complete = await self._subjects(collection, layout.key_prefix(kind, key), via,
                                               present_wanted=wanted)
        if not found:
            await self._stream_info(collection, via)  # an empty key, or no collection?
        live: list[tuple[Slot, types_pb2.Message]] = []
        index = 0
        while index < len(found) and len(live) <= wanted:  # one past `wanted` tells "more"
            chunk = found[index:index + wanted + 1 - len(live)]
            live += await self._resolved(collection, chunk, via, values=values)
            index += len(chunk)
        return live[:wanted], len(live) > wanted or not complete

    async def _count(self, collection: Target, kind: int, key: str, via: Call
                     ) -> pb.CollectionCount:
        found, _ = await self._subjects(collection, layout.key_prefix(kind, key), via)
        if not found:
            await self._stream_info(collection, via)
        live = await self._resolved(collection, found, via, values=False)
        return pb.CollectionCount(count=len(live))

    async def _latest_message(self, collection: Target, subject: str, via: Call
                              ) -> types_pb2.Message | None:
        try:
            return await on(collection, self._streams.read_latest(
                streams_pb2.ReadLatestAtSubjectRequest(stream=collection.stream,
                                                       subject=subject), via))
        except RaftlogError as err:
            if err.reason is Reason.MESSAGE_NOT_FOUND:
                return None
            raise

    async def _room(self, collection: Target, settings: Settings, subject: str, value: bytes, *,
                    replacing: types_pb2.Message | None, via: Call
                    ) -> streams_pb2.PublishRequest:
        """The publish of `value` at `subject` in a bounded collection, replacing the message
        `replacing` (None: none), once it is checked to fit max_bytes (COLLECTION_FULL when
        not). It expects both the subject's seq and the stream's last seq read here, so no
        other write slips in between the check and the write."""
        _, stream = await self._stream_info(collection, via)
        freed = layout.message_bytes(replacing) if replacing is not None else 0
        would_be = stream.state.bytes - freed + layout.stored_bytes(subject, value)
        if settings.max_bytes and would_be > settings.max_bytes:
            raise full(collection, "bytes", limit=settings.max_bytes, would_be=would_be)
        return streams_pb2.PublishRequest(
            subject=subject, payload=value, expected_last_seq=stream.state.last_seq,
            expected_last_subject_seq=replacing.seq if replacing is not None else 0)


def _live(current: types_pb2.Message | None) -> bool:
    return current is not None and not layout.is_tombstone(current)
