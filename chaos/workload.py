"""A seeded, bounded workload for a raftlog cluster, and the checker of what it recorded: the one
module its users import (`from raftlog.chaos import workload as wl`, then `wl.<name>`). It owns
no code: it re-exports the workload's parts, each in its own module under chaos/:

- `clients.py`  how the workload reaches the nodes: `Nodes` (channels, stubs, `rotate`),
  `PeerAccess` (signed calls to the peer listeners), `error_name`, `CollectError`.
- `history.py`  what a run records: `PublishHistory` (`Attempt`, `Ack`), `ConsumeHistory`
  (`Delivery`, `AckDone`); the payload codec (`encode_payload`, `decode_payload`) and the seed
  (`seed_from_env`, `SEED_ENV`).
- `drivers.py`  `Publisher`: publishes uniquely identified messages to one stream (unary
  `Publish`, or `PublishBatch` of K) through a list of nodes, moving to the next node on failure
  and retrying with the SAME msg_id after a bounded backoff, so that dedupe keeps a retried
  message once; it records every attempt and every acknowledged (msg_id, seq). `Consumer`: a
  fetch + ack loop on a durable consumer through any node; it records every delivery (seq,
  msg_id, deliver_count) and every ack the server acknowledged.
- `collect.py`  collectors (`read_stream`, `read_replicas`, `wait_replicas_converged`,
  `wait_caught_up`): what the cluster holds now, through the public API and through `ReadLocal`
  on every node; `explain_route`, `create_stream`.
- `checker.py`  `check(...)`: pure (histories + collected state in, a `Report` out). It reports
  acknowledged messages missing or at another seq than acknowledged, duplicates, gaps,
  deliveries of messages that are not stored (uncommitted reads), acks acknowledged and then
  undone, and replicas that differ on the committed prefix. A failed report prints `reproduce
  with seed=...`. `audit` collects and checks; `failover_timing` measures the time from a fault
  to the first acknowledged publish after it.

Independent of pytest: the failover tests, `scripts/bench_failover.py` and the chaos harness
all drive it. A message's identity travels in its payload (`wl1|<msg_id>|<filler>`), so a copy
stored without its msg_id field (or under another seq) is still recognised. Everything is
bounded: message counts, run time, attempts per message, pages read, every call's deadline (the
bounds are module constants of the part that uses them).

The seed fixes the message ids, payloads, subjects, node order and backoff jitter; it cannot fix
the scheduling of processes, so a rerun with the same seed makes the same requests, not
necessarily the same interleaving.
"""

from __future__ import annotations

from raftlog.chaos.checker import (
    AckUndone,
    CheckFailed,
    Divergence,
    FailoverTiming,
    Report,
    WrongSeq,
    audit,
    check,
    failover_timing,
)
from raftlog.chaos.clients import (
    CHANNEL_OPTIONS,
    Clock,
    CollectError,
    Nodes,
    PeerAccess,
    error_name,
)
from raftlog.chaos.collect import (
    ReplicaCopy,
    ReplicaSurvey,
    StoredView,
    StreamContents,
    create_stream,
    explain_route,
    read_replicas,
    read_stream,
    wait_caught_up,
    wait_replicas_converged,
)
from raftlog.chaos.drivers import (
    FATAL_REASONS,
    Consumer,
    ConsumerConfig,
    Publisher,
    PublisherConfig,
)
from raftlog.chaos.history import (
    PAYLOAD_MAGIC,
    SEED_ENV,
    Ack,
    AckDone,
    Attempt,
    ConsumeHistory,
    Delivery,
    PublishHistory,
    decode_payload,
    encode_payload,
    seed_from_env,
)

__all__ = [
    "CHANNEL_OPTIONS",
    "FATAL_REASONS",
    "PAYLOAD_MAGIC",
    "SEED_ENV",
    "Ack",
    "AckDone",
    "AckUndone",
    "Attempt",
    "CheckFailed",
    "Clock",
    "CollectError",
    "ConsumeHistory",
    "Consumer",
    "ConsumerConfig",
    "Delivery",
    "Divergence",
    "FailoverTiming",
    "Nodes",
    "PeerAccess",
    "PublishHistory",
    "Publisher",
    "PublisherConfig",
    "ReplicaCopy",
    "ReplicaSurvey",
    "Report",
    "StoredView",
    "StreamContents",
    "WrongSeq",
    "audit",
    "check",
    "create_stream",
    "decode_payload",
    "encode_payload",
    "error_name",
    "explain_route",
    "failover_timing",
    "read_replicas",
    "read_stream",
    "seed_from_env",
    "wait_caught_up",
    "wait_replicas_converged",
]
