"""Topics without a node: the key hash (sarama's HashPartitioner, checked against FNV-1a's
published vectors and Go's remainder written out), the partition of a keyless publish (its
msg_id's hash), the partition stream names (reversible, never colliding, reserved), and the
ring spreading one topic's partitions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlog.base import limits, topics
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.cluster.ring import Ring
from raftlog.node.engine.stream_config import validate_config
from raftlog.node.ops.partitions import key_of, partition_for, partition_for_key
from raftlog.v1 import types_pb2

# FNV-1a 32-bit reference vectors (the FNV authors' test suite).
FNV_VECTORS = {b"": 0x811C9DC5, b"a": 0xE40C292C, b"foobar": 0xBF9CF968}


def test_fnv1a_32_matches_the_reference_vectors() -> None:
    for data, expected in FNV_VECTORS.items():
        assert topics.fnv1a_32(data) == expected


def test_fnv1a_32_of_one_byte_by_hand() -> None:
    # offset basis xor 'a' (0x61), times the prime, modulo 2**32
    assert (0x811C9DC5 ^ 0x61) == 0x811C9DA4
    assert (0x811C9DA4 * 0x01000193) % 2**32 == 0xE40C292C == topics.fnv1a_32(b"a")


def go_partition(hash32: int, n: int) -> int:
    """sarama: p := int32(h) % n; if p < 0 { p = -p } (Go's % truncates toward zero)."""
    signed = hash32 - 2**32 if hash32 >= 2**31 else hash32
    remainder = abs(signed) % n * (1 if signed >= 0 else -1)
    return -remainder if remainder < 0 else remainder


@pytest.mark.parametrize(("key", "n", "expected"), [
    (b"", 6, 3),  # int32(0x811c9dc5) = -2128831035; 2128831035 = 6 * 354805172 + 3
    (b"", 7, 2),  # 2128831035 = 7 * 304118719 + 2
    (b"a", 7, 6),  # int32(0xe40c292c) = -468965076; 468965076 = 7 * 66995010 + 6
    (b"a", 6, 0),  # 468965076 is even and its digits sum to 51
    (b"foobar", 7, 4),  # int32(0xbf9cf968) = -1080231576 = -(7 * 154318796 + 4)
])
def test_a_key_hashes_to_the_partition_sarama_picks(key: bytes, n: int, expected: int) -> None:
    assert partition_for_key(key, n) == expected
    assert go_partition(FNV_VECTORS[key], n) == expected


def test_a_key_stays_on_its_partition_and_one_partition_takes_every_key() -> None:
    for key in (b"key-1", b"order-42", bytes(range(256))):
        assert partition_for_key(key, 12) == partition_for_key(key, 12)
        assert partition_for_key(key, 12) == go_partition(topics.fnv1a_32(key), 12)
        assert partition_for_key(key, 1) == 0


def test_no_key_is_a_random_partition() -> None:
    assert partition_for_key(None, 5, choose=lambda n: n - 1) == 4
    assert {partition_for_key(None, 3) for _ in range(200)} == {0, 1, 2}


def never(n: int) -> int:
    raise AssertionError("a random partition was drawn")


@pytest.mark.parametrize(("msg_id", "n", "expected"), [
    ("a", 7, 6), ("foobar", 7, 4), ("a", 6, 0),  # the key vectors above, as ids
])
def test_a_keyless_publish_goes_where_its_msg_id_hashes(msg_id: str, n: int, expected: int
                                                         ) -> None:
    assert partition_for(key=None, msg_id=msg_id, partitions=n, choose=never) == expected


def test_a_msg_id_always_picks_the_same_partition_with_the_key_hash() -> None:
    for msg_id in ("order-42", "7F0000011A2B18B4AAC2", "ü-1"):
        for n in (1, 3, 12):
            picked = partition_for(key=None, msg_id=msg_id, partitions=n, choose=never)
            assert picked == partition_for_key(msg_id.encode(), n)  # UTF-8 bytes
            assert picked == go_partition(topics.fnv1a_32(msg_id.encode()), n)


def test_a_key_wins_over_the_msg_id_and_neither_is_random() -> None:
    assert partition_for(key=b"foobar", msg_id="a", partitions=7) == 4
    assert partition_for(key=b"", msg_id="a", partitions=7) == 2  # an empty key is a key
    assert partition_for(key=None, msg_id="", partitions=5, choose=lambda n: n - 1) == 4
    assert {partition_for(key=None, msg_id="", partitions=3) for _ in range(200)} == {0, 1, 2}


def test_a_partition_count_outside_its_bounds_is_refused() -> None:
    for count in (0, limits.topic_partitions_max + 1):
        with pytest.raises(RaftlogError) as err:
            partition_for_key(b"k", count)
        assert err.value.reason == Reason.INVALID_ARGUMENT
        with pytest.raises(RaftlogError) as err:
            partition_for(key=None, msg_id="m", partitions=count)
        assert err.value.reason == Reason.INVALID_ARGUMENT


def test_a_message_key_round_trips_through_its_header() -> None:
    message = types_pb2.Message(headers=[types_pb2.Header(key="Raftlog-Key", value="AAE=")])
    assert key_of(message) == b"\x00\x01"
    assert key_of(types_pb2.Message()) is None


# ------------------------------------------------------------------------- names

topic_names = st.text(alphabet="ab._-Z09", min_size=1, max_size=limits.topic_name_bytes_max)


@given(topic=topic_names, index=st.integers(0, limits.topic_partitions_max - 1))
def test_a_partition_stream_name_is_a_stream_name_and_decodes_back(topic: str, index: int
                                                                  ) -> None:
    name = topics.partition_stream(topic, index)
    assert len(name.encode()) <= limits.name_bytes_max
    assert topics.parse_partition_stream(name) == (topic, index)
    validate_config(types_pb2.StreamConfig(name=name, partition=types_pb2.TopicPartition(
        topic=topic, index=index, count=limits.topic_partitions_max)))


def test_topics_that_differ_only_in_dots_and_underscores_get_distinct_streams() -> None:
    names = {topics.partition_stream(topic, 1)
             for topic in ("a.b", "a_b", "a__b", "a_d", "a.d", "a_p1", "a-b", "a._b", "a_.b")}
    assert len(names) == 9


@pytest.mark.parametrize("name", [
    "TOPIC_x_p01", "TOPIC_x_p", "TOPIC_x_q1", "TOPIC__p0", "TOPIC_x", "TOPIC_x_p1x", "x_p1",
])
def test_a_name_that_is_not_canonical_is_no_partition(name: str) -> None:
    assert topics.parse_partition_stream(name) is None


@pytest.mark.parametrize("name", ["", "a b", "a/b", "a" * (limits.topic_name_bytes_max + 1)])
def test_a_bad_topic_name_is_refused(name: str) -> None:
    with pytest.raises(RaftlogError) as err:
        topics.validate_topic(name)
    assert err.value.reason == Reason.INVALID_NAME


def test_a_plain_stream_cannot_take_a_partition_name() -> None:
    for name in (topics.partition_stream("orders", 0), "TOPIC_anything"):
        with pytest.raises(RaftlogError) as err:
            validate_config(types_pb2.StreamConfig(name=name))
        assert err.value.reason == Reason.INVALID_NAME


def test_a_partition_config_must_match_its_stream_name() -> None:
    part = types_pb2.TopicPartition(topic="orders", index=1, count=2)
    for name, partition in (("orders", part),
                            (topics.partition_stream("orders", 0), part),
                            (topics.partition_stream("orders", 2),
                             types_pb2.TopicPartition(topic="orders", index=2, count=2))):
        with pytest.raises(RaftlogError) as err:
            validate_config(types_pb2.StreamConfig(name=name, partition=partition))
        assert err.value.reason == Reason.INVALID_CONFIG


# ------------------------------------------------------------------------- placement

@pytest.mark.parametrize("members", [("n1", "n2", "n3"), ("a", "b", "c", "d", "e")])
def test_one_topics_partitions_spread_over_every_member(members: tuple[str, ...]) -> None:
    ring = Ring(members)
    for topic in ("orders", "t.1", "x"):
        owners = [ring.owner(topics.partition_stream(topic, i)) for i in range(2 * len(members))]
        assert owners[:len(members)] == owners[len(members):]  # i and i + n share a member
        assert sorted(owners[:len(members)]) == sorted(members)
        placement = ring.place(topics.partition_stream(topic, 0), replicas=3)
        assert placement.primary == owners[0] and len(set(placement.replicas)) == 3
