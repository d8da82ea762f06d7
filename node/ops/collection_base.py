"""What the collection operations share: the stream calls they make on the caller's behalf (each
routed by StreamOps/ConsumerOps to the stream's primary, here or forwarded), the translation of
a missing stream into COLLECTION_NOT_FOUND, the settings read, listing a key's subjects page by
page, and the retry of a write that lost a race.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops import collection_layout as layout
from raftlog.node.ops.collection_layout import Settings, Target
from raftlog.node.ops.consumers import ConsumerOps
from raftlog.node.ops.streams import StreamOps
from raftlog.node.transport.calls import Call
from raftlog.v1 import streams_pb2, types_pb2

T = TypeVar("T")

# A write's expectation (expected_last_seq / expected_last_subject_seq) no longer held: another
# write came first. Read again and retry.
RACES = (Reason.WRONG_LAST_SEQ, Reason.WRONG_LAST_SUBJECT_SEQ)


def not_found(collection: Target) -> RaftlogError:
    return RaftlogError(Reason.COLLECTION_NOT_FOUND,
                        f"there is no {collection.word} named {collection.name!r}",
                        kind=collection.word, collection=collection.name)


async def on(collection: Target, call: Awaitable[T]) -> T:
    """`call`'s answer; its STREAM_NOT_FOUND (confirmed by the metadata rules) is the
    collection's COLLECTION_NOT_FOUND."""
    try:
        return await call
    except RaftlogError as err:
        if err.reason is Reason.STREAM_NOT_FOUND:
            raise not_found(collection) from None
        raise


async def retrying(attempt: Callable[[], Awaitable[T]], *, what: str) -> T:
    """`attempt()` again (after a short random pause) while it loses races to other writers,
    at most limits.collection_write_attempts_max times; then COLLECTION_CONFLICT."""
    for _ in range(limits.collection_write_attempts_max):
        try:
            return await attempt()
        except RaftlogError as err:
            if err.reason not in RACES:
                raise
        await asyncio.sleep(random.uniform(0, limits.collection_retry_backoff_ms_max) / 1000)
    raise RaftlogError(Reason.COLLECTION_CONFLICT,
                       f"{what} lost {limits.collection_write_attempts_max} races to other "
                       "writers of the collection; it changed no value, retry",
                       attempts=limits.collection_write_attempts_max)


class CollectionBase:
    def __init__(self, streams: StreamOps, consumers: ConsumerOps) -> None:
        self._streams = streams
        self._consumers = consumers

    async def _stream_info(self, collection: Target, via: Call
                           ) -> tuple[Settings, types_pb2.StreamInfo]:
        """The collection's settings and its stream's info; COLLECTION_NOT_FOUND when the
        stream is missing or is not a collection of this kind."""
        stream = await on(collection, self._streams.info(
            streams_pb2.GetStreamInfoRequest(name=collection.stream), via))
        settings = layout.settings_of(stream.config.description, kind=collection.kind)
        if settings is None:
            raise RaftlogError(
                Reason.COLLECTION_NOT_FOUND,
                f"stream {collection.stream!r} exists but is not a {collection.word} "
                "collection (it was not made by CreateCollection)",
                kind=collection.word, collection=collection.name, stream=collection.stream)
        return settings, stream

    async def _subjects(self, collection: Target, key_prefix: str, via: Call, *,
                        present_wanted: int | None = None, narrower: str = ""
                        ) -> tuple[list[layout.Slot], bool]:
        """The fields or members of one key (subjects below `key_prefix` + `narrower`), in
        token order, and whether the listing is complete. Asks the stream for at most
        limits.collection_subjects_page_max subjects at a time; a prefix with more is listed by
        each one-character longer prefix in turn (a field's two subjects share every prefix
        up to their last token, so they never fall apart). With `present_wanted`, stops once
        more than that many with a value subject were found."""
        reply = await on(collection, self._streams.list_subjects(
            streams_pb2.ListSubjectsByPrefixRequest(
                stream=collection.stream, prefix=key_prefix + narrower,
                limit=limits.collection_subjects_page_max), via))
        if not reply.truncated:
            return layout.slots(reply.subjects, key_prefix), True
        found: list[layout.Slot] = []
        for char in layout.PREFIX_ALPHABET:
            part, complete = await self._subjects(collection, key_prefix, via,
                                                  present_wanted=present_wanted,
                                                  narrower=narrower + char)
            found.extend(part)
            if not complete or (present_wanted is not None
                                and sum(bool(s.value_seq) for s in found) > present_wanted):
                return found, False
        return found, True

    async def _item(self, collection: Target, prefix: str, via: Call) -> layout.Slot:
        """One field or member: the seqs at its value subject and its delete mark."""
        reply = await on(collection, self._streams.list_subjects(
            streams_pb2.ListSubjectsByPrefixRequest(stream=collection.stream, prefix=prefix,
                                                    limit=4), via))
        return layout.slot(reply.subjects, prefix)

    async def _message(self, collection: Target, seq: int, via: Call
                       ) -> types_pb2.Message | None:
        """The message at `seq`, None when it is gone (replaced, deleted, purged)."""
        try:
            return await on(collection, self._streams.get_message(
                streams_pb2.GetMessageRequest(stream=collection.stream, seq=seq), via))
        except RaftlogError as err:
            if err.reason is Reason.MESSAGE_NOT_FOUND:
                return None
            raise

    async def _publish(self, collection: Target, request: streams_pb2.PublishRequest,
                       via: Call) -> streams_pb2.PublishAck:
        request.stream = collection.stream
        return await on(collection, self._streams.publish(request, via))

    async def _purge_below(self, collection: Target, subject: str, *, seq: int,
                           via: Call) -> None:
        """Removes the message at `subject` if its seq is at most `seq` (a newer one stays)."""
        await on(collection, self._streams.purge(streams_pb2.PurgeStreamRequest(
            name=collection.stream, subject=subject, below_seq=seq + 1), via))


def full(collection: Target, what: str, *, limit: int, would_be: int) -> RaftlogError:
    return RaftlogError(Reason.COLLECTION_FULL,
                        f"{collection.word} {collection.name!r} holds at most {limit} {what}; "
                        f"this write would make it {would_be}",
                        kind=collection.word, collection=collection.name, limit=limit,
                        would_be=would_be)
