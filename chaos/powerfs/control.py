"""The control protocol of a powerfs mount: one JSON object per line over a UNIX stream socket.

A client connects, sends one request line, reads one response line, and closes. Requests:
  {"cmd": "ping"}                                  -> {"ok": true}
  {"cmd": "status"}                                -> {"ok": true, "status": {...}}
  {"cmd": "drop"}                                  -> {"ok": true, "report": {...}}
  {"cmd": "writeback", "seed": 7, "fraction": 0.5} -> {"ok": true, "report": {...}}
  {"cmd": "sync"}                                  -> {"ok": true, "report": {...}}
  {"cmd": "full", "bytes_left": 4096}              -> {"ok": true}
  {"cmd": "eio", "glob": "/db/*.log", "ops": ["read", "write", "fsync"]} -> {"ok": true}
  {"cmd": "ok"}                                    -> {"ok": true}   (clears full and eio)
A request that fails answers {"ok": false, "error": "..."}. Requests are served one at a time,
under the same lock as the file system operations, so a command sees no half-done operation.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

request_bytes_max = 64 * 1024
response_bytes_max = 1024 * 1024
io_timeout_s = 30.0  # a drop of a large tree walks it; anything slower is a hung server
accept_poll_s = 0.2  # how often the server loop notices `stop()`

Handler = Callable[[dict[str, Any]], dict[str, Any]]


class ControlError(Exception):
    """The control socket could not be reached, or the server answered an error."""


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError(f"expected a JSON object, got {type(message).__name__}")
    return message


def _read_line(conn: socket.socket, *, bytes_max: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if chunk.endswith(b"\n"):
            break
        if size > bytes_max:
            raise ValueError(f"message longer than {bytes_max} bytes")
    return b"".join(chunks)


def call(socket_path: str, request: dict[str, Any], *, timeout_s: float = io_timeout_s,
         ) -> dict[str, Any]:
    """Sends one request; returns the response, or raises ControlError."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout_s)
            conn.connect(socket_path)
            conn.sendall(encode(request))
            response = decode(_read_line(conn, bytes_max=response_bytes_max))
    except (OSError, ValueError) as error:
        raise ControlError(f"powerfs control {socket_path}: {error}") from error
    if not response.get("ok"):
        raise ControlError(f"powerfs {request.get('cmd')}: {response.get('error')}")
    return response


class ControlServer:
    """Serves requests on `socket_path` from a daemon thread, one connection at a time."""

    def __init__(self, socket_path: str, handler: Handler) -> None:
        self._path = socket_path
        self._handler = handler
        self._stopping = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self._path)
        sock.listen(8)
        sock.settimeout(accept_poll_s)
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="powerfs-control", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=io_timeout_s)
        if self._sock is not None:
            self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)

    def _serve(self) -> None:
        sock = self._sock
        if sock is None:
            return
        while not self._stopping.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(io_timeout_s)
                try:
                    conn.sendall(encode(self._answer(conn)))
                except OSError as error:
                    log.warning("control connection failed: %s", error)

    def _answer(self, conn: socket.socket) -> dict[str, Any]:
        try:
            request = decode(_read_line(conn, bytes_max=request_bytes_max))
            return {"ok": True, **self._handler(request)}
        except Exception as error:  # every failure goes back to the caller, none kills the loop
            log.warning("control request failed", exc_info=True)
            return {"ok": False, "error": f"{type(error).__name__}: {error}"}
