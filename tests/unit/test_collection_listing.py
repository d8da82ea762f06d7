"""Hash and set calls (node/ops/collection_keyed.py) over an in-memory twin of the stream
operations they use: listing a key page by page when it has more subjects than one listing may
return, exact counts and truncation, and the size check of a bounded collection. Each test is
named after the rule it checks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.stream_core import stored_size
from raftlog.node.ops import collection_layout as layout
from raftlog.node.ops.collections import CollectionOps
from raftlog.node.transport.calls import Call
from raftlog.v1 import collections_pb2 as pb
from raftlog.v1 import streams_pb2, types_pb2

VIA = Call()


class StreamTwin:
    """The StreamOps calls collections make, on one stream in memory: one message per subject
    (the collections' streams keep one), expectations checked, purges by subject and seq."""

    def __init__(self, config: types_pb2.StreamConfig) -> None:
        self.config = config
        self.messages: dict[str, types_pb2.Message] = {}  # subject -> its one message
        self.last_seq = 0
        self.listings = 0

    async def create(self, request: streams_pb2.CreateStreamRequest, via: Call
                     ) -> types_pb2.StreamInfo:
        raise RaftlogError(Reason.STREAM_EXISTS, "exists")

    async def info(self, request: Any, via: Call) -> types_pb2.StreamInfo:
        return types_pb2.StreamInfo(config=self.config, state=types_pb2.StreamState(
            last_seq=self.last_seq, messages=len(self.messages),
            bytes=sum(stored_size(m) for m in self.messages.values())))  # type: ignore[arg-type]

    async def list_subjects(self, request: streams_pb2.ListSubjectsByPrefixRequest, via: Call
                            ) -> streams_pb2.ListSubjectsByPrefixResponse:
        self.listings += 1
        found = sorted(s for s in self.messages if s.startswith(request.prefix))
        return streams_pb2.ListSubjectsByPrefixResponse(
            subjects=[streams_pb2.SubjectSummary(subject=s, messages=1,
                                                 last_seq=self.messages[s].seq)
                      for s in found[:request.limit]],
            truncated=len(found) > request.limit)

    async def read_latest(self, request: streams_pb2.ReadLatestAtSubjectRequest, via: Call
                          ) -> types_pb2.Message:
        if request.subject not in self.messages:
            raise RaftlogError(Reason.MESSAGE_NOT_FOUND, "none")
        return self.messages[request.subject]

    async def get_message(self, request: streams_pb2.GetMessageRequest, via: Call
                          ) -> types_pb2.Message:
        for message in self.messages.values():
            if message.seq == request.seq:
                return message
        raise RaftlogError(Reason.MESSAGE_NOT_FOUND, "none")

    async def publish(self, request: streams_pb2.PublishRequest, via: Call
                      ) -> streams_pb2.PublishAck:
        if request.HasField("expected_last_seq") and request.expected_last_seq != self.last_seq:
            raise RaftlogError(Reason.WRONG_LAST_SEQ, "moved")
        held = self.messages.get(request.subject)
        if request.HasField("expected_last_subject_seq") and \
                request.expected_last_subject_seq != (held.seq if held else 0):
            raise RaftlogError(Reason.WRONG_LAST_SUBJECT_SEQ, "moved")
        self.last_seq += 1
        self.messages[request.subject] = types_pb2.Message(
            seq=self.last_seq, subject=request.subject, payload=request.payload,
            headers=request.headers)
        return streams_pb2.PublishAck(seq=self.last_seq)

    async def purge(self, request: streams_pb2.PurgeStreamRequest, via: Call
                    ) -> streams_pb2.PurgeStreamResponse:
        held = self.messages.get(request.subject)
        if held is not None and held.seq < request.below_seq:
            del self.messages[request.subject]
            return streams_pb2.PurgeStreamResponse(purged=1)
        return streams_pb2.PurgeStreamResponse()


def ops_over(kind: int, *, max_bytes: int = 0) -> tuple[CollectionOps, StreamTwin]:
    collection = layout.target(kind, "c")
    twin = StreamTwin(layout.stream_config(collection, layout.Settings(kind=kind,
                                                                       max_bytes=max_bytes)))
    return CollectionOps(twin, consumers=None), twin  # type: ignore[arg-type]


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_a_key_with_more_subjects_than_one_listing_returns_is_listed_page_by_page(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "collection_subjects_page_max", 4)
    ops, twin = ops_over(layout.SET)
    members = [f"member-{k:02d}" for k in range(30)]

    async def scenario() -> tuple[Any, Any, Any]:
        for member in members:
            await ops.add_member(pb.SetMemberRequest(collection="c", key="k", member=member), VIA)
        await ops.add_member(pb.SetMemberRequest(collection="c", key="other", member="x"), VIA)
        for member in members[::3]:
            await ops.remove_member(pb.SetMemberRequest(collection="c", key="k", member=member),
                                    VIA)
        twin.listings = 0
        count = await ops.count_members(pb.SetKeyRequest(collection="c", key="k"), VIA)
        assert twin.listings > 1  # 20 subjects of the key, at most 4 per listing
        everything = await ops.list_members(pb.SetKeyRequest(collection="c", key="k"), VIA)
        page = await ops.list_members(pb.SetKeyRequest(collection="c", key="k", limit=5), VIA)
        return count, everything, page

    count, everything, page = run(scenario())
    live = [m for k, m in enumerate(members) if k % 3]
    assert count.count == len(live)
    tokens = sorted(layout.item_token(m, what="member") for m in live)
    assert list(everything.members) == [layout.decode_token(t) for t in tokens]
    assert not everything.truncated
    assert list(page.members) == list(everything.members)[:5] and page.truncated


def test_a_field_beside_a_delete_mark_is_read_before_it_is_counted() -> None:
    ops, twin = ops_over(layout.HASH)

    async def scenario() -> tuple[int, int]:
        for field in ("a", "b"):
            await ops.set_field(pb.SetHashFieldRequest(collection="c", key="k", field=field,
                                                       value=b"1"), VIA)
        for field, headers in (("a", []), ("b", [layout.TOMBSTONE])):
            prefix = layout.item_prefix(layout.HASH, "k", field, what="field")
            await twin.publish(streams_pb2.PublishRequest(subject=prefix + "d"), VIA)
            if headers:
                await twin.publish(streams_pb2.PublishRequest(subject=prefix + "v",
                                                              headers=headers), VIA)
        counted = await ops.count_fields(pb.HashKeyRequest(collection="c", key="k"), VIA)
        listed = await ops.get_hash(pb.HashKeyRequest(collection="c", key="k"), VIA)
        return counted.count, len(listed.entries)

    assert run(scenario()) == (1, 1)


def test_a_bounded_hash_refuses_a_write_past_max_bytes_and_counts_a_replaced_value_freed(
        ) -> None:
    ops, twin = ops_over(layout.HASH, max_bytes=100)

    async def put(field: str, size: int) -> int:
        reply = await ops.set_field(pb.SetHashFieldRequest(collection="c", key="k", field=field,
                                                           value=b"x" * size), VIA)
        return int(reply.revision)

    subject_bytes = len(layout.value_subject(layout.item_prefix(layout.HASH, "k", "a",
                                                                what="field")))
    run(put("a", 100 - subject_bytes))  # exactly full
    run(put("a", 100 - subject_bytes))  # replacing frees what it replaces
    with pytest.raises(RaftlogError) as info:
        run(put("a", 101 - subject_bytes))
    assert info.value.reason is Reason.COLLECTION_FULL
    assert info.value.metadata["would_be"] == "101"
    assert run(twin.info(None, VIA)).state.bytes == 100
