"""`StreamLog.fill_new`, a fetch's hot path (node/engine/stream_reads.py and its in-memory twin
in node/engine/log.py): it adds exactly what a scan with no filter, cut at the payload room,
would have added, with every field of each message, over both message stores."""

from __future__ import annotations

import itertools

from raftlog.node.engine.log import LogEntry, MemoryStreamLog, NewRun, StreamLog, fill_message
from raftlog.node.engine.stream_publish import draft
from raftlog.v1 import consumers_pb2, types_pb2
from tests.engine.test_streams import Harness, Place, create, place, run

__all__ = ["place"]  # the fixture: a RocksDB store and the in-memory one

MESSAGES = 40
REMOVED = [5, 6, 7, 20]  # holes, as retention and acks of a work queue leave them


def _published() -> list[types_pb2.Message]:
    """Payloads of 0-29 bytes; every third message has headers, every fourth a msg id."""
    out = []
    for k in range(MESSAGES):
        headers = [("h", f"v{k}"), ("trace", "x")] if k % 3 == 0 else []
        out.append(draft(f"s.{k % 5}", bytes([k]) * (k % 30), headers=headers,
                         msg_id=f"id-{k}" if k % 4 == 0 else ""))
    return out


def _reference(log: StreamLog, answer: consumers_pb2.FetchResponse, *, from_seq: int,
               limit: int, payload_room: int) -> NewRun:
    """The rule fill_new must follow, written out over `scan`."""
    seqs: list[int] = []
    taken_bytes, had = 0, len(answer.messages)
    for entry in log.scan(from_seq=from_seq, limit=limit):
        if taken_bytes + len(entry.payload) > payload_room and (had or seqs):
            return NewRun(seqs, taken_bytes, full=True)
        taken_bytes += len(entry.payload)
        fill_message(answer.messages.add(), log.name, entry, deliver_count=1)
        seqs.append(entry.seq)
    return NewRun(seqs, taken_bytes, full=False)


def _answer(had: int) -> consumers_pb2.FetchResponse:
    """An answer that already holds `had` messages (redeliveries go in first)."""
    answer = consumers_pb2.FetchResponse()
    for k in range(had):
        answer.messages.add(seq=1000 + k, subject="redelivered", deliver_count=2)
    return answer


def test_fill_new_adds_what_a_scan_cut_at_the_room_adds(place: Place) -> None:
    async def body(h: Harness) -> int:
        await create(h, "s", subjects=["s.>"])
        await h.engine.publish("s", _published())
        log = h.engine.get("s")
        await log.remove(REMOVED)
        cases = itertools.product(
            [1, 4, 5, 8, 20, 21, 39, 40, 41, 60],  # from_seq: in holes, at the end, past it
            [0, 1, 3, 100],  # limit
            [0, 1, 14, 100, 10**9],  # payload room, in bytes
            [0, 2])  # messages already in the answer
        checked = 0
        for from_seq, limit, room, had in cases:
            expected, got = _answer(had), _answer(had)
            want = _reference(log, expected, from_seq=from_seq, limit=limit, payload_room=room)
            run_ = log.fill_new(got.messages, from_seq=from_seq, limit=limit, payload_room=room)
            case = (from_seq, limit, room, had)
            assert run_ == want, case
            assert list(got.messages) == list(expected.messages), case
            checked += 1
        return checked

    assert run(place, body) == 10 * 4 * 5 * 2


def test_fill_new_keeps_headers_msg_ids_and_the_stream_name(place: Place) -> None:
    async def body(h: Harness) -> list[types_pb2.Message]:
        await create(h, "orders", subjects=["s.>"])
        await h.engine.publish("orders", [
            draft("s.a", b"one", headers=[("k1", "v1"), ("k2", "")], msg_id="m-1"),
            draft("s.b", b"")])
        answer = consumers_pb2.FetchResponse()
        h.engine.get("orders").fill_new(answer.messages, from_seq=1, limit=10,
                                        payload_room=10**6)
        return list(answer.messages)

    first, second = run(place, body)
    assert (first.seq, first.subject, first.payload, first.msg_id, first.deliver_count,
            first.stream) == (1, "s.a", b"one", "m-1", 1, "orders")
    assert [(h.key, h.value) for h in first.headers] == [("k1", "v1"), ("k2", "")]
    assert first.ts_ms > 0 and second.ts_ms >= first.ts_ms
    assert (second.seq, second.payload, second.msg_id, list(second.headers)) == (2, b"", "", [])


def test_the_first_message_fits_an_empty_answer_whatever_its_size(place: Place) -> None:
    async def body(h: Harness) -> tuple[NewRun, NewRun]:
        await create(h, "s", subjects=["s.>"])
        await h.engine.publish("s", [draft("s.a", b"x" * 50), draft("s.a", b"y")])
        log = h.engine.get("s")
        empty, holding = _answer(0), _answer(1)
        return (log.fill_new(empty.messages, from_seq=1, limit=10, payload_room=10),
                log.fill_new(holding.messages, from_seq=1, limit=10, payload_room=10))

    alone, behind_one = run(place, body)
    assert alone == NewRun([1], 50, full=True)
    assert behind_one == NewRun([], 0, full=True)


def test_the_in_memory_twin_follows_the_same_rule() -> None:
    log = MemoryStreamLog(name="twin")
    for k in range(1, MESSAGES + 1):
        log.entries[k] = LogEntry(k, f"s.{k % 5}", 1_700_000_000_000 + k, bytes([k]) * (k % 30),
                                  (("h", f"v{k}"),) if k % 3 == 0 else (),
                                  f"id-{k}" if k % 4 == 0 else "")
    log.last_seq = MESSAGES
    for seq in REMOVED:
        del log.entries[seq]
    for from_seq, limit, room, had in itertools.product(
            [1, 5, 21, 40, 41], [0, 1, 3, 100], [0, 1, 14, 10**9], [0, 2]):
        expected, got = _answer(had), _answer(had)
        want = _reference(log, expected, from_seq=from_seq, limit=limit, payload_room=room)
        assert log.fill_new(got.messages, from_seq=from_seq, limit=limit,
                            payload_room=room) == want
        assert list(got.messages) == list(expected.messages)
