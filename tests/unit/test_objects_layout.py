"""The object store's layout on a stream (node/ops/objects_layout.py): name tokens, metadata,
byte ranges and chunking; pure functions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlog.base import limits, subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops import objects_layout as layout
from raftlog.node.ops.objects_layout import ObjectMeta


@given(st.text(min_size=1, max_size=16))
def test_a_name_token_is_a_subject_token_and_decodes_back(name: str) -> None:
    token = layout.encode_name(name)
    subjects.validate_subject(f"$O.b.M.{token}")
    assert "." not in token
    assert layout.decode_name(token) == name


@given(st.text(max_size=8), st.text(max_size=8))
def test_a_name_prefix_encodes_to_a_token_prefix(prefix: str, rest: str) -> None:
    if prefix + rest:
        assert layout.encode_name(prefix + rest).startswith(layout.encode_prefix(prefix))


@pytest.mark.parametrize("name,token", [("a/b-c_d", "a/b-c_d"), ("a.b", "a%2Eb"),
                                        ("x y*>", "x%20y%2A%3E"), ("%", "%25"),
                                        ("é", "%C3%A9")])
def test_names_are_escaped_byte_by_byte(name: str, token: str) -> None:
    assert layout.encode_name(name) == token


def test_names_that_do_not_fit_a_subject_are_refused() -> None:
    for bad in ("", "." * 65):
        with pytest.raises(RaftlogError) as caught:
            layout.encode_name(bad)
        assert caught.value.reason is Reason.INVALID_NAME
    longest = "x" * limits.object_name_token_bytes_max
    bucket = "b" * limits.object_bucket_name_bytes_max
    subjects.validate_subject(layout.meta_subject(bucket, longest))
    for token in ("%ZZ", "a%2", "%2e", "%C3"):  # never made by encode_name
        with pytest.raises(RaftlogError):
            layout.decode_name(token)


def test_bucket_names_and_streams() -> None:
    assert layout.bucket_stream("photos") == "OBJ_photos"
    assert layout.bucket_of_stream("OBJ_photos", ["$O.photos.>"]) == "photos"
    assert layout.bucket_of_stream("OBJ_photos", ["other.>"]) is None
    assert layout.bucket_of_stream("photos", ["$O.photos.>"]) is None
    for bad in ("a.b", "x" * (limits.object_bucket_name_bytes_max + 1), ""):
        with pytest.raises(RaftlogError):
            layout.bucket_stream(bad)


def test_metadata_round_trips_and_a_bad_one_is_corrupt() -> None:
    meta = ObjectMeta(name="a", size=10, chunk_size=4, chunk_count=3, sha256="ab" * 32,
                      upload="0123456789abcdef01234567", headers=(("k", "v"), ("k", "w")))
    assert layout.decode_meta(layout.encode_meta(meta)) == meta
    tomb = ObjectMeta(name="a", deleted=True)
    assert layout.decode_meta(layout.encode_meta(tomb)) == tomb
    wrong_count = layout.encode_meta(ObjectMeta(name="a", size=10, chunk_size=4, chunk_count=2,
                                                upload="0" * 24))
    for payload in (b"not json", b"{}", wrong_count,
                    layout.encode_meta(ObjectMeta(name="a", size=1, upload="../x"))):
        with pytest.raises(RaftlogError) as caught:
            layout.decode_meta(payload)
        assert caught.value.reason is Reason.CORRUPT_RECORD


@pytest.mark.parametrize("offset,length,size,expected", [
    (0, 10, 10, (0, 10, 0, 2)),  # the whole object, chunks 0..2 of 4 bytes
    (4, 4, 10, (4, 8, 1, 1)),  # exactly one chunk
    (3, 2, 10, (3, 5, 0, 1)),  # across a boundary
    (8, 100, 10, (8, 10, 2, 2)),  # past the end: cut at the end
    (10, 5, 10, (10, 10, 0, -1)),  # at the end: empty
    (50, 5, 10, (10, 10, 0, -1)),  # past the end: empty at the end
    (3, 0, 10, (3, 3, 0, -1)),  # a length of 0: empty
    (0, 5, 0, (0, 0, 0, -1)),  # an empty object
])
def test_byte_ranges(offset: int, length: int, size: int,
                     expected: tuple[int, int, int, int]) -> None:
    span = layout.byte_range(offset=offset, length=length, size=size,
                             chunk_bytes=4 if size else 0)
    assert (span.start, span.end, span.first_chunk, span.last_chunk) == expected


@given(st.binary(max_size=200), st.integers(0, 220), st.integers(0, 220),
       st.integers(1, 50))
def test_a_range_read_from_chunks_is_the_slice(data: bytes, offset: int, length: int,
                                               chunk_bytes: int) -> None:
    chunks = [data[i:i + chunk_bytes] for i in range(0, len(data), chunk_bytes)]
    span = layout.byte_range(offset=offset, length=length, size=len(data),
                             chunk_bytes=chunk_bytes)
    got = b"".join(span.slice_of(i, chunk_bytes, chunks[i])
                   for i in range(span.first_chunk, span.last_chunk + 1))
    assert got == data[offset:offset + length]


@given(st.lists(st.binary(max_size=40), max_size=12), st.integers(1, 16))
def test_the_rechunker_cuts_any_pieces_into_equal_chunks(pieces: list[bytes],
                                                         chunk_bytes: int) -> None:
    cutter = layout.Rechunker(chunk_bytes)
    chunks = [chunk for piece in pieces for chunk in cutter.add(piece)]
    rest = cutter.rest()
    assert all(len(chunk) == chunk_bytes for chunk in chunks)
    assert len(rest) < chunk_bytes
    assert b"".join([*chunks, rest]) == b"".join(pieces)
    total = len(b"".join(pieces))
    assert len(chunks) + (1 if rest else 0) == layout.chunk_count(total, chunk_bytes)


def test_chunk_size_defaults_and_limits() -> None:
    assert layout.chunk_size(0) == limits.object_chunk_bytes_default
    assert layout.chunk_size(limits.object_chunk_bytes_max) == limits.object_chunk_bytes_max
    assert limits.object_chunk_bytes_max + limits.subject_bytes_max <= limits.message_bytes_max
    with pytest.raises(RaftlogError) as caught:
        layout.chunk_size(limits.object_chunk_bytes_max + 1)
    assert caught.value.reason is Reason.MESSAGE_TOO_LARGE
