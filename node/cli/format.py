"""What the CLI reads from and writes for people: parsing of sizes, durations and times, and
rendering of tables, key/value blocks, messages and JSON documents.

Everything here is pure (text in, text out; the clock is a parameter) so it is tested without a
node. Sizes are binary: `1KB` = `1KiB` = 1024 bytes, like the NATS and Redis tools.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message as ProtoMessage

from raftlog.v1 import consumers_pb2, streams_pb2, types_pb2

_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)\s*", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

RETENTION_NAMES = {
    "limits": types_pb2.RETENTION_POLICY_LIMITS,
    "work-queue": types_pb2.RETENTION_POLICY_WORK_QUEUE,
    "interest": types_pb2.RETENTION_POLICY_INTEREST,
}
DELIVER_NAMES = {
    "all": consumers_pb2.DELIVER_POLICY_ALL,
    "last": consumers_pb2.DELIVER_POLICY_LAST,
    "new": consumers_pb2.DELIVER_POLICY_NEW,
    "by-start-seq": consumers_pb2.DELIVER_POLICY_BY_START_SEQ,
    "by-start-time": consumers_pb2.DELIVER_POLICY_BY_START_TIME,
    "last-per-subject": consumers_pb2.DELIVER_POLICY_LAST_PER_SUBJECT,
}


# ---------------------------------------------------------------------------------------------
# Parsing (each raises ValueError with a message fit for `error: ...`).


def parse_size(text: str) -> int:
    """`10MB`, `512KiB`, `1.5g`, `300` (bytes) -> bytes. Binary units."""
    match = _SIZE_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a size: {text!r} (examples: 512, 64KB, 10MB, 1GiB)")
    number, unit = match.groups()
    return int(float(number) * _SIZE_UNITS[unit[:1].lower()])


def parse_duration_ms(text: str) -> int:
    """`500ms`, `30s`, `2m`, `1h30m`, `1d`, or a plain number of seconds -> milliseconds."""
    text = text.strip()
    try:
        return int(float(text) * 1000)
    except ValueError:
        pass
    parts = _DURATION_PART_RE.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise ValueError(f"not a duration: {text!r} (examples: 500ms, 30s, 2m, 1h30m, 1d)")
    return int(sum(float(number) * _DURATION_UNITS_MS[unit] for number, unit in parts))


def parse_duration_list_ms(text: str) -> list[int]:
    """`1s,5s,30s` -> [1000, 5000, 30000]."""
    return [parse_duration_ms(part) for part in text.split(",") if part.strip()]


def parse_time_ms(text: str) -> int:
    """ISO 8601 (`2026-11-22T10:00:00Z`; no zone = local time) or ms since the epoch."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (ISO 8601 like 2026-11-22T10:00:00Z, or ms since the epoch)"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()
    return int(when.timestamp() * 1000)


def parse_header(text: str) -> tuple[str, str]:
    """`key=value` -> (key, value); the value may contain `=`."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"not a header: {text!r} (expected key=value)")
    return key, value


def parse_subjects(text: str) -> list[str]:
    """`a.>,b.*` -> ["a.>", "b.*"]."""
    return [part.strip() for part in text.split(",") if part.strip()]


# ---------------------------------------------------------------------------------------------
# Human units.


def human_size(n_bytes: int) -> str:
    if n_bytes < 1024:
        return f"{n_bytes} B"
    value = float(n_bytes)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def human_duration_ms(ms: int) -> str:
    """30000 -> `30s`, 5400000 -> `1h30m`, 1500 -> `1.5s`, 250 -> `250ms`."""
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:g}s"
    parts = []
    rest_s = ms // 1000
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)):
        count, rest_s = divmod(rest_s, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def human_count(n: int) -> str:
    return f"{n:,}"


def human_time_ms(ts_ms: int) -> str:
    if ts_ms <= 0:
        return "-"
    when = dt.datetime.fromtimestamp(ts_ms / 1000, tz=dt.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def limit_text(value: int, render: Any = human_count) -> str:
    """A stream or consumer limit where 0 means none."""
    return "unlimited" if value == 0 else str(render(value))


def payload_text(payload: bytes) -> str:
    """The payload as text when it is UTF-8 without control characters, else `base64:...`."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(payload).decode("ascii")
    if any(ch < " " and ch not in "\t\n" for ch in text):
        return "base64:" + base64.b64encode(payload).decode("ascii")
    return text


