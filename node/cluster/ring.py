"""The consistent-hash ring: which member owns a stream, and which members hold its replicas.

Pure and deterministic: the ring is a function of the member set alone (order and duplicates do
not matter), so every node that has applied the same Raft membership computes the same placement,
in every process. Tokens come from BLAKE2b, never from `hash()`, whose value for a `str` changes
with PYTHONHASHSEED.

Each member gets `vnodes_per_member` tokens (`limits.ring_vnodes_per_member` unless a caller
says otherwise) on a 64-bit circle (`limits.ring_token_bytes`); a stream belongs to the member
of the first token at or after the stream's own token, wrapping past the top (clockwise).
Replicas are the owner, then the next distinct members clockwise. Lookups bisect the sorted
tokens: O(log n) in the number of tokens; collecting r replicas walks on until r distinct
members have been seen.

A topic's partition stream (base/topics.py) is the exception: partition i starts at the
`i mod n`-th distinct member clockwise from the topic's own token, so the partitions of one topic
spread over the members instead of falling where their names hash.

Placement (DESIGN.md §2 Routing): primary = the authority override when it names a member, else
the ring owner; replicas = the primary first, then the ring's order without the primary.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from raftlog.base import limits, topics
from raftlog.base.errors import RaftlogError, Reason

# Tokens per member, `limits.ring_vnodes_per_member`. Measured with 10,000 stream names
# (tests/process/test_ring.py): 256 keeps the busiest member within 1.20x of the mean for 3, 5
# and 7 members across 900 random member-name sets (p99 1.15 / 1.17 / 1.19); 128 reaches 1.31
# and 512 gains only ~0.03 at 7 members, where the sampling noise of 10,000 streams (~2.6 %)
# dominates. Changing it moves streams.

# BLAKE2b personalisation (<= 16 bytes) keeps member tokens and stream tokens in separate domains.
_vnode_person = b"raftlog.vnode"
_stream_person = b"raftlog.stream"
_topic_person = b"raftlog.topic"


def _token(data: str, *, person: bytes) -> int:
    digest = hashlib.blake2b(data.encode(), digest_size=limits.ring_token_bytes,
                             person=person).digest()
    return int.from_bytes(digest, "big")


def stream_token(stream: str) -> int:
    """The stream's position on the circle, in [0, 2**64)."""
    return _token(stream, person=_stream_person)


def topic_token(topic: str) -> int:
    """A topic's position on the circle: partition i of the topic belongs to the i-th distinct
    member clockwise from it (mod the member count), so one topic's partitions land on distinct
    primaries while there are members enough."""
    return _token(topic, person=_topic_person)


def vnode_token(member: str, index: int) -> int:
    """The position of `member`'s `index`-th virtual node, in [0, 2**64)."""
    return _token(f"{member}#{index}", person=_vnode_person)


@dataclass(frozen=True)
class Placement:
    """Where a stream lives and why; what route-explain shows a user."""

    stream: str
    ring_owner: str
    primary: str
    replicas: tuple[str, ...]  # primary first
    override: str | None  # the authority override asked for, member or not
    reason: str


