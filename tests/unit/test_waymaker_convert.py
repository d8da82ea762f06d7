"""The Waymaker front-end's pure parts: message conversions (node/api/waymaker_convert.py), the
node-id mapping (waymaker_ids.py), the result-code table (waymaker_codes.py), the stats
summary and the lagging watch relay (waymaker.py). Each test is named after the rule it checks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.compat import waymaker_streams_pb2 as wm
from raftlog.node.api import waymaker_convert as convert
from raftlog.node.api import waymaker_ids as ids
from raftlog.node.api.waymaker_cluster import LaggingWatch, convert_stats
from raftlog.node.api.waymaker_codes import Family, result_code
from raftlog.v1 import cluster_pb2, consumers_pb2, types_pb2

# ---------------------------------------------------------------------- streams


@pytest.mark.parametrize(("retention", "policy"), [
    (wm.Retention(work_queue=wm.WorkQueueRetention()), types_pb2.RETENTION_POLICY_WORK_QUEUE),
    (wm.Retention(interest=wm.InterestRetention()), types_pb2.RETENTION_POLICY_INTEREST),
    (wm.Retention(limits=wm.LimitsRetention()), types_pb2.RETENTION_POLICY_LIMITS),
    (wm.Retention(), types_pb2.RETENTION_POLICY_LIMITS),
])
def test_retention_oneof_becomes_the_policy(retention: wm.Retention, policy: int) -> None:
    config = convert.stream_config_in(wm.StreamConfigPb(name="s", retention=retention))
    assert config.retention == policy
    back = convert.stream_config_out(config)
    expected = retention.WhichOneof("policy") or "limits"
    assert back.retention.WhichOneof("policy") == expected


def test_present_limits_carry_over_and_absent_ones_mean_none() -> None:
    config = convert.stream_config_in(wm.StreamConfigPb(
        name="s", subjects_filter=["a.>"], max_msg_bytes=10, max_msgs_per_subject=3,
        block_size=77, retention=wm.Retention(limits=wm.LimitsRetention(max_msgs=5))))
    assert (config.max_msgs, config.max_age_ms, config.max_bytes) == (5, 0, 0)
    assert (list(config.subjects), config.max_msg_bytes, config.max_msgs_per_subject) == (
        ["a.>"], 10, 3)
    back = convert.stream_config_out(config)
    assert back.retention.limits.max_msgs == 5
    assert not back.retention.limits.HasField("max_age_ms")
    assert not back.retention.limits.HasField("max_bytes")
    assert back.retention.limits.strict_limits  # raftlog prunes exactly
    assert back.block_size == convert.BLOCK_SIZE_REPORTED == 1


@pytest.mark.parametrize(("config", "field"), [
    (wm.StreamConfigPb(name="s", ephemeral=True), "ephemeral"),
])
def test_settings_raftlog_lacks_are_refused_not_dropped(config: wm.StreamConfigPb,
                                                        field: str) -> None:
    with pytest.raises(RaftlogError) as refused:
        convert.stream_config_in(config)
    assert refused.value.reason == Reason.INVALID_CONFIG
    assert refused.value.metadata["field"] == field


def test_sources_carry_over_both_ways() -> None:
    source = wm.StreamSourceConfigPb(
        source_stream="o", filter_subject="o.>", start_time_ms=5,
        subject_transform=wm.SubjectTransformPb(source_pattern="o.*", destination="p.x"),
        max_initial_backfill=9, on_drop=wm.ON_DROP_SKIP_TO_FIRST_AVAILABLE, dlq_stream="d")
    config = convert.stream_config_in(wm.StreamConfigPb(name="s", sources=[source]))
    (copied,) = config.sources
    assert (copied.stream, copied.filter_subject, copied.start_time_ms, copied.dlq_stream,
            copied.max_initial_backfill) == ("o", "o.>", 5, "d", 9)
    assert copied.on_drop == types_pb2.SOURCE_ON_DROP_SKIP_TO_FIRST_AVAILABLE
    assert copied.subject_transform.destination == "p.x"
    assert list(convert.stream_config_out(config).sources) == [source]


def test_a_block_is_one_message() -> None:
    stats = convert.stats_out(types_pb2.StreamState(first_seq=7, last_seq=10, messages=4,
                                                    bytes=99))
    assert (stats.last_seq, stats.msg_count, stats.bytes, stats.block_count,
            stats.first_block) == (10, 4, 99, 4, 7)
    assert convert.stats_out(types_pb2.StreamState(first_seq=11, last_seq=10)).first_block == 0


def test_update_carries_only_present_fields() -> None:
    update = convert.update_in(wm.UpdateStreamRequest(name="s", max_msgs=0, max_bytes=9,
                                                      strict_limits=True))
    assert update.name == "s"
    assert update.HasField("max_msgs") and update.max_msgs == 0  # 0 clears the limit
    assert update.max_bytes == 9
    assert not update.HasField("max_age_ms") and not update.HasField("max_msg_bytes")


def test_turning_strict_limits_off_is_an_immutable_field() -> None:
    with pytest.raises(RaftlogError) as refused:
        convert.update_in(wm.UpdateStreamRequest(name="s", strict_limits=False))
    assert refused.value.reason == Reason.IMMUTABLE_FIELD


# ---------------------------------------------------------------------- messages


def test_expected_last_seq_is_the_per_subject_check_and_zero_counts() -> None:
    checked = convert.publish_in(wm.PublishRequest(stream="s", subject="a", expected_last_seq=0))
    assert checked.HasField("expected_last_subject_seq")
    assert checked.expected_last_subject_seq == 0
    assert not checked.HasField("expected_last_seq")
    unchecked = convert.publish_in(wm.PublishRequest(stream="s", subject="a"))
    assert not unchecked.HasField("expected_last_subject_seq")


def test_a_publisher_timestamp_travels_in_a_header_and_comes_back_as_ts_ms() -> None:
    request = convert.publish_in(wm.PublishRequest(
        stream="s", subject="a", payload=b"p", ts_ms=1234,
        headers=[wm.MessageHeader(key="k", value="v")]))
    assert [(h.key, h.value) for h in request.headers] == [("k", "v"),
                                                           (convert.TS_HEADER, "1234")]
    stored = types_pb2.Message(seq=3, subject="a", ts_ms=999, payload=b"p",
                               headers=request.headers, deliver_count=2)
    shown = convert.message_out(stored)
    assert (shown.seq, shown.ts_ms, shown.payload, shown.deliver_count) == (3, 1234, b"p", 2)
    assert [(h.key, h.value) for h in shown.headers] == [("k", "v")]
    assert convert.message_out(types_pb2.Message(ts_ms=999)).ts_ms == 999


# ---------------------------------------------------------------------- consumers


def test_consumer_defaults_follow_the_seed() -> None:
    config = convert.consumer_config_in(wm.ConsumerConfigPb(name="c"))
    assert config.max_deliver == limits.waymaker_max_deliver_default == 5
    assert config.ack_wait_ms == 0  # raftlog's 0 is also 30 s
    shown = convert.consumer_config_out(config)
    assert (shown.max_deliver, shown.ack_wait_ms) == (5, 30_000)


@pytest.mark.parametrize(("seed", "raftlog", "start_seq", "start_time_ms"), [
    (wm.DELIVERY_ALL, consumers_pb2.DELIVER_POLICY_ALL, 0, 0),
    (wm.DELIVERY_LAST, consumers_pb2.DELIVER_POLICY_LAST, 0, 0),
    (wm.DELIVERY_BY_START_SEQ, consumers_pb2.DELIVER_POLICY_BY_START_SEQ, 9, 0),
    (wm.DELIVERY_BY_START_TIME, consumers_pb2.DELIVER_POLICY_BY_START_TIME, 0, 5_000),
])
def test_delivery_policies_map_both_ways(seed: int, raftlog: int, start_seq: int,
                                         start_time_ms: int) -> None:
    config = convert.consumer_config_in(wm.ConsumerConfigPb(
        name="c", delivery_policy=wm.DeliveryPolicyPb(type=seed, start_seq=9,  # type: ignore[arg-type]
                                                      start_time_ms=5_000)))
    assert (config.deliver_policy, config.opt_start_seq, config.opt_start_time_ms) == (
        raftlog, start_seq, start_time_ms)
    assert convert.consumer_config_out(config).delivery_policy.type == seed


def test_deliver_group_is_refused() -> None:
    with pytest.raises(RaftlogError) as refused:
        convert.consumer_config_in(wm.ConsumerConfigPb(name="c", deliver_group="g"))
    assert (refused.value.reason, refused.value.metadata["field"]) == (
        Reason.INVALID_CONFIG, "deliver_group")


def test_what_the_seed_cannot_name_shows_as_documented_values() -> None:
    shown = convert.consumer_config_out(consumers_pb2.ConsumerConfig(
        name="c", deliver_policy=consumers_pb2.DELIVER_POLICY_NEW, max_deliver=0))
    assert shown.max_deliver == convert.MAX_DELIVER_UNLIMITED
    assert shown.delivery_policy.type == convert.UNNAMED_POLICY_BASE + 2


def test_consumer_state_fields() -> None:
    state = convert.consumer_state_out(consumers_pb2.ConsumerInfo(
        stream="s", config=consumers_pb2.ConsumerConfig(name="c", max_deliver=3),
        created_ms=77, state=consumers_pb2.ConsumerState(delivered_seq=9, ack_floor=4,
                                                         num_dead_lettered=2)))
    assert (state.config.name, state.ack_floor, state.last_delivered, state.created_at_ms,
            state.redelivered_dropped) == ("c", 4, 9, 77, 2)


# ---------------------------------------------------------------------- cluster


def test_watch_events_map_and_a_cleared_override_has_claimant_zero() -> None:
    created = convert.watch_event_out(cluster_pb2.WatchEvent(
        type=cluster_pb2.WATCH_EVENT_TYPE_STREAM_DELETED, stream="s", ts_ms=5), node_id="n2")
    assert created is not None
    assert (created.type, created.stream.name, created.node_id, created.ts_ms) == (
        wm.WATCH_STREAM_DELETED, "s", 2, 5)
    consumer = convert.watch_event_out(cluster_pb2.WatchEvent(
        type=cluster_pb2.WATCH_EVENT_TYPE_CONSUMER_CREATED, stream="s", consumer="c"),
        node_id="n1")
    assert consumer is not None and (consumer.consumer.stream, consumer.consumer.consumer) == (
        "s", "c")
    claimed = convert.watch_event_out(cluster_pb2.WatchEvent(
        type=cluster_pb2.WATCH_EVENT_TYPE_AUTHORITY_CHANGED, stream="s", claimant="n3",
        fence_epoch=4), node_id="n1")
    assert claimed is not None
    assert (claimed.authority.claimant_node_id, claimed.authority.fence_epoch) == (3, 4)
    cleared = convert.watch_event_out(cluster_pb2.WatchEvent(
        type=cluster_pb2.WATCH_EVENT_TYPE_AUTHORITY_CHANGED, stream="s", fence_epoch=4),
        node_id="n1")
    assert cleared is not None
    assert (cleared.authority.claimant_node_id, cleared.authority.fence_epoch) == (0, 0)
    assert convert.watch_event_out(cluster_pb2.WatchEvent(
        type=cluster_pb2.WATCH_EVENT_TYPE_MEMBER_CHANGED, node_id="n4"), node_id="n1") is None


def test_stats_total_only_the_nodes_that_answered_and_skew_is_the_spread() -> None:
    stats = cluster_pb2.ClusterStreamStats(
        nodes=[cluster_pb2.PerNodeSummary(node_id="n1", streams=3, messages=30, bytes=300,
                                          reachable=True),
               cluster_pb2.PerNodeSummary(node_id="n2", streams=1, messages=5, bytes=50,
                                          reachable=True),
               cluster_pb2.PerNodeSummary(node_id="n3", reachable=False)],
        streams=[cluster_pb2.PerStreamStats(stream="a", primary="n1", messages=30, bytes=300,
                                            last_seq=31)])
    reply = convert_stats(stats, include_per_stream=True)
    assert [(n.node_id, n.status) for n in reply.nodes] == [(1, "ok"), (2, "ok"),
                                                             (3, "unreachable")]
    assert (reply.total_stream_count, reply.total_msg_count, reply.total_bytes) == (4, 35, 350)
    assert (reply.skew_count, reply.skew_bytes) == (2, 250)
    assert [(s.name, s.owner_node_id, s.last_seq) for s in reply.streams] == [("a", 1, 31)]
    alone = convert_stats(stats, include_per_stream=True, only_node="n2")
    assert [n.node_id for n in alone.nodes] == [2] and not alone.streams
    assert not convert_stats(stats, include_per_stream=False).streams


def test_a_slow_watcher_gets_the_number_of_dropped_events() -> None:
    async def burst() -> AsyncIterator[cluster_pb2.WatchEvent]:
        for k in range(limits.waymaker_watch_buffer_max + 500):
            yield cluster_pb2.WatchEvent(type=cluster_pb2.WATCH_EVENT_TYPE_STREAM_CREATED,
                                         stream=f"s{k}")

    async def run() -> list[wm.WatchEvent]:
        return [event async for event in LaggingWatch(burst(), node_id="n1").events()]

    events = asyncio.run(asyncio.wait_for(run(), 10))
    assert len(events) == limits.waymaker_watch_buffer_max
    assert events[0].lagged_count == 500 and events[0].stream.name == "s500"
    assert all(event.lagged_count == 0 for event in events[1:])


# ---------------------------------------------------------------------- framing, node ids


def test_transfer_frames_read_back_in_order() -> None:
    messages = [types_pb2.Message(seq=k, subject="a", payload=b"x" * k) for k in range(1, 5)]
    data = b"".join(convert.frame(m) for m in messages)
    assert list(convert.unframe(data)) == messages
    with pytest.raises(ValueError, match="cut short"):
        list(convert.unframe(data[:-1]))


@pytest.mark.parametrize(("node_id", "number"), [
    ("n7", 7), ("42", 42), ("n1", 1), ("", 0),
])
def test_numbered_node_ids_map_to_their_number(node_id: str, number: int) -> None:
    assert ids.to_wire(node_id) == number


@pytest.mark.parametrize("node_id", ["n0", "alpha", "n99999999999999999999", "node-3"])
def test_other_node_ids_hash_above_every_number(node_id: str) -> None:
    number = ids.to_wire(node_id)
    assert 1 << 62 <= number < 1 << 63
    assert ids.to_wire(node_id) == number  # stable


def test_node_ids_map_back_through_the_members() -> None:
    members = ["n1", "n2", "alpha"]
    assert ids.from_wire(2, members) == "n2"
    assert ids.from_wire(ids.to_wire("alpha"), members) == "alpha"
    assert ids.from_wire(3, members) is None
    assert ids.from_wire(0, members) is None


# ---------------------------------------------------------------------- result codes


@pytest.mark.parametrize(("family", "reason", "code"), [
    (Family.STREAM, Reason.STREAM_NOT_FOUND, "no_such_stream"),
    (Family.STREAM, Reason.STREAM_EXISTS, "already_exists"),
    (Family.STREAM, Reason.INVALID_CONFIG, "invalid_config"),
    (Family.STREAM, Reason.INVALID_NAME, "invalid_config"),
    (Family.STREAM, Reason.IMMUTABLE_FIELD, "immutable_field"),
    (Family.STREAM, Reason.CORRUPT_RECORD, "internal"),
    (Family.STREAM, Reason.INTERNAL, "internal"),
    (Family.PUBLISH, Reason.SUBJECT_NOT_IN_STREAM, "subject_rejected"),
    (Family.PUBLISH, Reason.INVALID_SUBJECT, "subject_rejected"),
    (Family.PUBLISH, Reason.MESSAGE_TOO_LARGE, "oversize"),
    (Family.PUBLISH, Reason.WRONG_LAST_SUBJECT_SEQ, "wrong_revision"),
    (Family.PUBLISH, Reason.STREAM_NOT_FOUND, "no_such_stream"),
    (Family.CONSUMER, Reason.CONSUMER_NOT_FOUND, "no_such_consumer"),
    (Family.CONSUMER, Reason.CONSUMER_EXISTS, "already_exists"),
    (Family.CONSUMER, Reason.NOT_DELIVERED, "not_delivered"),
    (Family.CONSUMER, Reason.WORK_QUEUE_OVERLAP, "invalid_config"),
    (Family.CLUSTER, Reason.NO_LEADER, "no_leader"),
    (Family.MIGRATE, Reason.STREAM_NOT_FOUND, "no_source"),
    (Family.MIGRATE, Reason.NODE_NOT_FOUND, "source_unreachable"),
    (Family.MIGRATE, Reason.MEMBERSHIP_CHANGE_IN_PROGRESS, "source_busy"),
])
def test_each_reason_has_the_seed_code_of_its_family(family: Family, reason: Reason,
                                                     code: str) -> None:
    assert result_code(family, reason) == code


@pytest.mark.parametrize("reason", [Reason.NO_QUORUM, Reason.NOT_PRIMARY, Reason.CATCHING_UP,
                                    Reason.FORWARD_FAILED, Reason.TIMEOUT, Reason.OVERLOADED,
                                    Reason.UNAUTHENTICATED, Reason.NO_LEADER])
def test_retryable_and_credential_failures_stay_grpc_statuses(reason: Reason) -> None:
    assert result_code(Family.STREAM, reason) is None
    assert result_code(Family.PUBLISH, reason) is None


def test_every_reason_has_an_answer_in_every_family() -> None:
    for family in Family:
        for reason in Reason:
            code = result_code(family, reason)
            assert code is None or (code and code == code.lower()), (family, reason)