def decode_payload_arg(text: str) -> bytes:
    """A payload given on the command line; `base64:...` is decoded, anything else is UTF-8."""
    if text.startswith("base64:"):
        try:
            return base64.b64decode(text[len("base64:") :], validate=True)
        except binascii.Error as exc:
            raise ValueError(f"bad base64 payload: {exc}") from None
    return text.encode("utf-8")


# ---------------------------------------------------------------------------------------------
# Layout.


def render_table(
    headers: Sequence[str], rows: Iterable[Sequence[object]], *, right_align: Sequence[int] = ()
) -> str:
    """Aligned columns separated by two spaces; `right_align` lists numeric column indexes."""
    cells = [[str(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(row: Sequence[str]) -> str:
        padded = [
            cell.rjust(widths[i]) if i in right_align else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        return "  ".join(padded).rstrip()

    return "\n".join([line(list(headers)), *(line(row) for row in cells)])


def render_block(title: str, fields: Sequence[tuple[str, object]]) -> str:
    """A title line and indented `Key:  value` lines with the values aligned."""
    width = max((len(key) for key, _ in fields), default=0) + 1
    lines = [title] + [f"  {(key + ':').ljust(width)}  {value}" for key, value in fields]
    return "\n".join(lines)


def to_json(document: object) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False)


def proto_dict(message: ProtoMessage) -> dict[str, Any]:
    """The proto's JSON mapping with field names as in the .proto, zeros included, and 64-bit
    integers as JSON numbers where that is exact. Messages also get `payload_text`."""
    document = json_format.MessageToDict(
        message,
        always_print_fields_with_no_presence=True,
        preserving_proto_field_name=True,
        unquote_int64_if_possible=True,
    )
    _add_payload_text(message, document)
    return document


def _add_payload_text(message: ProtoMessage, document: dict[str, Any]) -> None:
    if isinstance(message, types_pb2.Message):
        text = payload_text(message.payload)
        if not text.startswith("base64:"):
            document["payload_text"] = text
        return
    for field, value in message.ListFields():
        if field.message_type is None or field.name not in document:
            continue
        if field.message_type.GetOptions().map_entry:
            continue
        if field.is_repeated:
            for item, item_doc in zip(value, document[field.name], strict=True):
                _add_payload_text(item, item_doc)
        else:
            _add_payload_text(value, document[field.name])


# ---------------------------------------------------------------------------------------------
# raftlog objects for people.


def retention_name(value: int) -> str:
    return next((k for k, v in RETENTION_NAMES.items() if v == value), str(value))


def deliver_name(value: int) -> str:
    return next((k for k, v in DELIVER_NAMES.items() if v == value), str(value))


def stream_info_text(info: types_pb2.StreamInfo) -> str:
    config, state = info.config, info.state
    config_fields: list[tuple[str, object]] = [
        ("Subjects", ", ".join(config.subjects) or "(any)"),
        ("Retention", retention_name(config.retention)),
        ("Max age", limit_text(config.max_age_ms, human_duration_ms)),
        ("Max messages", limit_text(config.max_msgs)),
        ("Max bytes", limit_text(config.max_bytes, human_size)),
        ("Max msgs/subject", limit_text(config.max_msgs_per_subject)),
        (
            "Max message size",
            "server limit" if not config.max_msg_bytes else human_size(config.max_msg_bytes),
        ),
        (
            "Dedupe window",
            human_duration_ms(config.dedupe_window_ms)
            if config.dedupe_window_ms
            else "default (2m)",
        ),
        ("Replicas", config.replicas or "default"),
        ("Created", human_time_ms(info.created_ms)),
    ]
    if config.description:
        config_fields.insert(0, ("Description", config.description))
    state_fields: list[tuple[str, object]] = [
        ("Messages", human_count(state.messages)),
        ("Bytes", human_size(state.bytes)),
        ("First seq", _seq_at(state.first_seq, state.first_ts_ms, state.messages)),
        ("Last seq", _seq_at(state.last_seq, state.last_ts_ms, state.messages)),
        ("Commit seq", state.commit_seq),
        ("Subjects", human_count(state.num_subjects)),
        ("Consumers", state.consumers),
    ]
    return "\n\n".join(
        [render_block(f"Stream {config.name}", config_fields), render_block("State", state_fields)]
    )


def _seq_at(seq: int, ts_ms: int, messages: int) -> str:
    return f"{seq} ({human_time_ms(ts_ms)})" if messages else str(seq)


def streams_table(streams: Sequence[types_pb2.StreamInfo]) -> str:
    rows = [
        (
            s.config.name,
            ", ".join(s.config.subjects) or "(any)",
            retention_name(s.config.retention),
            human_count(s.state.messages),
            human_size(s.state.bytes),
            s.state.first_seq,
            s.state.last_seq,
            s.state.consumers,
        )
        for s in streams
    ]
    headers = ("NAME", "SUBJECTS", "RETENTION", "MESSAGES", "BYTES", "FIRST", "LAST", "CONSUMERS")
    return render_table(headers, rows, right_align=(3, 4, 5, 6, 7))


def consumer_info_text(info: consumers_pb2.ConsumerInfo) -> str:
    config, state = info.config, info.state
    deliver = deliver_name(config.deliver_policy)
    if config.deliver_policy == consumers_pb2.DELIVER_POLICY_BY_START_SEQ:
        deliver += f" (from seq {config.opt_start_seq})"
    elif config.deliver_policy == consumers_pb2.DELIVER_POLICY_BY_START_TIME:
        deliver += f" (from {human_time_ms(config.opt_start_time_ms)})"
    config_fields: list[tuple[str, object]] = [
        ("Filter", config.filter_subject or "(all subjects)"),
        ("Deliver", deliver),
        ("Ack wait", human_duration_ms(config.ack_wait_ms or 30_000)),
        ("Max deliver", limit_text(config.max_deliver)),
        ("Backoff", ", ".join(human_duration_ms(b) for b in config.backoff_ms) or "-"),
        ("Max ack pending", config.max_ack_pending or "default (1000)"),
        ("Dead letter", config.dead_letter_subject or "- (dropped)"),
        ("Created", human_time_ms(info.created_ms)),
    ]
    if config.description:
        config_fields.insert(0, ("Description", config.description))
    state_fields: list[tuple[str, object]] = [
        ("Delivered seq", state.delivered_seq),
        ("Ack floor", state.ack_floor),
        ("Pending", human_count(state.num_pending)),
        ("Ack pending", human_count(state.num_ack_pending)),
        ("Redelivered", human_count(state.num_redelivered)),
        ("Dead-lettered", human_count(state.num_dead_lettered)),
    ]
    title = f"Consumer {info.stream} > {config.name}"
    return "\n\n".join([render_block(title, config_fields), render_block("State", state_fields)])


def consumers_table(consumers: Sequence[consumers_pb2.ConsumerInfo]) -> str:
    rows = [
        (
            c.config.name,
            c.config.filter_subject or "(all)",
            deliver_name(c.config.deliver_policy),
            human_count(c.state.num_pending),
            human_count(c.state.num_ack_pending),
            human_count(c.state.num_redelivered),
            c.state.delivered_seq,
            c.state.ack_floor,
        )
        for c in consumers
    ]
    headers = (
        "NAME",
        "FILTER",
        "DELIVER",
        "PENDING",
        "ACK PENDING",
        "REDELIVERED",
        "DELIVERED",
        "ACK FLOOR",
    )
    return render_table(headers, rows, right_align=(3, 4, 5, 6, 7))


def subjects_table(response: streams_pb2.ListSubjectsByPrefixResponse) -> str:
    rows = [(s.subject, human_count(s.messages), s.last_seq) for s in response.subjects]
    table = render_table(("SUBJECT", "MESSAGES", "LAST SEQ"), rows, right_align=(1, 2))
    if response.truncated:
        table += "\n(more subjects match: raise --limit or narrow --prefix)"
    return table


def message_text(message: types_pb2.Message) -> str:
    """`#SEQ SUBJECT  TIME  [delivery N]  [msg-id X]`, then headers and the payload, indented."""
    head = [f"#{message.seq}", message.subject, human_time_ms(message.ts_ms)]
    if message.deliver_count:
        head.append(f"delivery {message.deliver_count}")
    if message.msg_id:
        head.append(f"msg-id {message.msg_id}")
    lines = ["  ".join(head)]
    lines += [f"  {h.key}: {h.value}" for h in message.headers]
    body = payload_text(message.payload)
    lines += ["  " + line for line in (body.splitlines() or [""])]
    return "\n".join(lines)


def error_text(reason: str, message: str, metadata: Mapping[str, str]) -> str:
    text = f"error: {reason}: {message}"
    if metadata:
        text += " (" + ", ".join(f"{k}={v}" for k, v in sorted(metadata.items())) + ")"
    return text
