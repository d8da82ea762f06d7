"""Pure conversions between the Waymaker messages (waymaker.streams) and raftlog's canonical
ones (raftlog.v1). Requests are checked on the way in: a setting raftlog has no equivalent for
is refused with INVALID_CONFIG and says why, never dropped. docs/waymaker.md lists each mapping.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.compat import waymaker_streams_pb2 as wm
from raftlog.node.api import waymaker_ids, waymaker_sources
from raftlog.v1 import cluster_pb2, consumers_pb2, streams_pb2, types_pb2

# A client's own `PublishRequest.ts_ms` travels in this header: raftlog stamps every message
# with its primary's clock (age retention and start-time delivery rely on that order), and the
# Waymaker API shows the client's value as `MessagePb.ts_ms` (without the header).
TS_HEADER = "waymaker-ts-ms"
# raftlog prunes every limit exactly, message by message: a stream reports strict limits, and
# one message per "block".
BLOCK_SIZE_REPORTED = 1
# raftlog's max_deliver 0 means unlimited; the seed's 0 means 5, so unlimited shows as this.
MAX_DELIVER_UNLIMITED = 0xFFFF_FFFF
# raftlog delivery policies the seed has no name for show as this plus raftlog's enum value.
UNNAMED_POLICY_BASE = 100
# TransferStream framing: each message is a 4-byte big-endian length and a raftlog.v1.Message.
FRAME_LENGTH = struct.Struct(">I")

_POLICY_IN = {
    wm.DELIVERY_ALL: consumers_pb2.DELIVER_POLICY_ALL,
    wm.DELIVERY_LAST: consumers_pb2.DELIVER_POLICY_LAST,
    wm.DELIVERY_BY_START_SEQ: consumers_pb2.DELIVER_POLICY_BY_START_SEQ,
    wm.DELIVERY_BY_START_TIME: consumers_pb2.DELIVER_POLICY_BY_START_TIME,
}
_POLICY_OUT = {raftlog: seed for seed, raftlog in _POLICY_IN.items()}

_WATCH_TYPES = {
    cluster_pb2.WATCH_EVENT_TYPE_STREAM_CREATED: wm.WATCH_STREAM_CREATED,
    cluster_pb2.WATCH_EVENT_TYPE_STREAM_UPDATED: wm.WATCH_STREAM_UPDATED,
    cluster_pb2.WATCH_EVENT_TYPE_STREAM_DELETED: wm.WATCH_STREAM_DELETED,
    cluster_pb2.WATCH_EVENT_TYPE_CONSUMER_CREATED: wm.WATCH_CONSUMER_CREATED,
    cluster_pb2.WATCH_EVENT_TYPE_CONSUMER_DELETED: wm.WATCH_CONSUMER_DELETED,
    cluster_pb2.WATCH_EVENT_TYPE_AUTHORITY_CHANGED: wm.WATCH_STREAM_AUTHORITY_CHANGED,
}


def _refuse(message: str, *, field: str) -> RaftlogError:
    return RaftlogError(Reason.INVALID_CONFIG, message, field=field)


# ---------------------------------------------------------------------- streams

def stream_config_in(config: wm.StreamConfigPb) -> types_pb2.StreamConfig:
    """The raftlog config a Waymaker CreateStream asks for."""
    if config.ephemeral:
        raise _refuse("ephemeral (memory-only) streams are not supported: raftlog keeps every "
                      "stream on disk on each replica; create it with ephemeral=false",
                      field="ephemeral")
    out = types_pb2.StreamConfig(name=config.name, subjects=config.subjects_filter,
                                 max_msg_bytes=config.max_msg_bytes,
                                 max_msgs_per_subject=config.max_msgs_per_subject,
                                 sources=[waymaker_sources.source_in(s) for s in config.sources])
    policy = config.retention.WhichOneof("policy")
    if policy == "work_queue":
        out.retention = types_pb2.RETENTION_POLICY_WORK_QUEUE
    elif policy == "interest":
        out.retention = types_pb2.RETENTION_POLICY_INTEREST
    else:  # limits, or none given: limits with the bounds that are present
        bounds = config.retention.limits
        out.retention = types_pb2.RETENTION_POLICY_LIMITS
        out.max_age_ms, out.max_msgs, out.max_bytes = (bounds.max_age_ms, bounds.max_msgs,
                                                       bounds.max_bytes)
    return out


def stream_config_out(config: types_pb2.StreamConfig) -> wm.StreamConfigPb:
    """A raftlog stream's config as the Waymaker API shows it."""
    out = wm.StreamConfigPb(name=config.name, subjects_filter=config.subjects,
                            block_size=BLOCK_SIZE_REPORTED, max_msg_bytes=config.max_msg_bytes,
                            max_msgs_per_subject=config.max_msgs_per_subject,
                            sources=[waymaker_sources.source_out(s) for s in config.sources])
    if config.retention == types_pb2.RETENTION_POLICY_WORK_QUEUE:
        out.retention.work_queue.SetInParent()
    elif config.retention == types_pb2.RETENTION_POLICY_INTEREST:
        out.retention.interest.SetInParent()
    else:
        bounds = out.retention.limits
        bounds.strict_limits = True
        for name in ("max_age_ms", "max_msgs", "max_bytes"):
            if getattr(config, name):
                setattr(bounds, name, getattr(config, name))
    return out


