"""How collections sit on streams (node/ops/collection_layout.py): subject tokens, the liveness
rule of a field or member, byte accounting, the recorded settings and collection names. Each
test is named after the rule it checks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlog.base import limits, subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.stream_core import stored_size
from raftlog.node.ops import collection_layout as layout
from raftlog.node.ops.collection_layout import HASH, QUEUE, SET, Settings, Slot
from raftlog.v1 import collections_pb2, streams_pb2, types_pb2

# Strings of at most the field limit once UTF-8 encoded.
fields = st.text(min_size=1, max_size=30).filter(
    lambda s: 0 < len(s.encode()) <= limits.collection_field_bytes_max)


@given(fields)
def test_a_token_decodes_back_to_its_string(text: str) -> None:
    token = layout.item_token(text, what="field")
    assert layout.decode_token(token) == text


@given(fields, fields)
def test_distinct_strings_get_distinct_tokens(a: str, b: str) -> None:
    assert (layout.item_token(a, what="field") == layout.item_token(b, what="field")) == (a == b)


@given(fields)
def test_a_token_is_one_subject_token_of_prefix_alphabet_chars(text: str) -> None:
    token = layout.item_token(text, what="field")
    assert set(token) <= set(layout.PREFIX_ALPHABET) - {"."}
    subjects.validate_subject(f"h.{token}.v")


@pytest.mark.parametrize("text", ["a.b", "*", ">", "a b", "\x00", "orders.>", "é", "🙂", "=="])
def test_wildcards_dots_spaces_and_control_chars_are_encoded_away(text: str) -> None:
    token = layout.item_token(text, what="member")
    assert len(token.split(".")) == 1 and "*" not in token and ">" not in token
    assert layout.decode_token(token) == text


def test_the_longest_key_and_field_fit_one_subject() -> None:
    prefix = layout.item_prefix(HASH, "k" * limits.collection_key_bytes_max,
                                "é" * (limits.collection_field_bytes_max // 2), what="field")
    assert len(layout.mark_subject(prefix)) <= limits.subject_bytes_max
    subjects.validate_subject(layout.value_subject(prefix))


@pytest.mark.parametrize("key, field, reason_field", [
    ("", "f", "key"),
    ("k", "", "field"),
    ("k" * (limits.collection_key_bytes_max + 1), "f", "key"),
    ("k", "f" * (limits.collection_field_bytes_max + 1), "field"),
])
def test_empty_or_too_long_keys_and_fields_are_invalid(key: str, field: str,
                                                       reason_field: str) -> None:
    with pytest.raises(RaftlogError) as info:
        layout.item_prefix(HASH, key, field, what="field")
    assert info.value.reason is Reason.INVALID_ARGUMENT
    assert info.value.metadata["field"] == reason_field


@pytest.mark.parametrize("token", ["YQ=", "YR", "a", "a.b", "!!"])
def test_a_string_that_is_not_a_canonical_token_does_not_decode(token: str) -> None:
    with pytest.raises(ValueError):
        layout.decode_token(token)


def test_the_prefix_alphabet_is_sorted_so_pages_come_in_subject_order() -> None:
    assert list(layout.PREFIX_ALPHABET) == sorted(layout.PREFIX_ALPHABET)


# ------------------------------------------------------------------------------- liveness


def summaries(*pairs: tuple[str, int]) -> list[streams_pb2.SubjectSummary]:
    return [streams_pb2.SubjectSummary(subject=s, messages=1, last_seq=seq) for s, seq in pairs]


LIVENESS = [
    # (rule, value seq, mark seq, certainly live, must read its message)
    ("a_value_without_a_delete_mark_is_live", 5, 0, True, False),
    ("a_value_beside_a_delete_mark_may_be_a_tombstone", 5, 7, False, True),
    ("an_older_mark_beside_a_newer_value_still_needs_a_read", 9, 7, False, True),
    ("a_mark_alone_is_nothing", 0, 7, False, False),
    ("nothing_is_nothing", 0, 0, False, False),
]


@pytest.mark.parametrize("rule, value_seq, mark_seq, live, doubtful", LIVENESS,
                         ids=[row[0] for row in LIVENESS])
def test_liveness(rule: str, value_seq: int, mark_seq: int, live: bool, doubtful: bool) -> None:
    prefix = layout.item_prefix(SET, "k", "m", what="member")
    pairs = [(layout.value_subject(prefix), value_seq)] if value_seq else []
    pairs += [(layout.mark_subject(prefix), mark_seq)] if mark_seq else []
    one = layout.slot(summaries(*pairs), prefix)
    assert (one.live, one.doubtful) == (live, doubtful)
    listed = layout.slots(summaries(*pairs), layout.key_prefix(SET, "k"))
    assert listed == ([one] if pairs else [])


def test_slots_pair_each_value_with_its_mark_in_token_order_and_skip_foreign_subjects() -> None:
    key = layout.key_prefix(HASH, "user")
    a, b = (layout.item_token(f, what="field") for f in ("b", "a"))
    found = layout.slots(summaries((f"{key}{a}.v", 3), (f"{key}{b}.d", 4), (f"{key}{b}.v", 2),
                                   (f"{key}{a}", 9), (f"{key}{a}.x", 9), ("h.other.v", 1)), key)
    assert found == sorted([Slot(a, value_seq=3), Slot(b, value_seq=2, mark_seq=4)],
                           key=lambda s: s.token)


def test_a_tombstone_is_told_by_its_header() -> None:
    assert layout.is_tombstone(types_pb2.Message(headers=[layout.TOMBSTONE]))
    assert not layout.is_tombstone(types_pb2.Message(payload=b"deleted"))


# ---------------------------------------------------------------------------- bytes, settings


def test_stored_bytes_counts_like_the_engine() -> None:
    headers = [types_pb2.Header(key="k", value="vé")]
    entry = streams_pb2.PublishEntry(subject="h.YQ.Yg.v", payload=b"\x00" * 17, headers=headers)
    assert layout.stored_bytes(entry.subject, entry.payload, headers) == stored_size(entry)
    message = types_pb2.Message(subject=entry.subject, payload=entry.payload, headers=headers)
    assert layout.message_bytes(message) == stored_size(entry)


@pytest.mark.parametrize("settings", [Settings(kind=HASH), Settings(kind=SET, max_bytes=10),
                                      Settings(kind=QUEUE, max_bytes=1, max_messages=2,
                                               ephemeral=True)])
def test_settings_survive_the_stream_description(settings: Settings) -> None:
    description = layout.describe(settings)
    assert len(description.encode()) <= limits.description_bytes_max
    assert layout.settings_of(description, kind=settings.kind) == settings


@pytest.mark.parametrize("description", ["", "orders", "raftlog collection {", 'raftlog '
                                         'collection {"kind": "set", "max_bytes": 0, '
                                         '"max_messages": 0, "ephemeral": false}',
                                         'raftlog collection {"kind": "hash"}'])
def test_a_description_that_is_not_a_hash_s_settings_is_none(description: str) -> None:
    assert layout.settings_of(description, kind=HASH) is None


def test_max_messages_is_for_queues_only() -> None:
    request = collections_pb2.CreateCollectionRequest(kind=HASH, name="h", max_messages=3)
    with pytest.raises(RaftlogError) as info:
        layout.settings_from_request(request)
    assert info.value.metadata["field"] == "max_messages"


def test_a_hash_stream_keeps_one_message_per_subject_and_no_byte_limit_of_its_own() -> None:
    config = layout.stream_config(layout.target(HASH, "h"), Settings(kind=HASH, max_bytes=99))
    assert config.max_msgs_per_subject == 1 and config.max_bytes == 0
    queue = layout.stream_config(layout.target(QUEUE, "q"), Settings(kind=QUEUE))
    assert queue.retention == types_pb2.RETENTION_POLICY_WORK_QUEUE
    assert list(queue.subjects) == [layout.QUEUE_SUBJECT]


# ---------------------------------------------------------------------------------- names


@pytest.mark.parametrize("kind, stream", [(HASH, "HASH_x"), (SET, "SET_x"), (QUEUE, "QUEUE_x")])
def test_a_collection_is_the_stream_named_by_its_kind(kind: int, stream: str) -> None:
    collection = layout.target(kind, "x")
    assert collection.stream == stream
    assert layout.target_of_stream(stream) == collection


@pytest.mark.parametrize("name", ["", "a.b", "a b", "n" * (limits.collection_name_bytes_max + 1)])
def test_bad_collection_names_are_invalid_names(name: str) -> None:
    with pytest.raises(RaftlogError) as info:
        layout.target(QUEUE, name)
    assert info.value.reason is Reason.INVALID_NAME


def test_the_longest_name_makes_a_valid_stream_name_for_every_kind() -> None:
    name = "n" * limits.collection_name_bytes_max
    for kind in (HASH, SET, QUEUE):
        subjects.validate_name(layout.target(kind, name).stream, what="stream")


def test_an_unknown_kind_is_invalid() -> None:
    with pytest.raises(RaftlogError) as info:
        layout.target(0, "x")
    assert info.value.reason is Reason.INVALID_ARGUMENT
