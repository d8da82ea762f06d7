"""The chaos history: its event model (`Op`), the schema of each operation's `value`, and its
JSON-lines form (`HistoryWriter` appends, `read_history` / `parse_history` read back, exactly).

A history is Jepsen-style: a list of operations in the order they were recorded. A client
`process` ("p3") does one operation at a time: it records an `invoke`, then ONE completion of
the same `f`: `ok`, `fail` (it certainly did not happen) or `info` (unknown outcome, e.g.
UNAVAILABLE or a deadline after the request was sent). The completion of an invoke is the next
op of the same process (an invoke still open when the history ends reads as `info`). The
processes "nemesis" and "cluster" record single `info` events, never paired.

`t` is seconds since the run started on a monotonic clock (the writer's `Clock`); `node` is the
node the client called ('' when none). Recording order is real-time order: an op recorded
before another happened before it, and `t` never decreases along a history.

Values (JSON objects; a completion may repeat its invoke's fields, and readers look in the
completion first, then in the invoke):

  f              invoke                           ok
  publish,       stream, msg_ids [str]            stream, msg_ids, seqs [int|null] (aligned
  publish_batch                                   with msg_ids; null = that message was not
                                                  acknowledged), epoch? int, primary? str (the
                                                  node that acknowledged, when it is not `node`)
  probe          stream, msg_id                   stream, msg_id, seq, epoch?, primary?
  fetch          stream, consumer                 stream, consumer, deliveries [[seq, msg_id,
                                                  digest]]
  ack            stream, consumer, seqs [int]     stream, consumer, seqs (the ones the server
                                                  accepted), refused? [int]
  read           stream                           stream, last_seq int, messages? [[seq,
                                                  msg_id, digest]], served_by? str
  (fail / info completions carry `error`: the reason's stable name.)

A read's start is its invoke's `t` and the node it read from is `served_by`, else its `node`.

  nemesis  f = fault name ("kill", "partition", ...), value {"phase": "start"|"stop",
           "targets": [node]}
  cluster  f = "primary"    {"stream", "node", "epoch"}: `node` is the stream's primary in `epoch`
           f = "connected"  {"majority": bool}: from now on a majority is (not) connected
           f = "ack_floor"  {"stream", "consumer", "ack_floor", "node"}: a consumer's ack floor
                            as `node` reported it (a client may record the same as a call:
                            invoke {"stream", "consumer"}, ok with "ack_floor" and "node")

Other keys may be added (the checkers ignore them). Digests are `payload_digest(payload)`.
Values must be JSON-native (lists, not tuples; string keys; finite floats), so that writing and
reading back gives equal ops: `Op` refuses anything else with `HistoryFormatError`.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, NamedTuple, TypeAlias

from raftlog.base.clock import Clock

JSON: TypeAlias = "bool | int | float | str | list[JSON] | dict[str, JSON] | None"
Value: TypeAlias = "dict[str, JSON]"

NEMESIS = "nemesis"  # the process of fault events
CLUSTER = "cluster"  # the process of cluster observations
EVENT_PROCESSES = frozenset({NEMESIS, CLUSTER})

# Client operations (`f`).
PUBLISH = "publish"
PUBLISH_BATCH = "publish_batch"
PROBE = "probe"
FETCH = "fetch"
ACK = "ack"
READ = "read"
WRITE_FS = frozenset({PUBLISH, PUBLISH_BATCH, PROBE})
CLIENT_FS = frozenset({PUBLISH, PUBLISH_BATCH, PROBE, FETCH, ACK, READ})

# Cluster observations (`f` of process "cluster").
PRIMARY = "primary"
CONNECTED = "connected"
ACK_FLOOR = "ack_floor"

# Nemesis phases.
START = "start"
STOP = "stop"

digest_bytes = 8  # blake2b digest length of a payload digest (16 hex characters)
FIELDS = ("index", "t", "process", "type", "f", "node", "value")  # one line's keys, in order


class HistoryFormatError(ValueError):
    """A history (or an op about to join one) breaks the format this module defines."""


class OpType(enum.StrEnum):
    INVOKE = "invoke"
    OK = "ok"
    FAIL = "fail"
    INFO = "info"  # unknown outcome; the only type of nemesis and cluster events


@dataclass(frozen=True)
class Op:
    """One line of a history. `index` is its position, set by the writer. Do not mutate
    `value` (the dataclass is frozen, its dict cannot be)."""

    index: int
    t: float
    process: str
    type: OpType
    f: str
    node: str = ""
    value: Value = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", _op_type(self.type))
        if isinstance(self.t, bool) or not isinstance(self.t, int | float):
            raise HistoryFormatError(f"op {self.index}: t must be a number, not {self.t!r}")
        object.__setattr__(self, "t", float(self.t))
        _check_op(self)

    def __hash__(self) -> int:  # `value` is a dict: hash the rest (equal ops hash equal)
        return hash((self.index, self.t, self.process, self.type, self.f, self.node))

    @property
    def is_event(self) -> bool:
        """A nemesis or cluster event (not part of an invoke / completion pair)."""
        return self.process in EVENT_PROCESSES

    def to_json(self) -> str:
        """The op as one JSON line (without the newline)."""
        record = {"index": self.index, "t": self.t, "process": self.process,
                  "type": str(self.type), "f": self.f, "node": self.node, "value": self.value}
        return json.dumps(record, separators=(",", ":"), allow_nan=False)

    def __str__(self) -> str:
        where = f" @{self.node}" if self.node else ""
        return f"#{self.index} t={self.t:.3f} {self.process} {self.type} {self.f}{where}"


def _op_type(raw: object) -> OpType:
    if isinstance(raw, str):
        try:
            return OpType(raw)
        except ValueError:
            pass
    raise HistoryFormatError(f"unknown op type {raw!r}")


def _check_op(op: Op) -> None:
    where = f"op {op.index}"
    if isinstance(op.index, bool) or not isinstance(op.index, int) or op.index < 0:
        raise HistoryFormatError(f"{where}: index must be an int >= 0")
    if not math.isfinite(op.t):
        raise HistoryFormatError(f"{where}: t must be finite")
    for name in ("process", "f", "node"):
        if not isinstance(getattr(op, name), str):
            raise HistoryFormatError(f"{where}: {name} must be a string")
    if not op.process or not op.f:
        raise HistoryFormatError(f"{where}: process and f must not be empty")
    if op.is_event and op.type is not OpType.INFO:
        raise HistoryFormatError(f"{where}: {op.process} events are of type info")
    if not isinstance(op.value, dict):
        raise HistoryFormatError(f"{where}: value must be a dict")
    _check_json(op.value, where=f"{where} value")


def _check_json(item: object, *, where: str) -> None:
    """JSON-native only, so that a round trip through a line gives back an equal value."""
    if item is None or isinstance(item, bool | int | str):
        return
    if isinstance(item, float):
        if not math.isfinite(item):
            raise HistoryFormatError(f"{where}: {item} is not valid JSON")
        return
    if isinstance(item, list):
        for element in item:
            _check_json(element, where=where)
        return
    if isinstance(item, dict):
        for key, element in item.items():
            if not isinstance(key, str):
                raise HistoryFormatError(f"{where}: key {key!r} is not a string")
            _check_json(element, where=f"{where}.{key}")
        return
    raise HistoryFormatError(f"{where}: {type(item).__name__} is not JSON-native (use a list)")


def payload_digest(payload: bytes) -> str:
    """The digest a history records for a payload."""
    return hashlib.blake2b(payload, digest_size=digest_bytes).hexdigest()


# -- values: builders (writers) and typed getters (checkers) -----------------------------------


class Seen(NamedTuple):
    """One message as a fetch or a read returned it."""

    seq: int
    msg_id: str
    digest: str


def seen_json(seen: Iterable[Seen]) -> list[JSON]:
    """`deliveries` / `messages` as a value holds them."""
    return [[item.seq, item.msg_id, item.digest] for item in seen]


def publish_value(*, stream: str, msg_ids: Sequence[str], seqs: Sequence[int | None] = (),
                  epoch: int | None = None, primary: str = "", error: str = "") -> Value:
    """A publish or publish_batch value; `seqs` only on ok (aligned with `msg_ids`)."""
    value: Value = {"stream": stream, "msg_ids": list(msg_ids)}
    if seqs:
        value["seqs"] = list(seqs)
    if epoch is not None:
        value["epoch"] = epoch
    if primary:
        value["primary"] = primary
    if error:
        value["error"] = error
    return value


def probe_value(*, stream: str, msg_id: str, seq: int | None = None, epoch: int | None = None,
                primary: str = "", error: str = "") -> Value:
    value: Value = {"stream": stream, "msg_id": msg_id}
    if seq is not None:
        value["seq"] = seq
    if epoch is not None:
        value["epoch"] = epoch
    if primary:
        value["primary"] = primary
    if error:
        value["error"] = error
    return value


def fetch_value(*, stream: str, consumer: str, deliveries: Iterable[Seen] | None = None,
                error: str = "") -> Value:
    value: Value = {"stream": stream, "consumer": consumer}
    if deliveries is not None:
        value["deliveries"] = seen_json(deliveries)
    if error:
        value["error"] = error
    return value


def ack_value(*, stream: str, consumer: str, seqs: Sequence[int], error: str = "") -> Value:
    value: Value = {"stream": stream, "consumer": consumer, "seqs": list(seqs)}
    if error:
        value["error"] = error
    return value


def read_value(*, stream: str, last_seq: int | None = None,
               messages: Iterable[Seen] | None = None, served_by: str = "",
               error: str = "") -> Value:
    value: Value = {"stream": stream}
    if last_seq is not None:
        value["last_seq"] = last_seq
    if messages is not None:
        value["messages"] = seen_json(messages)
    if served_by:
        value["served_by"] = served_by
    if error:
        value["error"] = error
    return value


def get_str(value: Mapping[str, JSON], key: str, default: str = "") -> str:
    item = value.get(key, default)
    if not isinstance(item, str):
        raise HistoryFormatError(f"{key} must be a string, not {item!r}")
    return item


def get_int(value: Mapping[str, JSON], key: str) -> int | None:
    item = value.get(key)
    if item is not None and (isinstance(item, bool) or not isinstance(item, int)):
        raise HistoryFormatError(f"{key} must be an int, not {item!r}")
    return item


def get_bool(value: Mapping[str, JSON], key: str, default: bool) -> bool:
    item = value.get(key, default)
    if not isinstance(item, bool):
        raise HistoryFormatError(f"{key} must be a bool, not {item!r}")
    return item


def get_list(value: Mapping[str, JSON], key: str) -> list[JSON]:
    item = value.get(key, [])
    if not isinstance(item, list):
        raise HistoryFormatError(f"{key} must be a list, not {item!r}")
    return item


def get_strs(value: Mapping[str, JSON], key: str) -> list[str]:
    items = get_list(value, key)
    if not all(isinstance(item, str) for item in items):
        raise HistoryFormatError(f"{key} must be a list of strings")
    return [str(item) for item in items]


def get_ints(value: Mapping[str, JSON], key: str) -> list[int | None]:
    """A list of ints in which null stands for 'none' (e.g. a message not acknowledged)."""
    items = get_list(value, key)
    for item in items:
        if item is not None and (isinstance(item, bool) or not isinstance(item, int)):
            raise HistoryFormatError(f"{key} must be a list of ints, not {items!r}")
    return [item if isinstance(item, int) else None for item in items]


def get_seen(value: Mapping[str, JSON], key: str) -> list[Seen]:
    """`deliveries` or `messages`: [[seq, msg_id, digest], ...]."""
    seen = []
    for item in get_list(value, key):
        if not (isinstance(item, list) and len(item) == len(Seen._fields)):
            raise HistoryFormatError(f"{key}: {item!r} is not [seq, msg_id, digest]")
        seq, msg_id, digest = item
        if (isinstance(seq, bool) or not isinstance(seq, int) or not isinstance(msg_id, str)
                or not isinstance(digest, str)):
            raise HistoryFormatError(f"{key}: {item!r} is not [seq, msg_id, digest]")
        seen.append(Seen(seq, msg_id, digest))
    return seen


# -- JSON lines --------------------------------------------------------------------------------


def parse_op(line: str) -> Op:
    """One JSON line back into the op that wrote it."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise HistoryFormatError(f"not a JSON line: {exc}") from None
    if not isinstance(record, dict) or tuple(sorted(record)) != tuple(sorted(FIELDS)):
        raise HistoryFormatError(f"a line holds exactly the keys {', '.join(FIELDS)}")
    return Op(index=record["index"], t=record["t"], process=record["process"],
              type=_op_type(record["type"]), f=record["f"], node=record["node"],
              value=record["value"])


