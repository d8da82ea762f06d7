"""The history as the checkers read it: client ops paired into `Call`s (an invoke and its
completion: the next op of the same process), and the acknowledged writes (`AckedWrite`: a
publish, publish_batch or probe message the server said it stored at a seq).

Positions are indexes into the history list, which is in recording (real-time) order: "A
before B" means A's position is lower. Ops are named in anomalies by their `index`.

`IndexedHistory` is a history that computes its calls and acknowledged writes once; `calls` and
`acked_writes` take any history and use those when given one (`check_all` passes one to every
checker)."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from raftlog.chaos.events import (
    PROBE,
    WRITE_FS,
    HistoryFormatError,
    Op,
    OpType,
    Value,
    get_int,
    get_ints,
    get_str,
    get_strs,
)


@dataclass(frozen=True)
class Call:
    """One client operation. `completion` is None when the history ended before it completed
    (its outcome then reads as info: unknown)."""

    invoke: Op
    completion: Op | None
    invoke_pos: int
    completion_pos: int | None

    @property
    def outcome(self) -> OpType:
        return OpType.INFO if self.completion is None else self.completion.type

    @property
    def ok(self) -> bool:
        return self.outcome is OpType.OK

    @property
    def f(self) -> str:
        return self.invoke.f

    @property
    def process(self) -> str:
        return self.invoke.process

    @functools.cached_property
    def ops(self) -> tuple[Op, ...]:
        return (self.invoke,) if self.completion is None else (self.invoke, self.completion)

    @property
    def start_t(self) -> float:
        return self.invoke.t

    @property
    def end_t(self) -> float:
        """When it completed; infinity when it never did."""
        return math.inf if self.completion is None else self.completion.t

    @property
    def end_pos(self) -> float:
        return math.inf if self.completion_pos is None else float(self.completion_pos)

    @functools.cached_property
    def value(self) -> Value:
        """The completion's value over the invoke's (a completion may leave fields out)."""
        if self.completion is None:
            return self.invoke.value
        return {**self.invoke.value, **self.completion.value}

    @functools.cached_property
    def stream(self) -> str:
        return get_str(self.value, "stream")

    def __str__(self) -> str:
        return f"{self.process} {self.f} #{self.invoke.index}->{self.outcome}"


def calls(history: Sequence[Op]) -> list[Call]:
    """Every client op paired with its completion, in invoke order. Raises HistoryFormatError
    when a process invokes while it has an op open, or completes what it did not invoke."""
    if isinstance(history, IndexedHistory):
        return list(history.calls)
    return _pair(history)


def _pair(history: Sequence[Op]) -> list[Call]:
    found: list[Call] = []
    open_calls: dict[str, tuple[int, Op]] = {}
    for pos, op in enumerate(history):
        if op.is_event:
            continue
        if op.type is OpType.INVOKE:
            if op.process in open_calls:
                raise HistoryFormatError(f"{op}: {op.process} still has "
                                         f"#{open_calls[op.process][1].index} open")
            open_calls[op.process] = (pos, op)
            continue
        opened = open_calls.pop(op.process, None)
        if opened is None or opened[1].f != op.f:
            raise HistoryFormatError(f"{op}: completes no open {op.f} of {op.process}")
        found.append(Call(opened[1], op, opened[0], pos))
    found += [Call(op, None, pos, None) for pos, op in open_calls.values()]
    return sorted(found, key=lambda call: call.invoke_pos)


def events(history: Sequence[Op], *, process: str,
           f: str | None = None) -> list[tuple[int, Op]]:
    """(position, op) of the nemesis or cluster events of `process` (and `f`, if given)."""
    return [(pos, op) for pos, op in enumerate(history)
            if op.process == process and (f is None or op.f == f)]


@dataclass(frozen=True)
class AckedWrite:
    """The server acknowledged `msg_id` stored at `seq` of `stream` (`call` completed ok).

    `node` is the node that acknowledged (the value's `primary`, else the node called);
    `first_invoke_*` locate the first call that carried this msg_id (a retry acknowledged
    with the original seq was stored by an earlier attempt)."""

    stream: str
    msg_id: str
    seq: int
    epoch: int | None
    node: str
    call: Call
    first_invoke_pos: int
    first_invoke_t: float

    @property
    def ops(self) -> tuple[Op, ...]:
        return self.call.ops


def write_ids(call: Call) -> list[str]:
    """The msg_ids a publish, publish_batch or probe call carried."""
    if call.f == PROBE:
        return [get_str(call.value, "msg_id")]
    return get_strs(call.value, "msg_ids")


def write_seqs(call: Call, msg_ids: Sequence[str]) -> list[int | None]:
    """The seqs an ok write call acknowledged, aligned with its `msg_ids` (None: not
    stored)."""
    if call.f == PROBE:
        return [get_int(call.value, "seq")]
    seqs = get_ints(call.value, "seqs")
    if len(seqs) != len(msg_ids):
        raise HistoryFormatError(f"{call}: {len(seqs)} seqs for {len(msg_ids)} msg_ids")
    return seqs


def acked_writes(history: Sequence[Op]) -> list[AckedWrite]:
    """Every acknowledged message, in the order the acknowledgements completed."""
    if isinstance(history, IndexedHistory):
        return list(history.acked_writes)
    return _acked(_pair(history))


def _acked(all_calls: Sequence[Call]) -> list[AckedWrite]:
    writes = [(call, write_ids(call)) for call in all_calls if call.f in WRITE_FS]
    first: dict[tuple[str, str], Call] = {}
    for call, msg_ids in writes:  # in invoke order
        for msg_id in msg_ids:
            first.setdefault((call.stream, msg_id), call)
    acked = []
    for call, msg_ids in writes:
        if not call.ok:
            continue
        epoch = get_int(call.value, "epoch")
        node = get_str(call.value, "primary") or call.invoke.node
        for msg_id, seq in zip(msg_ids, write_seqs(call, msg_ids), strict=True):
            if seq is not None:
                origin = first[(call.stream, msg_id)]
                acked.append(AckedWrite(call.stream, msg_id, seq, epoch, node, call,
                                        origin.invoke_pos, origin.start_t))
    return sorted(acked, key=lambda write: write.call.end_pos)


class IndexedHistory(Sequence[Op]):
    """A history (read-only) with its calls and acknowledged writes computed once."""

    def __init__(self, ops: Sequence[Op]) -> None:
        self._ops = list(ops)

    @functools.cached_property
    def calls(self) -> tuple[Call, ...]:
        return tuple(_pair(self._ops))

    @functools.cached_property
    def acked_writes(self) -> tuple[AckedWrite, ...]:
        return tuple(_acked(self.calls))

    @overload
    def __getitem__(self, index: int) -> Op: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Op]: ...

    def __getitem__(self, index: int | slice) -> Op | Sequence[Op]:
        return self._ops[index]

    def __len__(self) -> int:
        return len(self._ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self._ops)


def indexed(history: Sequence[Op]) -> IndexedHistory:
    return history if isinstance(history, IndexedHistory) else IndexedHistory(history)
