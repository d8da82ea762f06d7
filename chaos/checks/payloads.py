"""One seq, one message: `two_payloads` reports a seq of a stream seen holding different
messages (msg_id or payload digest) in any fetch, read or the final contents, on any node.

Subtle cases, decided:
- Two sightings conflict when both know the msg_id and the msg_ids differ, or both know the
  digest and the digests differ; an unknown ('') field matches anything.
- By default (`uncommitted_reads_allowed=False`) every sighting counts: raftlog hands out
  nothing above a stream's commit_seq (node/consumers: G4), and a committed entry survives
  failover, so a fetch that saw X at seq 5 when the final contents hold Y there is a dirty
  read, even if X was never acknowledged to its publisher.
- With `uncommitted_reads_allowed=True` (a read path that may serve an unreplicated tail), a
  fetch or read sighting counts only when its message was acknowledged at that seq: seeing a
  tail that a failover then truncated is legal if the write was never acknowledged.
- Acknowledgements are not sightings: two messages acknowledged at one seq is split brain
  (primaries.py); an acknowledged message stored elsewhere is a wrong seq (stored.py).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from raftlog.chaos.checks.anomaly import Anomaly, Kind
from raftlog.chaos.checks.calls import acked_writes, calls
from raftlog.chaos.checks.final import Final
from raftlog.chaos.checks.seen import FINAL, Observation, observations
from raftlog.chaos.events import Op


def two_payloads(history: Sequence[Op], final: Final, *,
                 uncommitted_reads_allowed: bool = False) -> list[Anomaly]:
    """TWO_PAYLOADS per (stream, seq) seen with conflicting messages; its ops are those of the
    first sighting of each distinct message."""
    all_calls = calls(history)
    seen = observations(all_calls, final)
    if uncommitted_reads_allowed:
        acked = {(w.stream, w.seq, w.msg_id) for w in acked_writes(history)}
        seen = [item for item in seen
                if item.source == FINAL or (item.stream, item.seq, item.msg_id) in acked]
    by_seq: dict[tuple[str, int], list[Observation]] = collections.defaultdict(list)
    for item in seen:
        by_seq[(item.stream, item.seq)].append(item)
    found = []
    for (stream, seq), items in sorted(by_seq.items()):
        if _conflicting(items):
            first: dict[tuple[str, str], Observation] = {}
            for item in items:
                first.setdefault((item.msg_id, item.digest), item)
            variants = list(first.values())
            ops = tuple(dict.fromkeys(op for item in variants for op in item.ops))
            nodes = tuple(sorted({item.node for item in items if item.node}))
            found.append(Anomaly(Kind.TWO_PAYLOADS, f"seq {seq} of {stream} seen as "
                                 + " and ".join(str(item) for item in variants),
                                 ops, stream, (seq,), nodes))
    return found


def _conflicting(items: Sequence[Observation]) -> bool:
    msg_ids = {item.msg_id for item in items if item.msg_id}
    digests = {item.digest for item in items if item.digest}
    return len(msg_ids) > 1 or len(digests) > 1
