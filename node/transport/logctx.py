"""What a log line knows about the call it was written for, and the JSON line format.

Per-call fields live in context variables: the `rpc` wrappers set `request_id`, `method` and
(when the request names them) `stream`, `consumer` and `epoch` for the length of each servicer
call (`call_fields`); code may add more for a block with `bind`. asyncio copies the context
into every task a call starts, so a line logged anywhere under the call carries them. Threads
(group commit, Raft) do not see them.

The node's own loops use the same fields for the stream a line is about: `bind` around the
work on one stream in a task (the coordinator's reconcile, a source tail), or
`extra=fields(stream=..., epoch=...)` on single lines of a loop that serves many streams
(replication links) or of a thread. A long-lived task started from inside such a block is
started in `background()` so that it does not inherit the block's fields.

A request id comes from the caller's REQUEST_ID_HEADER when it is a valid one, else a new one
is made; the forwarder sends it on (calls.Call.outgoing), so the lines of one forwarded call on
every node it crossed share the id. A header that is too long or holds other characters than
REQUEST_ID_CHARS is ignored, not refused: the id only labels log lines.

`JsonFormatter` writes one JSON object per record (docs/logging.md); `configure` installs it,
or the plain text format, on the root logger.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from types import MappingProxyType, TracebackType
from typing import Any

from raftlog.base import limits

REQUEST_ID_HEADER = "raftlog-request-id"
REQUEST_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The per-call fields, in the order a JSON line lists them.
CALL_FIELDS = ("request_id", "method", "stream", "consumer", "epoch")
_NO_FIELDS: Mapping[str, str | int] = MappingProxyType({})
_fields: ContextVar[Mapping[str, str | int]] = ContextVar("raftlog_log_fields", default=_NO_FIELDS)
# Set on records that must not take the fields of whatever call is running when they are
# written (log_limit's summaries, written later and for many calls).
NO_CALL_FIELDS_ATTR = "raftlog_repeat_summary"


def new_request_id() -> str:
    return uuid.uuid4().hex


def valid_request_id(text: str) -> bool:
    return 0 < len(text) <= limits.request_id_bytes_max and set(text) <= REQUEST_ID_CHARS


def incoming_request_id(metadata: Any) -> str:
    """The caller's request id from gRPC invocation metadata when valid, else a new one."""
    for key, value in metadata or ():
        if key == REQUEST_ID_HEADER:
            text = value if isinstance(value, str) else bytes(value).decode("ascii", "replace")
            if valid_request_id(text):
                return text
    return new_request_id()


def request_id() -> str | None:
    """The id of the call running in this context (None: none, e.g. a background task)."""
    value = _fields.get().get("request_id")
    return None if value is None else str(value)


def current() -> Mapping[str, str | int]:
    return _fields.get()


def request_fields(request: Any) -> dict[str, str | int]:
    """`stream`, `consumer` and `epoch` of a canonical request, where it has them set."""
    found: dict[str, str | int] = {}
    for name in ("stream", "consumer"):
        value = getattr(request, name, None)
        if isinstance(value, str) and value:
            found[name] = value
    epoch = getattr(request, "epoch", None)
    if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch:
        found["epoch"] = epoch
    return found


def enter(**fields: str | int) -> Token[Mapping[str, str | int]]:
    """Adds `fields` to this context's; undo with `leave(token)`."""
    return _fields.set({**_fields.get(), **fields})


def leave(token: Token[Mapping[str, str | int]]) -> None:
    """Undoes `enter`. A token from another context (an async generator closed by the
    garbage collector elsewhere) is dropped: that context ends with its call anyway."""
    with contextlib.suppress(ValueError):
        _fields.reset(token)


def fields(**values: str | int | None) -> dict[str, str | int]:
    """An `extra=` mapping for one log call from code that runs outside any call: a loop that
    serves many streams in one task, or a thread (group commit), where `bind` would not fit.
    Only CALL_FIELDS are taken; a None or empty value is left out.

        log.warning("stream %s: ...", name, extra=logctx.fields(stream=name, epoch=epoch))
    """
    unknown = set(values) - set(CALL_FIELDS)
    if unknown:
        raise ValueError(f"not a log field: {sorted(unknown)}")
    return {name: value for name, value in values.items() if value is not None and value != ""}


def background() -> contextvars.Context:
    """A context without call fields, for `create_task(..., context=...)` of a loop that
    outlives the block that starts it (a replication link started while one stream is being
    reconciled must not carry that stream on every line it writes)."""
    context = contextvars.copy_context()
    context.run(_fields.set, _NO_FIELDS)
    return context


@contextlib.contextmanager
def bind(**fields: str | int) -> Iterator[None]:
    """Log lines written inside the block carry `fields` too."""
    token = enter(**fields)
    try:
        yield
    finally:
        leave(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message, node, the call fields that are
    known (from the context, or from the record: `extra={"stream": ...}` wins), and exc / stack
    with the traceback text."""

    def __init__(self, *, node: str) -> None:
        super().__init__()
        self._node = node

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": _iso_utc_ms(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "node": self._node,
        }
        fields = {} if getattr(record, NO_CALL_FIELDS_ATTR, False) else _fields.get()
        for name in CALL_FIELDS:
            value = getattr(record, name, None)
            if value is None:
                value = fields.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def _iso_utc_ms(created_s: float) -> str:
    """1764030000.1234 -> 2025-11-25T00:20:00.123Z"""
    stamp = datetime.fromtimestamp(created_s, UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


def configure(*, log_format: str, level: str, node: str) -> None:
    """Sets up the root logger on stderr: `text` exactly as the node always wrote, or `json`
    (JsonFormatter), where warnings and uncaught exceptions become JSON lines too."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter(node=node))
    logging.basicConfig(level=level.upper(), format=TEXT_FORMAT, handlers=[handler])
    if log_format != "json":
        return
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread


def _log_uncaught(kind: type[BaseException], exc: BaseException,
                  traceback: TracebackType | None) -> None:
    logging.getLogger("raftlog").critical("uncaught exception", exc_info=(kind, exc, traceback))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None or args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("raftlog").critical(
        "uncaught exception in thread %s", name,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback))