def parse_history(lines: Iterable[str]) -> list[Op]:
    """Ops from JSON lines (blank lines skipped); each op's index must be its position and t
    must never decrease."""
    ops: list[Op] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            op = parse_op(line)
        except HistoryFormatError as exc:
            raise HistoryFormatError(f"line {number}: {exc}") from None
        _check_next(ops, op, where=f"line {number}")
        ops.append(op)
    return ops


def read_history(path: Path | str) -> list[Op]:
    """The history a `HistoryWriter` wrote to `path`."""
    with open(path, encoding="utf-8") as file:
        return parse_history(file)


def _check_next(ops: Sequence[Op], op: Op, *, where: str) -> None:
    if op.index != len(ops):
        raise HistoryFormatError(f"{where}: index {op.index}, expected {len(ops)}")
    if ops and op.t < ops[-1].t:
        raise HistoryFormatError(f"{where}: t {op.t} before the previous op's {ops[-1].t}")


class HistoryWriter:
    """Appends ops to a history: one JSON line per op, flushed before `record` returns (so a
    crash loses at most the line being written), and/or to an in-memory list (`ops`).

    `record` stamps `t` from the clock (seconds since the writer was made, or since
    `started_at_s`) and the index, under a lock: ops from several tasks or threads get
    increasing indexes and non-decreasing times. `append` takes a ready op (tests, converters)
    and re-indexes it."""

    def __init__(self, sink: IO[str] | None = None, *, clock: Clock,
                 started_at_s: float | None = None, keep: bool = True) -> None:
        self._sink = sink
        self._clock = clock
        self._started_at_s = clock.monotonic_s() if started_at_s is None else started_at_s
        self._keep = keep
        self._ops: list[Op] = []
        self._count = 0
        self._last: Op | None = None
        self._lock = threading.Lock()
        self._owns_sink = False

    @classmethod
    def open(cls, path: Path | str, *, clock: Clock, keep: bool = False) -> HistoryWriter:
        """A writer to a new file at `path` (closed by `close`)."""
        writer = cls(open(path, "x", encoding="utf-8"), clock=clock, keep=keep)  # noqa: SIM115
        writer._owns_sink = True
        return writer

    @property
    def ops(self) -> list[Op]:
        """What was recorded, when the writer keeps it (`keep`)."""
        return list(self._ops)

    def record(self, *, process: str, type: OpType, f: str, node: str = "",
               value: Value | None = None) -> Op:
        with self._lock:
            t = self._clock.monotonic_s() - self._started_at_s
            if self._last is not None:
                t = max(t, self._last.t)
            op = Op(self._count, t, process, type, f, node, {} if value is None else value)
            return self._write(op)

    def append(self, op: Op) -> Op:
        with self._lock:
            return self._write(dataclasses.replace(op, index=self._count))

    def nemesis(self, *, fault: str, phase: str, targets: Sequence[str]) -> Op:
        return self.record(process=NEMESIS, type=OpType.INFO, f=fault,
                           value={"phase": phase, "targets": list(targets)})

    def cluster(self, *, f: str, value: Value, node: str = "") -> Op:
        return self.record(process=CLUSTER, type=OpType.INFO, f=f, node=node, value=value)

    def _write(self, op: Op) -> Op:
        if self._last is not None and op.t < self._last.t:
            raise HistoryFormatError(f"{op}: t goes back from {self._last.t}")
        if self._sink is not None:
            self._sink.write(op.to_json() + "\n")
            self._sink.flush()
        if self._keep:
            self._ops.append(op)
        self._count += 1
        self._last = op
        return op

    def close(self) -> None:
        if self._owns_sink and self._sink is not None:
            self._sink.close()
        self._sink = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
