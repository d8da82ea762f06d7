"""ReadMessages on the stream's primary: committed messages from a seq (or a time) on, filtered,
bounded by count, bytes and the number looked at, waiting a while when there is nothing yet.

The answer's `next_seq` is where the next read starts: every seq below it was looked at, so a
reader that follows it never misses a message and never sees one twice, whatever the filter
let through. `first_seq` and `last_seq` let the reader tell removed messages from ones not
yet written (stream sources use both, source_tail.py).
"""

from __future__ import annotations

from raftlog.base import limits, subjects
from raftlog.node.engine.log import LogEntry
from raftlog.node.engine.stream import Stream
from raftlog.v1 import streams_pb2, types_pb2


def to_message(stream: str, entry: LogEntry) -> types_pb2.Message:
    return types_pb2.Message(
        seq=entry.seq, subject=entry.subject, ts_ms=entry.ts_ms, payload=entry.payload,
        headers=[types_pb2.Header(key=key, value=value) for key, value in entry.headers],
        msg_id=entry.msg_id, stream=stream)


def _start(stream: Stream, request: streams_pb2.ReadMessagesRequest) -> int:
    if request.start_time_ms > 0:
        return max(stream.first_seq_at_or_after_time(request.start_time_ms), stream.first_seq)
    return max(request.from_seq, stream.first_seq, 1)


async def read_messages(stream: Stream, request: streams_pb2.ReadMessagesRequest, *,
                        limit: int) -> streams_pb2.ReadMessagesResponse:
    """At most `limit` messages (and limits.source_read_bytes_max bytes, but at least one)
    matching the request's filter, looking at no more than limits.source_read_examined_max."""
    stream.check_readable()
    start = _start(stream, request)
    if start > stream.commit_seq and request.max_wait_ms:
        await stream.wait_for_commit(above_seq=start - 1, timeout_s=request.max_wait_ms / 1000)
        stream.check_readable()
        start = _start(stream, request)
    # No await from here on: the scan sees one state of the stream.
    first_seq, commit_seq = stream.first_seq, stream.commit_seq
    found: list[types_pb2.Message] = []
    size = 0
    next_seq = commit_seq + 1
    looked_at = 0
    for entry in stream.scan(from_seq=start, limit=limits.source_read_examined_max):
        looked_at += 1
        if request.filter_subject and not subjects.matches(request.filter_subject,
                                                           entry.subject):
            next_seq = entry.seq + 1
            continue
        if found and (len(found) >= limit
                      or size + entry.size_bytes > limits.source_read_bytes_max):
            next_seq = entry.seq
            break
        found.append(to_message(stream.name, entry))
        size += entry.size_bytes
        next_seq = entry.seq + 1
    else:
        if looked_at < limits.source_read_examined_max:
            next_seq = commit_seq + 1  # the scan reached the committed end
    return streams_pb2.ReadMessagesResponse(messages=found, next_seq=max(next_seq, start),
                                            first_seq=first_seq, last_seq=commit_seq)
