"""The HTTP/1.1 side of the bundled Toxiproxy: a small request reader and response writer on
asyncio streams, and the route table of Toxiproxy's REST API (api.py does the work).

Supports what curl and `requests` send: Content-Length or chunked bodies, `Expect:
100-continue`, keep-alive. Every read, body and wait is bounded. As Toxiproxy does, requests
whose User-Agent starts with "Mozilla/" are refused (403), so a web page cannot drive the API
from a browser.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http
import json
import logging
import random
from collections.abc import Awaitable, Callable
from urllib.parse import unquote, urlsplit

from .api import Reply, Toxiproxy, version
from .model import ApiError, Json, decode_body

header_bytes_max = 64 * 1024  # request line + headers
body_bytes_max = 4 * 1024 * 1024  # a populate body of a few thousand proxies fits
request_wait_s_max = 60.0  # from the end of one request (or the connect) to the next one read
handler_s_max = 25.0  # one operation (Toxiproxy's TimeoutHandler); then 503, op goes on
server_close_s_max = 5.0
api_connections_max = 256  # open API connections; one more is answered 503 and closed

log = logging.getLogger(__name__)


class HttpError(Exception):
    """A request that cannot be read; answered with `status` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    path: str
    version: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes

    @property
    def keep_alive(self) -> bool:
        tokens = {token.strip().lower() for token in self.headers.get("connection", "").split(",")}
        if self.version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens


