"""A chaos consumer that pipelines its Ack calls (chaos/drivers.py `acks_inflight`): its history
puts every ack in a process with no call open at its start, so the calls pair up."""

from __future__ import annotations

from raftlog.chaos.checks.calls import calls
from raftlog.chaos.history import AckDone, ConsumeHistory
from raftlog.chaos.recorded import to_history


def test_overlapping_acks_go_to_processes_with_no_call_open() -> None:
    consumed = ConsumeHistory(name="c", stream="s", acks=[
        AckDone((1,), sent_at=1.0, acked_at=1.5, node="a"),
        AckDone((2,), sent_at=1.1, acked_at=1.2, node="a"),  # overlaps the first
        AckDone((3,), sent_at=1.15, acked_at=1.6, node="a"),  # overlaps both
        AckDone((4,), sent_at=1.3, acked_at=1.4, node="a"),  # the second's process is free
        AckDone((5,), sent_at=2.0, acked_at=2.1, node="a"),  # every process is free
    ])
    history = to_history(started_at=0.0, stream="s", node_of={"a": "n1"}, published=[],
                         consumed=[consumed], reads=[], faults=[])
    paired = calls(history)  # raises when a process has two calls open at once
    by_seq = {tuple(call.value["seqs"]): call.invoke.process for call in paired
              if call.invoke.f == "ack"}
    assert by_seq == {(1,): "c-ack", (2,): "c-ack1", (3,): "c-ack2", (4,): "c-ack1",
                      (5,): "c-ack"}