class Ring:
    """An immutable ring over a member set; build a new one when the membership changes."""

    def __init__(
        self, members: Iterable[str], *, vnodes_per_member: int | None = None
    ) -> None:
        if vnodes_per_member is None:
            vnodes_per_member = limits.ring_vnodes_per_member
        member_set = frozenset(members)
        if vnodes_per_member < 1:
            raise RaftlogError(
                Reason.INVALID_ARGUMENT,
                "a ring needs at least one virtual node per member",
                vnodes_per_member=vnodes_per_member,
            )
        if "" in member_set:
            raise RaftlogError(Reason.INVALID_ARGUMENT, "a ring member needs a non-empty name")
        # Ties on a token (odds ~ n**2 / 2**65) are broken by member name, so still deterministic.
        points = sorted(
            (vnode_token(member, index), member)
            for member in member_set
            for index in range(vnodes_per_member)
        )
        self._tokens: list[int] = [token for token, _ in points]
        self._owners: list[str] = [member for _, member in points]
        self._members: tuple[str, ...] = tuple(sorted(member_set))
        self.vnodes_per_member = vnodes_per_member

    @property
    def members(self) -> tuple[str, ...]:
        """The members, sorted by name."""
        return self._members

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, member: object) -> bool:
        return member in self._members

    def owner(self, stream: str) -> str:
        """The member whose virtual node is the first at or after the stream's token."""
        return self._owners[self._first_index(stream)]

    def replicas_for(self, stream: str, count: int) -> tuple[str, ...]:
        """The owner, then the next distinct members clockwise; `count` is capped by the size."""
        _check_replicas(count)
        return self._clockwise(self._first_index(stream), count)

    def place(self, stream: str, *, replicas: int, override: str | None = None) -> Placement:
        """Primary = `override` if it is a member, else the ring owner; replicas put it first."""
        _check_replicas(replicas)
        ring_order = self._clockwise(self._first_index(stream), len(self._members))
        ring_owner = ring_order[0]
        primary = override if override is not None and override in self._members else ring_owner
        followers = tuple(member for member in ring_order if member != primary)
        chosen = (primary, *followers)[:replicas]
        return Placement(
            stream=stream,
            ring_owner=ring_owner,
            primary=primary,
            replicas=chosen,
            override=override,
            reason=self._explain(stream, ring_owner=ring_owner, override=override)
            + _explain_replicas(asked=replicas, chosen=len(chosen), moved=primary != ring_owner),
        )

    def _clockwise(self, start: int, count: int) -> tuple[str, ...]:
        """The first `count` distinct members from virtual node `start` on, capped by the size."""
        wanted = min(count, len(self._members))
        chosen: list[str] = []
        for step in range(len(self._owners)):
            if len(chosen) == wanted:
                break
            member = self._owners[(start + step) % len(self._owners)]
            if member not in chosen:
                chosen.append(member)
        return tuple(chosen)

    def _first_index(self, stream: str) -> int:
        if not self._tokens:
            raise RaftlogError(
                Reason.NO_QUORUM, "the ring has no members to place a stream on", stream=stream
            )
        partition = topics.parse_partition_stream(stream)
        if partition is None:
            return bisect.bisect_left(self._tokens, stream_token(stream)) % len(self._tokens)
        topic, index = partition
        start = bisect.bisect_left(self._tokens, topic_token(topic)) % len(self._tokens)
        return self._nth_distinct(start, index % len(self._members))

    def _nth_distinct(self, start: int, nth: int) -> int:
        """The virtual node, from `start` on clockwise, where the `nth` distinct member (0 =
        the first) first appears."""
        seen: set[str] = set()
        for step in range(len(self._owners)):
            at = (start + step) % len(self._owners)
            member = self._owners[at]
            if member not in seen:
                if len(seen) == nth:
                    return at
                seen.add(member)
        return start  # unreachable: nth < the number of members

    def _explain(self, stream: str, *, ring_owner: str, override: str | None) -> str:
        partition = topics.parse_partition_stream(stream)
        if override is None and partition is not None:
            topic, index = partition
            return (
                f"ring owner: partition {index} of topic {topic!r} belongs to the member "
                f"{index % len(self._members)} places clockwise (distinct members, from 0) from "
                f"the topic's token {topic_token(topic):#018x}: {ring_owner!r}"
            )
        if override is None:
            return (
                f"ring owner: {ring_owner!r} holds the first virtual node at or after the "
                f"stream's token {stream_token(stream):#018x}"
            )
        if override in self._members:
            return (
                f"authority override: primary pinned to {override!r} "
                f"(the ring owner would be {ring_owner!r})"
            )
        return (
            f"authority override {override!r} is not a member, so the ring owner "
            f"{ring_owner!r} is primary"
        )


def _check_replicas(count: int) -> None:
    if count < 1:
        raise RaftlogError(
            Reason.INVALID_ARGUMENT, "a stream needs at least one replica", replicas=count
        )


def _explain_replicas(*, asked: int, chosen: int, moved: bool) -> str:
    text = "; replicas: the primary, then the next distinct members clockwise on the ring"
    if moved:
        text = "; replicas: the primary, then the ring owner and the members clockwise after it"
    if chosen < asked:
        text += f" ({asked} asked, capped at the {chosen} members)"
    return text
