"""What a node knows of the source tails it runs: one `TailStatus` per (sourcing stream,
source stream), kept in the `TailRegistry` that StreamInfo and GetStreamSources read.

A status lives as long as its tail on this node: after a failover the new primary's tail
starts its counters at 0 (its position, last_sourced_seq, comes from the stream itself).
"""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.base import limits
from raftlog.v1 import types_pb2

# An error that the next successful read clears (source missing, either side failing over),
# and one that stays until a later round copies a message without error (a message that
# could not be copied, a skipped gap): an idle tail keeps reporting the latter.
TRANSIENT = "transient"
EVENT = "event"


@dataclass
class TailStatus:
    sourcing_stream: str
    source_stream: str
    node: str
    last_sourced_seq: int = 0
    next_seq: int = 0
    source_last_seq: int = 0
    pulled_total: int = 0
    appended_total: int = 0
    errors_total: int = 0
    last_error: str = ""
    last_error_ts_ms: int = 0
    error_kind: str = ""
    halted: bool = False

    def record_error(self, text: str, *, now_ms: int, kind: str) -> None:
        self.last_error = text[:limits.source_error_chars_max]
        self.last_error_ts_ms = now_ms
        self.error_kind = kind
        self.errors_total += 1

    def clear_error(self, *, copied: bool) -> None:
        """After a round that went well (`copied`: it appended a message)."""
        if self.halted or not self.last_error:
            return
        if self.error_kind == TRANSIENT or copied:
            self.last_error, self.last_error_ts_ms, self.error_kind = "", 0, ""

    def to_pb(self) -> types_pb2.SourceStatus:
        return types_pb2.SourceStatus(
            sourcing_stream=self.sourcing_stream, source_stream=self.source_stream,
            last_sourced_seq=self.last_sourced_seq, pulled_total=self.pulled_total,
            last_error=self.last_error, last_error_ts_ms=self.last_error_ts_ms,
            node=self.node, next_seq=self.next_seq, source_last_seq=self.source_last_seq,
            appended_total=self.appended_total, errors_total=self.errors_total,
            halted=self.halted)


class TailRegistry:
    """The statuses of the tails running here, by (sourcing stream, source stream)."""

    def __init__(self) -> None:
        self._statuses: dict[tuple[str, str], TailStatus] = {}

    def add(self, status: TailStatus) -> None:
        self._statuses[(status.sourcing_stream, status.source_stream)] = status

    def remove(self, status: TailStatus) -> None:
        key = (status.sourcing_stream, status.source_stream)
        if self._statuses.get(key) is status:
            del self._statuses[key]

    def statuses(self, sourcing_stream: str = "") -> list[types_pb2.SourceStatus]:
        """Every tail's status (or only `sourcing_stream`'s), sorted."""
        return [status.to_pb() for key, status in sorted(self._statuses.items())
                if not sourcing_stream or key[0] == sourcing_stream]
