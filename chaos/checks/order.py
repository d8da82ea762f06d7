"""Per-producer order: `producer_order` reports a producer's message acknowledged at a lower seq
than a message of the same producer and stream whose acknowledgement completed before the
first one was first sent.

Subtle cases, decided:
- "First sent" is the first call that carried the msg_id. A retry acknowledged with the
  original seq (dedupe) after later messages were acknowledged is legal: its first attempt,
  whose outcome was unknown, stored it earlier.
- A message whose first send overlapped another's acknowledgement is not ordered against it
  (concurrent; a sequential producer has none but its own retries).
- Equal seqs for two messages are not an order problem; split brain (primaries.py) reports
  them.
- `across_producers=True` applies the rule to every producer of a stream together
  (linearizable appends), not only to each one's own messages.
"""

from __future__ import annotations

from collections.abc import Sequence

from raftlog.chaos.checks.anomaly import Anomaly, Kind
from raftlog.chaos.checks.calls import acked_writes
from raftlog.chaos.checks.realtime import Span, behind
from raftlog.chaos.events import Op


def producer_order(history: Sequence[Op], *, across_producers: bool = False) -> list[Anomaly]:
    """PRODUCER_ORDER per acknowledged message that went behind an earlier one; its ops are the
    earlier message's call, then this one's."""
    spans = []
    for write in acked_writes(history):
        key = (write.stream,) if across_producers else (write.call.process, write.stream)
        spans.append(Span(key, write.first_invoke_pos, write.call.end_pos, write.seq,
                          write.ops, f"{write.msg_id} of {write.call.process}"))
    found = []
    for earlier, later in behind(spans, spans):
        stream = later.key[-1]
        found.append(Anomaly(
            Kind.PRODUCER_ORDER,
            f"{later.label} acknowledged at seq {later.value} of {stream}, though first sent "
            f"after {earlier.label} was acknowledged at seq {earlier.value}",
            (*earlier.ops, *later.ops), stream, (earlier.value, later.value)))
    return found
