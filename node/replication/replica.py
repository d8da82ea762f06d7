"""The replica's side of one stream: checking a primary's batch and applying it to the local
copy (append, remove, truncate an uncommitted tail, move the head, re-seed), and fencing.

`check_batch` is pure: it refuses a request whose numbers are out of bounds or inconsistent
(epochs and seqs within `seq_max`, ranges non-empty, ordered and disjoint, history ascending and
ending at the batch's epoch, every message decodable and of an epoch no later than the batch's)
before anything is touched. `accept_replicated` then decides refusals that depend on
the copy (STALE_EPOCH, SEQ_GAP) also before changing anything, and only then writes: a refused
request leaves memory and disk exactly as they were.

Deletions are range operations: RocksDB `delete_range`, or a scan of the keys that exist in the
range (so the work is bounded by what is stored, never by the width of a range), and a head
that moves far is moved at most `head_removals_max` messages per request (the primary repeats
its head in every request, so the rest follows).

The functions here work on a `Stream` (node/engine/stream.py) and use its storage helpers; `Stream`
exposes them as methods.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import replication_pb2, storage_pb2
from raftlog.node.engine import keys
from raftlog.node.engine.storage import CF_DEDUPE, CF_MESSAGES, CF_SUBJECTS

if TYPE_CHECKING:
    from rocksdict import WriteBatch

    from raftlog.node.engine.stream import Stream

seq_max = 2**53  # a seq or epoch above this is refused (far beyond any real stream)
ROLE_PRIMARY = "primary"
ROLE_REPLICA = "replica"
removed_seqs_max = 10_000  # seqs the removed ranges of one request cover at most
removed_ranges_max = 10_000
history_entries_max = 64  # (epoch, start seq) pairs a request carries (raft/state.py keeps 64)
head_removals_max = 10_000  # messages one request removes below a moved head


def _invalid(message: str, **metadata: object) -> RaftlogError:
    return RaftlogError(Reason.INVALID_ARGUMENT, f"replication batch refused: {message}",
                        **metadata)


def check_batch(request: replication_pb2.ReplicateRequest) -> list[bytes]:
    """The batch's message values, once every number in the request is in bounds and
    consistent; raises RaftlogError (INVALID_ARGUMENT, or CORRUPT_RECORD for a checksum or a
    value that does not decode) otherwise. Depends on nothing but the request."""
    if not 1 <= request.epoch <= seq_max:
        raise _invalid(f"epoch {request.epoch} is outside 1..{seq_max}")
    values = list(request.messages)
    if len(values) > limits.batch_messages_max:
        raise _invalid(f"{len(values)} messages; at most {limits.batch_messages_max}")
    if not 1 <= request.first_seq <= seq_max - len(values):
        raise _invalid(f"first_seq {request.first_seq} is outside 1..{seq_max}")
    batch_end = request.first_seq + len(values)  # one past the batch's last seq
    if request.head_seq > batch_end or (request.reseed and request.head_seq > request.first_seq):
        raise _invalid(f"head_seq {request.head_seq} is past the batch (first_seq "
                       f"{request.first_seq}, {len(values)} messages)")
    if request.commit_seq > seq_max:
        raise _invalid(f"commit_seq {request.commit_seq} is above {seq_max}")
    _check_history(request)
    _check_removed(request)
    if values and zlib_crc(values) != request.checksum:
        raise RaftlogError(Reason.CORRUPT_RECORD, "the batch does not match its checksum",
                           first_seq=request.first_seq)
    for offset, value in enumerate(values):
        if not value:
            continue  # removed on the primary before it was sent
        try:
            stored = storage_pb2.StoredMessage.FromString(value)
        except Exception:
            raise RaftlogError(Reason.CORRUPT_RECORD, "a message of the batch does not decode",
                               seq=request.first_seq + offset) from None
        if stored.epoch > request.epoch:
            raise _invalid(f"seq {request.first_seq + offset} carries epoch {stored.epoch}, "
                           f"above the batch's {request.epoch}")
    return values


def zlib_crc(values: Sequence[bytes]) -> int:
    return zlib.crc32(b"".join(values))


def _check_history(request: replication_pb2.ReplicateRequest) -> None:
    history = request.history
    if len(history) > history_entries_max:
        raise _invalid(f"{len(history)} history entries; at most {history_entries_max}")
    previous_epoch, previous_start = 0, 1
    for entry in history:
        if entry.fence_epoch <= previous_epoch or entry.start_seq < previous_start \
                or entry.start_seq > seq_max:
            raise _invalid("the epoch history is not ascending")
        previous_epoch, previous_start = entry.fence_epoch, entry.start_seq
    if history and history[-1].fence_epoch != request.epoch:
        raise _invalid(f"the epoch history ends at {history[-1].fence_epoch}, not at the "
                       f"batch's epoch {request.epoch}")


def _check_removed(request: replication_pb2.ReplicateRequest) -> None:
    if len(request.removed) > removed_ranges_max:
        raise _invalid(f"{len(request.removed)} removed ranges; at most {removed_ranges_max}")
    covered, previous_last = 0, 0
    for span in request.removed:
        if not previous_last < span.first <= span.last <= seq_max:
            raise _invalid(f"removed range {span.first}..{span.last} is empty, out of order, "
                           "overlapping or out of bounds")
        covered += span.last - span.first + 1
        previous_last = span.last
    if covered > removed_seqs_max:
        raise _invalid(f"removed ranges cover {covered} seqs; at most {removed_seqs_max}")


def accept_replicated(stream: Stream, request: replication_pb2.ReplicateRequest) -> int:
    """Applies a primary's batch (written, not yet durable); returns the last seq held.

    Refuses (RaftlogError, nothing changed) what `check_batch` refuses, an older epoch
    (STALE_EPOCH) and a batch that does not start at or below the next seq (SEQ_GAP,
    metadata last_seq: where the copy would stand after this epoch's truncation).
    A newer epoch first truncates what this node holds from the start of the first epoch
    (in the primary's history of (epoch, start_seq)) after the last epoch this node
    wrote in: those messages came from an older primary and were never committed (G7)."""
    values = check_batch(request)
    epoch, first_seq = request.epoch, request.first_seq
    record = stream.record
    floor = max(record.epoch, record.fenced_epoch)
    if epoch < floor:
        raise RaftlogError(Reason.STALE_EPOCH, f"{stream.name!r} is at fence epoch "
                           f"{floor}; refusing epoch {epoch}",
                           replica_epoch=floor, last_seq=record.last_seq)
    if stream.role == ROLE_PRIMARY and stream.deposed is None and stream.replicator is not None:
        raise RaftlogError(Reason.STALE_EPOCH, f"this node is the primary of {stream.name!r}",
                           replica_epoch=record.epoch, last_seq=record.last_seq)
    truncate_at = record.last_seq + 1
    if epoch > record.epoch:
        later = [e.start_seq for e in request.history if e.fence_epoch > record.epoch]
        truncate_at = min(min(later, default=truncate_at), truncate_at)
    if not request.reseed and values and first_seq > truncate_at:
        raise RaftlogError(Reason.SEQ_GAP, f"{stream.name!r} holds up to seq "
                           f"{truncate_at - 1}; batch starts at {first_seq}",
                           last_seq=truncate_at - 1, replica_epoch=max(record.epoch, epoch))
    # Every check passed: from here on the request changes the copy.
    history = [(e.fence_epoch, e.start_seq) for e in request.history]
    if epoch > record.epoch:
        _truncate_from(stream, truncate_at, history=history)
        record.epoch = epoch
    if request.reseed:
        _reset_to(stream, first_seq, history=history)
    batch = stream._storage.batch()
    touched: set[str] = set()
    for span in request.removed:
        _delete_existing(stream, batch, max(span.first, record.first_seq),
                         min(span.last, record.last_seq) + 1, touched)
    skip = max(record.last_seq + 1 - first_seq, 0)
    for seq, value in enumerate(values[skip:], start=first_seq + skip):
        if value:
            _append_stored(stream, batch, seq, value, touched)
        else:  # removed on the primary before it was sent
            record.last_seq = seq
            record.last_epoch = epoch_of(seq, history, default=record.last_epoch)
    batch = stream._write(batch, touched)
    if request.head_seq > record.first_seq:
        _remove_below(stream, min(request.head_seq, record.last_seq + 1))
    stream._advance_head()
    return record.last_seq


def _delete_existing(stream: Stream, batch: WriteBatch, lower: int, upper: int,
                     touched: set[str], *, limit: int | None = None) -> int:
    """Deletes the stored messages with seqs in [lower, upper) (at most `limit`); the work
    is bounded by what exists there, not by the width of the range."""
    if lower >= upper:
        return 0
    found = list(itertools.islice(stream._storage.scan_keys(
        CF_MESSAGES, lower=keys.message_key(stream.stream_id, lower),
        upper=keys.message_key(stream.stream_id, upper)), limit))
    for key in found:
        stream._delete_seq(batch, keys.message_seq(key), touched)
    return len(found)


def _append_stored(stream: Stream, batch: WriteBatch, seq: int, value: bytes,
                   touched: set[str]) -> None:
    from raftlog.node.engine.stream_core import SubjectStat, stored_size

    stored = storage_pb2.StoredMessage.FromString(value)
    batch.put(keys.message_key(stream.stream_id, seq), value, stream._storage.handle(CF_MESSAGES))
    batch.put(keys.index_key(stream.stream_id, stored.subject, seq), b"",
              stream._storage.handle(CF_SUBJECTS))
    stat = stream.subject_stats.get(stored.subject)
    if stat is None:
        stream.subject_stats[stored.subject] = SubjectStat(1, seq)
    else:
        stat.count += 1
        stat.last_seq = seq
    if stored.msg_id:
        stream._remember(batch, stored.msg_id, seq=seq, now_ms=stored.ts_ms)
    touched.add(stored.subject)
    stream.record.last_seq = seq
    stream.record.last_epoch = stored.epoch
    stream.record.messages += 1
    stream.record.bytes += stored_size(stored)
    if stream.record.messages == 1:
        stream.record.first_seq = seq


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


def _truncate_from(stream: Stream, seq: int, *, history: Sequence[tuple[int, int]]) -> None:
    """Removes every message at or above `seq` (an uncommitted tail of an older epoch); what
    stays is the prefix the new lineage (`history`) shares."""
    if seq > stream.record.last_seq:
        return
    stream.record.last_epoch = epoch_of(seq - 1, history, default=stream.record.last_epoch)
    batch = stream._storage.batch()
    touched: set[str] = set()
    _delete_existing(stream, batch, seq, stream.record.last_seq + 1, touched)
    for msg_id, (dedupe_seq, _) in list(stream.dedupe.items()):
        if dedupe_seq >= seq:
            del stream.dedupe[msg_id]
            batch.delete(keys.dedupe_key(stream.stream_id, msg_id),
                         stream._storage.handle(CF_DEDUPE))
    stream.record.last_seq = seq - 1
    stream._commit_seq = min(stream._commit_seq, seq - 1)
    stream.durable_seq = min(stream.durable_seq, seq - 1)
    stream._write(batch, touched)
    stream._advance_head()


def _remove_below(stream: Stream, seq: int) -> None:
    """Removes messages below `seq`, at most head_removals_max of them."""
    batch = stream._storage.batch()
    touched: set[str] = set()
    _delete_existing(stream, batch, stream.record.first_seq, seq, touched,
                     limit=head_removals_max)
    stream._write(batch, touched)


def _reset_to(stream: Stream, first_seq: int, *, history: Sequence[tuple[int, int]]) -> None:
    """Drops the whole local copy; the next message stored will be `first_seq`."""
    stream.record.last_epoch = epoch_of(first_seq - 1, history, default=0)
    batch = stream._storage.batch()
    for cf in (CF_MESSAGES, CF_SUBJECTS, CF_DEDUPE):
        batch.delete_range(keys.stream_prefix(stream.stream_id),
                           keys.stream_end(stream.stream_id), stream._storage.handle(cf))
    stream.subject_stats.clear()
    stream.dedupe.clear()
    stream.record.messages = 0
    stream.record.bytes = 0
    stream.record.first_seq = first_seq
    stream.record.last_seq = first_seq - 1
    stream._commit_seq = min(stream._commit_seq, first_seq - 1)
    stream.durable_seq = first_seq - 1
    stream._write(batch, set())


def fence_unsynced(stream: Stream, epoch: int) -> bool:
    """Refuses batches below `epoch` from now on; written, durable with the next group
    commit. True when the fence moved."""
    if epoch <= stream.record.fenced_epoch:
        return False
    stream.record.fenced_epoch = epoch
    stream._write(stream._storage.batch(), set())
    return True
