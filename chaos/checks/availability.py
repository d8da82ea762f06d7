"""Availability, measured from the history: the windows without an acknowledged write (a
publish, publish_batch or probe that completed ok with a seq) while a majority was connected,
and the recovery after each fault: the time from a fault's stop (heal), or the start of an
instant fault (kill), to the first acknowledged write invoked after it.

`measure_availability` returns the figures; `check_availability` turns windows longer than a
bound into UNAVAILABLE anomalies.

Decided:
- The run is the span from the first client op to the last one (setup and nemesis events after
  the clients stopped do not count).
- A majority is connected from the start until a cluster event `connected` {"majority":
  false}, and again from one with true; nemesis events alone do not say it (killing one node
  of three leaves a majority, cutting two does not: the nemesis knows, and records it).
- Windows are cut at the edges of the connected periods: time without a majority is not
  unavailability. It is reported as `majority_cut_s`.
- Recovery counts a write INVOKED after the event (a write in flight at a kill that completes
  just after it says nothing about the new primary); a fault followed by no acknowledged
  write is unrecovered (None), and left out of the percentiles. An event after the last write
  was invoked (a heal once the writers stopped) is not judged: no write could show a recovery.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from raftlog.chaos.checks.anomaly import Anomaly, Kind
from raftlog.chaos.checks.calls import Call, acked_writes, events
from raftlog.chaos.events import (
    CLUSTER,
    CONNECTED,
    NEMESIS,
    PROBE,
    PUBLISH,
    PUBLISH_BATCH,
    START,
    STOP,
    HistoryFormatError,
    Op,
    OpType,
    get_bool,
    get_str,
)

WRITE_FS = frozenset({PUBLISH, PUBLISH_BATCH, PROBE})
instant_faults_default = frozenset({"kill"})  # faults whose start is measured, not their stop
windows_kept_max = 10  # longest windows an Availability keeps
median_rank = 0.5


@dataclass(frozen=True)
class Window:
    """A stretch of a connected period without an acknowledged write, in run seconds."""

    start_t: float
    end_t: float

    @property
    def duration_s(self) -> float:
        return self.end_t - self.start_t


@dataclass(frozen=True)
class Recovery:
    fault: str
    phase: str  # start | stop
    at_t: float
    recover_s: float | None  # None: no write invoked after it was acknowledged
    ops: tuple[Op, ...]  # the nemesis event, then the call of the first acknowledged write
    majority: bool = True  # a majority was connected right after the event


@dataclass(frozen=True)
class Availability:
    windows: tuple[Window, ...]  # the longest first, at most windows_kept_max
    recoveries: tuple[Recovery, ...]
    acked_writes: int  # calls that acknowledged at least one message
    run_s: float
    majority_cut_s: float

    @property
    def longest(self) -> Window | None:
        return self.windows[0] if self.windows else None

    @property
    def recover_s_p50(self) -> float | None:
        return percentile(self._recovered(), median_rank)

    @property
    def recover_s_max(self) -> float | None:
        return max(self._recovered(), default=None)

    @property
    def unrecovered(self) -> int:
        return sum(1 for recovery in self.recoveries
                   if recovery.majority and recovery.recover_s is None)

    @property
    def without_majority(self) -> int:
        """Fault starts that left no majority connected (their recovery is the heal's)."""
        return sum(1 for recovery in self.recoveries if not recovery.majority)

    def _recovered(self) -> list[float]:
        """The recoveries the cluster promises: after events that left a majority connected."""
        return sorted(r.recover_s for r in self.recoveries
                      if r.majority and r.recover_s is not None)

    def summary(self) -> str:
        """Two lines: the longest window, then the recoveries."""
        longest = self.longest
        window = ("none" if longest is None else f"{longest.duration_s:.3f} s "
                  f"(t={longest.start_t:.3f}..{longest.end_t:.3f})")
        return (f"availability: longest window without an acknowledged write, majority "
                f"connected: {window}; {self.acked_writes} acknowledged write calls in "
                f"{self.run_s:.3f} s; majority cut {self.majority_cut_s:.3f} s\n"
                f"recovery after {len(self.recoveries) - self.without_majority} fault events "
                f"with a majority connected: p50 {_seconds(self.recover_s_p50)}, max "
                f"{_seconds(self.recover_s_max)}, unrecovered {self.unrecovered} "
                f"({self.without_majority} left no majority until their heal)")


def measure_availability(history: Sequence[Op], *,
                         instant_faults: frozenset[str] = instant_faults_default) -> Availability:
    acked = _acked_calls(history)
    client_ts = _write_times(history)
    if not client_ts:
        return Availability((), (), 0, 0.0, 0.0)
    start_t, end_t = client_ts[0], client_ts[-1]
    periods = _connected_periods(history, start_t=start_t, end_t=end_t)
    windows = sorted(_windows(periods, [call.end_t for call in acked]),
                     key=lambda window: -window.duration_s)
    connected_s = sum(high - low for low, high in periods)
    return Availability(tuple(windows[:windows_kept_max]),
                        _recoveries(history, acked, instant_faults), len(acked),
                        end_t - start_t, (end_t - start_t) - connected_s)


def check_availability(history: Sequence[Op], *, window_s_max: float) -> list[Anomaly]:
    """UNAVAILABLE per window (majority connected) without an acknowledged write that lasted
    longer than `window_s_max`."""
    acked = _acked_calls(history)
    client_ts = _write_times(history)
    if not client_ts:
        return []
    periods = _connected_periods(history, start_t=client_ts[0], end_t=client_ts[-1])
    return [Anomaly(Kind.UNAVAILABLE, f"no acknowledged write for {window.duration_s:.3f} s "
                    f"(t={window.start_t:.3f}..{window.end_t:.3f}) with a majority connected; "
                    f"bound {window_s_max} s")
            for window in _windows(periods, [call.end_t for call in acked])
            if window.duration_s > window_s_max]


def _write_times(history: Sequence[Op]) -> list[float]:
    """When writes were invoked or completed: the span availability is measured over (reads
    and a consumer's drain after the writers stopped do not count)."""
    return [op.t for op in history if not op.is_event and op.f in WRITE_FS]


def _acked_calls(history: Sequence[Op]) -> list[Call]:
    """Write calls that acknowledged at least one message, in completion order."""
    unique = {write.call.invoke_pos: write.call for write in acked_writes(history)}
    return sorted(unique.values(), key=lambda call: call.end_pos)


def _connected_periods(history: Sequence[Op], *, start_t: float,
                       end_t: float) -> list[tuple[float, float]]:
    periods = []
    since: float | None = start_t
    for _pos, op in events(history, process=CLUSTER, f=CONNECTED):
        if "majority" not in op.value:
            raise HistoryFormatError(f"{op}: a connected event without majority")
        at = min(max(op.t, start_t), end_t)
        majority = get_bool(op.value, "majority", True)
        if since is not None and not majority:
            periods.append((since, at))
            since = None
        elif since is None and majority:
            since = at
    if since is not None:
        periods.append((since, end_t))
    return periods


def _windows(periods: Sequence[tuple[float, float]], ack_ts: Sequence[float]) -> list[Window]:
    found = []
    ordered = sorted(ack_ts)
    for low, high in periods:
        inside = ordered[bisect.bisect_left(ordered, low):bisect.bisect_right(ordered, high)]
        found += [Window(a, b) for a, b in itertools.pairwise([low, *inside, high]) if b > a]
    return found


def _majority_after(connected: Sequence[tuple[float, bool]], t: float) -> bool:
    """Whether a majority was connected right after `t` (the last `connected` event at or
    before it, else since the start)."""
    at = bisect.bisect_right([event_t for event_t, _ in connected], t)
    return connected[at - 1][1] if at else True


def _recoveries(history: Sequence[Op], acked: Sequence[Call],
                instant_faults: frozenset[str]) -> tuple[Recovery, ...]:
    connected = [(op.t, get_bool(op.value, "majority", True))
                 for _pos, op in events(history, process=CLUSTER, f=CONNECTED)]
    invoked_t = [op.t for op in history
                 if not op.is_event and op.f in WRITE_FS and op.type == OpType.INVOKE]
    last_invoke_t = max(invoked_t, default=math.inf)
    by_invoke = sorted(acked, key=lambda call: call.invoke_pos)
    invoke_positions = [call.invoke_pos for call in by_invoke]
    first_done: list[Call | None] = [None] * (len(by_invoke) + 1)  # suffix: earliest to end
    for i in range(len(by_invoke) - 1, -1, -1):
        later = first_done[i + 1]
        first_done[i] = by_invoke[i] if later is None or by_invoke[i].end_t <= later.end_t \
            else later
    found = []
    for pos, op in events(history, process=NEMESIS):
        phase = get_str(op.value, "phase")
        if phase not in (START, STOP):
            raise HistoryFormatError(f"{op}: phase must be {START} or {STOP}")
        if (phase == START and op.f not in instant_faults) or op.t >= last_invoke_t:
            continue
        first = first_done[bisect.bisect_right(invoke_positions, pos)]
        recover_s = None if first is None else first.end_t - op.t
        found.append(Recovery(op.f, phase, op.t, recover_s,
                              (op,) if first is None else (op, *first.ops),
                              _majority_after(connected, op.t)))
    return tuple(found)


def percentile(ordered: Sequence[float], rank: float) -> float | None:
    """Nearest-rank percentile of ascending values; None when there are none."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(rank * len(ordered)) - 1)]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"
