"""Every sighting of a message at a seq: what fetches delivered, what reads returned and what the
final contents hold, as `Observation`s with their source and ops. The two-payloads checker
compares them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from raftlog.chaos.checks.calls import Call
from raftlog.chaos.checks.final import Final
from raftlog.chaos.events import FETCH, READ, Op, get_seen, get_str

FINAL = "final"  # the source of an observation read from the final contents


@dataclass(frozen=True)
class Observation:
    stream: str
    seq: int
    msg_id: str  # '' when unknown
    digest: str  # '' when unknown
    source: str  # fetch | read | final
    node: str  # the node that served it ('' for the final contents)
    ops: tuple[Op, ...]

    def __str__(self) -> str:
        origin = f"{self.source} #{self.ops[0].index}" if self.ops else self.source
        where = f" on {self.node}" if self.node else ""
        return f"{self.msg_id or '?'}/{self.digest or '?'} ({origin}{where})"


def observations(all_calls: Sequence[Call], final: Final) -> list[Observation]:
    """Sightings from ok fetches and reads (in invoke order), then from the final contents."""
    found = []
    for call in all_calls:
        if not call.ok or call.f not in (FETCH, READ):
            continue
        key = "deliveries" if call.f == FETCH else "messages"
        node = get_str(call.value, "served_by") or call.invoke.node
        found += [Observation(call.stream, item.seq, item.msg_id, item.digest, call.f, node,
                              call.ops) for item in get_seen(call.value, key)]
    for stream, contents in sorted(final.contents.items()):
        found += [Observation(stream, seq, msg_id, digest, FINAL, "", ())
                  for seq, (msg_id, digest) in sorted(contents.messages.items())]
    return found
