"""Checking a primary's replication batch (`ReplicateRequest`) before it touches anything, and
the bounds every batch keeps: the replica side's rules that depend on nothing but the request.

`check_batch` is pure: it refuses a request whose numbers are out of bounds or inconsistent
(epochs and seqs within `limits.replication_seq_max`, ranges non-empty, ordered and disjoint,
history ascending and ending at the batch's epoch, every message decodable and of an epoch no
later than the batch's). Applying a batch that passed is `Stream.accept_replicated`
(stream_replica.py). The bounds are the `replication_*` names in base/limits.py; the primary
(node/replication/primary.py) keeps them when it builds a batch.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import replication_pb2, storage_pb2


def _invalid(message: str, **metadata: object) -> RaftlogError:
    return RaftlogError(Reason.INVALID_ARGUMENT, f"replication batch refused: {message}",
                        **metadata)


# A message of a batch: its stored value and that value decoded; (b"", None) for a seq removed
# on the primary before it was sent.
Checked = tuple[bytes, storage_pb2.StoredMessage | None]


def check_batch(request: replication_pb2.ReplicateRequest) -> list[Checked]:
    """The batch's messages (each value with its decoding, so that it is decoded once), once
    every number in the request is in bounds and consistent; raises RaftlogError
    (INVALID_ARGUMENT, or CORRUPT_RECORD for a checksum or a value that does not decode)
    otherwise. Depends on nothing but the request."""
    if not 1 <= request.epoch <= limits.replication_seq_max:
        raise _invalid(f"epoch {request.epoch} is outside 1..{limits.replication_seq_max}")
    values = list(request.messages)
    if len(values) > limits.replication_batch_messages_max:
        raise _invalid(f"{len(values)} messages; at most {limits.replication_batch_messages_max}")
    if not 1 <= request.first_seq <= limits.replication_seq_max - len(values):
        raise _invalid(f"first_seq {request.first_seq} is outside "
                       f"1..{limits.replication_seq_max}")
    batch_end = request.first_seq + len(values)  # one past the batch's last seq
    if request.head_seq > batch_end or (request.reseed and request.head_seq > request.first_seq):
        raise _invalid(f"head_seq {request.head_seq} is past the batch (first_seq "
                       f"{request.first_seq}, {len(values)} messages)")
    if request.commit_seq > limits.replication_seq_max:
        raise _invalid(f"commit_seq {request.commit_seq} is above {limits.replication_seq_max}")
    _check_history(request)
    _check_removed(request)
    if values and zlib_crc(values) != request.checksum:
        raise RaftlogError(Reason.CORRUPT_RECORD, "the batch does not match its checksum",
                           first_seq=request.first_seq)
    checked: list[Checked] = []
    for offset, value in enumerate(values):
        if not value:
            checked.append((value, None))  # removed on the primary before it was sent
            continue
        try:
            stored = storage_pb2.StoredMessage.FromString(value)
        except Exception:
            raise RaftlogError(Reason.CORRUPT_RECORD, "a message of the batch does not decode",
                               seq=request.first_seq + offset) from None
        if stored.epoch > request.epoch:
            raise _invalid(f"seq {request.first_seq + offset} carries epoch {stored.epoch}, "
                           f"above the batch's {request.epoch}")
        checked.append((value, stored))
    return checked


def zlib_crc(values: Sequence[bytes]) -> int:
    return zlib.crc32(b"".join(values))


def _check_history(request: replication_pb2.ReplicateRequest) -> None:
    history = request.history
    if len(history) > limits.replication_history_entries_max:
        raise _invalid(f"{len(history)} history entries; at most "
                       f"{limits.replication_history_entries_max}")
    previous_epoch, previous_start = 0, 1
    for entry in history:
        if entry.fence_epoch <= previous_epoch or entry.start_seq < previous_start \
                or entry.start_seq > limits.replication_seq_max:
            raise _invalid("the epoch history is not ascending")
        previous_epoch, previous_start = entry.fence_epoch, entry.start_seq
    if history and history[-1].fence_epoch != request.epoch:
        raise _invalid(f"the epoch history ends at {history[-1].fence_epoch}, not at the "
                       f"batch's epoch {request.epoch}")


def _check_removed(request: replication_pb2.ReplicateRequest) -> None:
    if len(request.removed) > limits.replication_removed_ranges_max:
        raise _invalid(f"{len(request.removed)} removed ranges; at most "
                       f"{limits.replication_removed_ranges_max}")
    covered, previous_last = 0, 0
    for span in request.removed:
        if not previous_last < span.first <= span.last <= limits.replication_seq_max:
            raise _invalid(f"removed range {span.first}..{span.last} is empty, out of order, "
                           "overlapping or out of bounds")
        covered += span.last - span.first + 1
        previous_last = span.last
    if covered > limits.replication_removed_seqs_max:
        raise _invalid(f"removed ranges cover {covered} seqs; at most "
                       f"{limits.replication_removed_seqs_max}")


def epoch_of(seq: int, history: Sequence[tuple[int, int]], *, default: int) -> int:
    """The epoch seq was written in by the lineage whose (epoch, start seq) history is given:
    the last epoch that started at or before it (`default` when the history does not reach
    back that far)."""
    found = default
    for epoch, start in history:
        if start > seq:
            break
        found = epoch
    return found