def stats_out(state: types_pb2.StreamState) -> wm.StreamStatsPb:
    """Counts; a "block" is one message (raftlog has no blocks), numbered by its seq."""
    return wm.StreamStatsPb(last_seq=state.last_seq, msg_count=state.messages,
                            bytes=state.bytes, block_count=state.messages,
                            first_block=state.first_seq if state.messages else 0)


def update_in(request: wm.UpdateStreamRequest) -> streams_pb2.UpdateStreamRequest:
    """Only the fields present; 0 clears a limit in both APIs."""
    if request.HasField("strict_limits") and not request.strict_limits:
        raise RaftlogError(Reason.IMMUTABLE_FIELD, "raftlog always prunes exactly, message by "
                           "message; strict_limits cannot be turned off", field="strict_limits")
    out = streams_pb2.UpdateStreamRequest(name=request.name)
    for name in ("max_age_ms", "max_msgs", "max_bytes", "max_msg_bytes"):
        if request.HasField(name):
            setattr(out, name, getattr(request, name))
    return out


# ---------------------------------------------------------------------- messages

def publish_in(request: wm.PublishRequest) -> streams_pb2.PublishRequest:
    """`expected_last_seq` is the seed's per-subject check: raftlog's expected_last_subject_seq."""
    out = streams_pb2.PublishRequest(
        stream=request.stream, subject=request.subject, payload=request.payload,
        headers=[types_pb2.Header(key=h.key, value=h.value) for h in request.headers])
    if request.ts_ms:
        out.headers.add(key=TS_HEADER, value=str(request.ts_ms))
    if request.HasField("expected_last_seq"):
        out.expected_last_subject_seq = request.expected_last_seq
    return out


def message_out(message: types_pb2.Message) -> wm.MessagePb:
    out = wm.MessagePb(seq=message.seq, subject=message.subject, ts_ms=message.ts_ms,
                       payload=message.payload, deliver_count=message.deliver_count)
    for header in message.headers:
        if header.key == TS_HEADER and header.value.lstrip("-").isdigit():
            out.ts_ms = int(header.value)
        else:
            out.headers.add(key=header.key, value=header.value)
    return out


# ---------------------------------------------------------------------- consumers

