"""A stream's counters after batch publishes that mix everything the publish loop treats on
its own: duplicates by msg_id, expectations met and missed, limits that remove the oldest
messages in the middle of a batch, and DISCARD_NEW refusals. After every batch the stream's
first_seq, last_seq, messages and bytes agree with what it stores, and its limits hold. Over
both message stores, like test_streams.py."""

from __future__ import annotations

import random

import pytest

from raftlog.node.engine.stream_publish import Appended, Draft, draft
from raftlog.v1 import types_pb2
from tests.engine.test_streams import Harness, Place, create, place, run

__all__ = ["place"]  # the fixture, over both stores

SUBJECTS = ("a", "b.c", "dd")


def _batch(rng: random.Random, last_seq: int) -> list[Draft]:
    batch = []
    for _ in range(rng.randrange(1, 12)):
        subject = rng.choice(SUBJECTS)
        payload = b"x" * rng.randrange(0, 9)
        msg_id = f"m{rng.randrange(30)}" if rng.random() < 0.3 else ""
        expected = None
        if rng.random() < 0.1:  # right when nothing before it in the batch is stored
            expected = last_seq if rng.random() < 0.5 else last_seq + 5
        headers = [("k", "v" * rng.randrange(3))] if rng.random() < 0.2 else []
        batch.append(draft(subject, payload, headers=headers, msg_id=msg_id,
                           expected_last_seq=expected))
    return batch


@pytest.mark.parametrize("fields", [
    {},
    {"max_msgs": 7},
    {"max_bytes": 40},
    {"max_msgs_per_subject": 2},
    {"max_msgs": 6, "discard": types_pb2.DISCARD_NEW},
    {"max_bytes": 35, "discard": types_pb2.DISCARD_NEW},
])
def test_counters_agree_with_what_is_stored(place: Place, fields: dict[str, int]) -> None:
    rng = random.Random(f"counters:{sorted(fields.items())}")

    async def body(h: Harness) -> None:
        await create(h, dedupe_window_ms=60_000, **fields)
        last_seq = 0
        for _ in range(40):
            results = await h.engine.publish("s", _batch(rng, last_seq))
            fresh = [r.seq for r in results if isinstance(r, Appended) and not r.duplicate]
            assert fresh == list(range(last_seq + 1, last_seq + 1 + len(fresh)))
            last_seq += len(fresh)
            stored = list(h.engine.get("s").scan(from_seq=1, limit=10_000))
            state = h.engine.info("s").state
            assert state.last_seq == last_seq
            assert state.messages == len(stored)
            assert state.bytes == sum(entry.size_bytes for entry in stored)
            assert state.first_seq == (stored[0].seq if stored else last_seq + 1)
            # and the limits hold, whichever way they are kept
            assert state.messages <= fields.get("max_msgs", state.messages)
            assert state.bytes <= fields.get("max_bytes", state.bytes)
            per_subject = max((sum(1 for e in stored if e.subject == subject)
                               for subject in SUBJECTS), default=0)
            assert per_subject <= fields.get("max_msgs_per_subject", per_subject)

    run(place, body)
