"""Publish quotas: token buckets per quota key, checked where a publish is served.

A quota key names what a quota is charged to: a stream (`stream:<name>`, the rates in the
stream's config, so Raft holds them and GetStreamInfo shows them), or a user (`user:<name>`,
the rates in the user's record, also held by Raft). `QuotaBook.admit` takes any key and any
`Rates`.

A bucket holds `limits.quota_burst_s` seconds of its rate and refills continuously on the
injected clock. A request is admitted whole or not at all: every bucket it names must hold its
cost before any is charged, so a refused request costs nothing and stores nothing. A cost
larger than a bucket can ever hold is refused without a retry hint (it would never pass).

A stream's buckets live on the node that serves the publish (the stream's primary): after a
failover the new primary starts with full buckets. A user's buckets live on the node that
received the call, charged before it forwards anything (`admit_caller`): a user publishing
through N nodes may reach N times its rate. At most `limits.quota_keys_max` keys are kept; the
least recently used is forgotten (it comes back full).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.transport.auth import Identity
from raftlog.v1 import streams_pb2, types_pb2

Draft = streams_pb2.PublishEntry | streams_pb2.PublishRequest
# A bucket short of fewer tokens than this holds enough: float sums of refills (0.05 s at
# 20/s) may land a hair below the whole token they add up to.
_ROUNDING_TOKENS = 1e-6


@dataclass(frozen=True, slots=True)
class Rates:
    """The rates of one quota key; 0 = no quota on that measure."""

    msgs_per_s: int = 0
    bytes_per_s: int = 0

    @classmethod
    def of_stream(cls, config: types_pb2.StreamConfig) -> Rates:
        return cls(msgs_per_s=config.max_msgs_per_s, bytes_per_s=config.max_bytes_per_s)

    @classmethod
    def of_caller(cls, identity: Identity) -> Rates:
        return cls(msgs_per_s=identity.max_msgs_per_s, bytes_per_s=identity.max_bytes_per_s)

    def __bool__(self) -> bool:
        return bool(self.msgs_per_s or self.bytes_per_s)


def stream_key(name: str) -> str:
    return f"stream:{name}"


def user_key(name: str) -> str:
    return f"user:{name}"


def admit_caller(book: QuotaBook, identity: Identity, drafts: Sequence[Draft]) -> None:
    """Charges a publish to the calling user's rates, whole, on the node the call reached
    (RATE_LIMITED: nothing of it is stored). A call another node forwarded was charged there;
    SYSTEM and users without rates are free."""
    rates = Rates.of_caller(identity)
    if rates and not identity.forwarded:
        book.admit(user_key(identity.name), rates, msgs=len(drafts),
                   bytes_total=sum(message_bytes(d) for d in drafts))


def message_bytes(entry: Draft) -> int:
    """What a message costs in bytes: subject, payload and headers, as a stream counts it."""
    headers = sum(len(h.key.encode()) + len(h.value.encode()) for h in entry.headers)
    return len(entry.subject.encode()) + len(entry.payload) + headers


class TokenBucket:
    """`rate_per_s` tokens a second, at most `rate_per_s * burst_s` held; starts full."""

    def __init__(self, *, rate_per_s: int, clock: Clock,
                 burst_s: float = limits.quota_burst_s) -> None:
        if rate_per_s <= 0:
            raise ValueError("a token bucket needs a positive rate")
        self.rate_per_s = rate_per_s
        self.capacity = rate_per_s * burst_s
        self._clock = clock
        self._tokens = self.capacity
        self._refilled_s = clock.monotonic_s()

    def tokens(self) -> float:
        """The tokens held now (refilled up to the capacity)."""
        now_s = self._clock.monotonic_s()
        elapsed_s = max(now_s - self._refilled_s, 0.0)
        self._tokens = min(self.capacity, self._tokens + elapsed_s * self.rate_per_s)
        self._refilled_s = now_s
        return self._tokens

    def wait_s(self, cost: int) -> float:
        """Seconds until `cost` tokens are held: 0 = now, inf = never (above the capacity)."""
        if cost > self.capacity:
            return math.inf
        missing = cost - self.tokens()
        return missing / self.rate_per_s if missing > _ROUNDING_TOKENS else 0.0

    def take(self, cost: int) -> None:
        """Charges `cost` (may go below zero: callers check `wait_s` first)."""
        self._tokens = self.tokens() - cost


@dataclass(frozen=True, slots=True)
class _Measure:
    what: str  # "msgs" or "bytes"
    rate_per_s: int
    cost: int


class QuotaBook:
    """The token buckets of one node, per quota key and measure."""

    def __init__(self, clock: Clock, *, keys_max: int = limits.quota_keys_max) -> None:
        self._clock = clock
        self._keys_max = keys_max
        self._buckets: OrderedDict[tuple[str, str], TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def _bucket(self, key: str, what: str, rate_per_s: int) -> TokenBucket:
        slot = (key, what)
        bucket = self._buckets.get(slot)
        if bucket is None or bucket.rate_per_s != rate_per_s:  # new, or its rate changed
            bucket = TokenBucket(rate_per_s=rate_per_s, clock=self._clock)
            self._buckets[slot] = bucket
        self._buckets.move_to_end(slot)
        while len(self._buckets) > self._keys_max:
            self._buckets.popitem(last=False)
        return bucket

    def admit(self, key: str, rates: Rates, *, msgs: int, bytes_total: int) -> None:
        """Charges `msgs` messages of `bytes_total` bytes to `key`, or raises RATE_LIMITED
        (with retry_after_ms) and charges nothing; BATCH_TOO_LARGE when the request is larger
        than a bucket holds (smaller requests pass)."""
        measures = [_Measure(what, rate, cost) for what, rate, cost in
                    (("msgs", rates.msgs_per_s, msgs), ("bytes", rates.bytes_per_s, bytes_total))
                    if rate]
        buckets = [self._bucket(key, m.what, m.rate_per_s) for m in measures]
        wait_s = 0.0
        for measure, bucket in zip(measures, buckets, strict=True):
            needed_s = bucket.wait_s(measure.cost)
            if math.isinf(needed_s):
                raise RaftlogError(
                    Reason.BATCH_TOO_LARGE,
                    f"{measure.cost} {measure.what} at once exceed the quota of {key} "
                    f"({measure.rate_per_s} {measure.what}/s); send less per request",
                    key=key, limit=int(bucket.capacity), measure=measure.what)
            wait_s = max(wait_s, needed_s)
        if wait_s > 0:
            worst = max(zip(measures, buckets, strict=True),
                        key=lambda pair: pair[1].wait_s(pair[0].cost))[0]
            raise RaftlogError(
                Reason.RATE_LIMITED,
                f"{key} is over its quota of {worst.rate_per_s} {worst.what}/s; retry later",
                key=key, limit=worst.rate_per_s, measure=worst.what,
                retry_after_ms=max(math.ceil(wait_s * 1000), 1))
        for measure, bucket in zip(measures, buckets, strict=True):
            bucket.take(measure.cost)

    def admit_each(self, key: str, rates: Rates, entries: Sequence[Draft]
                   ) -> list[RaftlogError | None]:
        """Per message in order (PublishStream): None for one admitted, the refusal for one
        not. Once one is refused the rest of `entries` is refused too, so that what a stream
        keeps of a run is a prefix of it."""
        outcomes: list[RaftlogError | None] = []
        refused: RaftlogError | None = None
        for entry in entries:
            if refused is None:
                try:
                    self.admit(key, rates, msgs=1, bytes_total=message_bytes(entry))
                except RaftlogError as err:
                    refused = err
            outcomes.append(refused)
        return outcomes