def consumer_config_in(config: wm.ConsumerConfigPb) -> consumers_pb2.ConsumerConfig:
    if config.deliver_group:
        raise _refuse("deliver_group is not supported: a raftlog consumer already shares its "
                      "messages among every caller of Fetch and Subscribe; leave it empty",
                      field="deliver_group")
    policy = _POLICY_IN.get(config.delivery_policy.type)
    if policy is None:
        raise _refuse(f"unknown delivery policy type {config.delivery_policy.type}",
                      field="delivery_policy")
    return consumers_pb2.ConsumerConfig(
        name=config.name, filter_subject=config.filter_subject, deliver_policy=policy,
        opt_start_seq=config.delivery_policy.start_seq
        if policy == consumers_pb2.DELIVER_POLICY_BY_START_SEQ else 0,
        opt_start_time_ms=config.delivery_policy.start_time_ms
        if policy == consumers_pb2.DELIVER_POLICY_BY_START_TIME else 0,
        ack_wait_ms=config.ack_wait_ms,
        max_deliver=config.max_deliver or limits.waymaker_max_deliver_default,
        dead_letter_subject=config.dead_letter_subject)


def consumer_config_out(config: consumers_pb2.ConsumerConfig) -> wm.ConsumerConfigPb:
    policy = _POLICY_OUT.get(config.deliver_policy,
                             UNNAMED_POLICY_BASE + config.deliver_policy)
    out = wm.ConsumerConfigPb(
        name=config.name, filter_subject=config.filter_subject,
        ack_wait_ms=config.ack_wait_ms or limits.ack_wait_ms_default,
        max_deliver=config.max_deliver or MAX_DELIVER_UNLIMITED,
        dead_letter_subject=config.dead_letter_subject)
    out.delivery_policy.type = policy  # type: ignore[assignment]
    out.delivery_policy.start_seq = config.opt_start_seq
    out.delivery_policy.start_time_ms = config.opt_start_time_ms
    return out


def consumer_state_out(info: consumers_pb2.ConsumerInfo) -> wm.ConsumerStatePb:
    return wm.ConsumerStatePb(config=consumer_config_out(info.config),
                              ack_floor=info.state.ack_floor,
                              last_delivered=info.state.delivered_seq,
                              created_at_ms=info.created_ms,
                              redelivered_dropped=info.state.num_dead_lettered)


# ---------------------------------------------------------------------- cluster

def watch_event_out(event: cluster_pb2.WatchEvent, *, node_id: str) -> wm.WatchEvent | None:
    """None for raftlog events the seed has no type for (membership changes)."""
    kind = _WATCH_TYPES.get(event.type)
    if kind is None:
        return None
    out = wm.WatchEvent(type=kind, ts_ms=event.ts_ms, node_id=waymaker_ids.to_wire(node_id))
    if kind == wm.WATCH_STREAM_AUTHORITY_CHANGED:
        cleared = not event.claimant
        out.authority.CopyFrom(wm.AuthorityWatchDetail(
            stream=event.stream, claimant_node_id=waymaker_ids.to_wire(event.claimant),
            fence_epoch=0 if cleared else event.fence_epoch))
    elif kind in (wm.WATCH_CONSUMER_CREATED, wm.WATCH_CONSUMER_DELETED):
        out.consumer.CopyFrom(wm.ConsumerWatchDetail(stream=event.stream,
                                                     consumer=event.consumer))
    else:
        out.stream.CopyFrom(wm.StreamWatchDetail(name=event.stream))
    return out


# ---------------------------------------------------------------------- transfer

def frame(message: types_pb2.Message) -> bytes:
    body = message.SerializeToString()
    return FRAME_LENGTH.pack(len(body)) + body


def unframe(data: bytes) -> Iterator[types_pb2.Message]:
    """The messages of a TransferStream's concatenated data chunks, in order."""
    offset = 0
    while offset < len(data):
        if offset + FRAME_LENGTH.size > len(data):
            raise ValueError(f"a frame header is cut short at byte {offset}")
        (size,) = FRAME_LENGTH.unpack_from(data, offset)
        offset += FRAME_LENGTH.size
        if offset + size > len(data):
            raise ValueError(f"a frame of {size} bytes is cut short at byte {offset}")
        yield types_pb2.Message.FromString(data[offset:offset + size])
        offset += size
