"""Reading a PublishBatchResponse, in either of its forms (see streams.proto)."""

from __future__ import annotations

from raftlog.v1 import streams_pb2


def expand_results(response: streams_pb2.PublishBatchResponse) -> list[streams_pb2.PublishResult]:
    """One PublishResult per message, in order, also for the compact form."""
    if not response.first_seq:
        return list(response.results)
    return [
        streams_pb2.PublishResult(ack=streams_pb2.PublishAck(
            stream=response.stream, seq=response.first_seq + index, epoch=response.epoch,
            primary=response.primary))
        for index in range(response.acked)
    ]


def acked_seqs(response: streams_pb2.PublishBatchResponse) -> list[int]:
    """Seqs of the messages that were stored (new or duplicate), in order."""
    if response.first_seq:
        return list(range(response.first_seq, response.first_seq + response.acked))
    return [result.ack.seq for result in response.results if result.HasField("ack")]