@dataclasses.dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"

    def encode(self, *, keep_alive: bool) -> bytes:
        phrase = http.HTTPStatus(self.status).phrase
        lines = [f"HTTP/1.1 {self.status} {phrase}"]
        if self.status != 204:
            lines += [f"Content-Type: {self.content_type}", f"Content-Length: {len(self.body)}"]
        lines.append(f"Connection: {'keep-alive' if keep_alive else 'close'}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


async def read_request(reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> Request | None:
    """The next request on a connection; None when the client closed it between requests."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise HttpError(400, "incomplete request") from None
    except asyncio.LimitOverrunError:
        raise HttpError(431, "request header fields too large") from None
    lines = head.decode("latin-1").split("\r\n")
    method, target, version = _request_line(lines[0])
    headers = _headers(lines[1:])
    body = await _body(reader, writer, headers, version)
    path = urlsplit(target).path or "/"
    return Request(method=method, path=path, version=version, headers=headers, body=body)


def _request_line(line: str) -> tuple[str, str, str]:
    parts = line.split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.0", "HTTP/1.1") or not parts[0].isalpha():
        raise HttpError(400, "malformed request line")
    return parts[0].upper(), parts[1], parts[2]


def _headers(lines: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, "malformed header")
        key = name.lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    return headers


async def _body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                headers: dict[str, str], version: str) -> bytes:
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    length_text = headers.get("content-length")
    if chunked and length_text is not None:
        raise HttpError(400, "both Content-Length and chunked")
    if not chunked and length_text is None:
        return b""
    if version == "HTTP/1.1" and headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    if chunked:
        return await _chunked_body(reader)
    if not length_text or not length_text.isdigit():
        raise HttpError(400, "bad Content-Length")
    length = int(length_text)
    if length > body_bytes_max:
        raise HttpError(413, "request body too large")
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise HttpError(400, "incomplete body") from None


async def _chunked_body(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    try:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size_text = size_line.split(b";")[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HttpError(400, "bad chunk size") from None
            if len(body) + size > body_bytes_max:
                raise HttpError(413, "request body too large")
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
                return bytes(body)
            body += await reader.readexactly(size)
            if await reader.readexactly(2) != b"\r\n":
                raise HttpError(400, "bad chunk")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        raise HttpError(400, "incomplete body") from None


def json_response(status: int, body: Json) -> Response:
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return Response(status, text.encode())


def error_response(error: ApiError) -> Response:
    return Response(error.status, (json.dumps(error.body()) + "\n").encode())


def text_response(status: int, text: str) -> Response:
    return Response(status, (text + "\n").encode(), "text/plain; charset=utf-8")


Operation = Callable[[], Awaitable[Reply]]


class ApiServer:
    """Serves `toxiproxy`'s REST API over HTTP/1.1 on one listening socket."""

    def __init__(self, toxiproxy: Toxiproxy) -> None:
        self.toxiproxy = toxiproxy
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.address: tuple[str, int] = ("", 0)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on host:port (0: any free port); the address bound."""
        self._server = await asyncio.start_server(self._serve, host, port,
                                                  limit=header_bytes_max)
        sockname = self._server.sockets[0].getsockname()
        self.address = (str(sockname[0]), int(sockname[1]))
        return self.address

    async def close(self) -> None:
        """Stop listening, end every API connection, stop every proxy."""
        if self._server is not None:
            self._server.close()
            for task in list(self._handlers):
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), server_close_s_max)
            self._server = None
        await self.toxiproxy.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            if len(self._handlers) > api_connections_max:
                writer.write(text_response(503, "too many connections").encode(keep_alive=False))
                await writer.drain()
                return
            await self._serve_requests(reader, writer)
        except (OSError, TimeoutError):
            pass
        except asyncio.CancelledError:
            # Only close() cancels a handler; Python 3.11's streams log a cancelled handler
            # task as an error, so it ends normally instead.
            pass
        finally:
            if task is not None:
                self._handlers.discard(task)
            writer.close()

    async def _serve_requests(self, reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                request = await asyncio.wait_for(read_request(reader, writer),
                                                 request_wait_s_max)
            except HttpError as error:
                writer.write(text_response(error.status, str(error)).encode(keep_alive=False))
                await writer.drain()
                return
            if request is None:
                return
            response = await self._respond(request)
            keep_alive = request.keep_alive
            writer.write(response.encode(keep_alive=keep_alive))
            await writer.drain()
            if not keep_alive:
                return

    async def _respond(self, request: Request) -> Response:
        if request.headers.get("user-agent", "").startswith("Mozilla/"):
            return text_response(403, "User agent not allowed")
        operation = self._route(request)
        if isinstance(operation, Response):
            return operation
        try:
            work = asyncio.ensure_future(operation())
            reply = await asyncio.wait_for(asyncio.shield(work), handler_s_max)
        except ApiError as error:
            return error_response(error)
        except TimeoutError:
            return Response(503, b"", "text/plain; charset=utf-8")
        except Exception:
            log.exception("toxiproxy: %s %s failed", request.method, request.path)
            return error_response(ApiError(500, "internal error"))
        if reply.body is None:
            return Response(reply.status)
        return json_response(reply.status, reply.body)

    def _route(self, request: Request) -> Operation | Response:
        """The operation for a request, or the answer when there is none (404, 405)."""
        api = self.toxiproxy
        segments = [unquote(part) for part in request.path.split("/")[1:]]
        if any(not segment for segment in segments):
            return text_response(404, "404 page not found")
        routes: dict[str, Operation | Response]
        match segments:
            case ["version"]:
                routes = {"GET": version_response()}
            case ["reset"]:
                routes = {"POST": api.reset}
            case ["proxies"]:
                routes = {"GET": api.list_proxies,
                          "POST": lambda: api.create_proxy(decode_body(request.body))}
            case ["populate"]:
                routes = {"POST": lambda: api.populate(decode_body(request.body))}
            case ["proxies", name]:
                update_proxy = lambda: api.update_proxy(name, decode_body(request.body))  # noqa: E731
                routes = {"GET": lambda: api.show_proxy(name), "POST": update_proxy,
                          "PATCH": update_proxy, "DELETE": lambda: api.delete_proxy(name)}
            case ["proxies", name, "toxics"]:
                routes = {"GET": lambda: api.list_toxics(name),
                          "POST": lambda: api.create_toxic(name, decode_body(request.body))}
            case ["proxies", name, "toxics", toxic]:
                update_toxic = lambda: api.update_toxic(  # noqa: E731
                    name, toxic, decode_body(request.body))
                routes = {"GET": lambda: api.show_toxic(name, toxic), "POST": update_toxic,
                          "PATCH": update_toxic, "DELETE": lambda: api.delete_toxic(name, toxic)}
            case _:
                return text_response(404, "404 page not found")
        return routes.get(request.method, Response(405, b"", "text/plain; charset=utf-8"))


def version_response() -> Response:
    """Toxiproxy's /version body, byte for byte in shape: `{"version": "..."}` and a newline."""
    body = json.dumps({"version": version}) + "\n"
    return Response(200, body.encode(), "application/json;charset=utf-8")


async def start_server(host: str = "127.0.0.1", port: int = 8474, *,
                       seed: int | None = None) -> ApiServer:
    """A bundled Toxiproxy serving on host:port (0: any free port, see `.address`); toxicity
    draws and jitter come from a generator seeded with `seed` (None: from the OS)."""
    server = ApiServer(Toxiproxy(rng=random.Random(seed)))
    await server.start(host, port)
    return server
