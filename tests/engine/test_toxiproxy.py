"""chaos/toxiproxy: the bundled Toxiproxy, driven as the chaos harness drives it.

Each test starts the server in-process on an ephemeral loopback port, puts small TCP servers
behind its proxies, and drives it through the toxiproxy-python client (blocking, so it runs in a
thread) or, for what the client does not expose, through plain HTTP. Every toxic is checked by
what a client of the proxy measures: time, bytes, EOF, RST.
"""

from __future__ import annotations

import asyncio
import errno
import http.client
import json
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from raftlog.chaos.nodeproc import free_port
from raftlog.chaos.toxiproxy import ApiServer, start_server, start_toxiproxy
from raftlog.chaos.toxiproxy.link import replan
from raftlog.chaos.toxiproxy.stage import Chunk, End, EndKind, Item
from raftlog.chaos.toxiproxy.toxics import slice_sizes

test_timeout_s = 30.0
io_s_max = 5.0  # any single read, connect or API call in these tests
fast_s_max = 0.25  # a loopback round trip with no toxic in the way stays under this
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def run(case: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(case(), test_timeout_s))


# --- fixtures: upstream servers, the Toxiproxy under test, client sockets --------------------

class Upstream:
    """A loopback TCP server running `handler` per connection; keeps the errors it saw."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.errors: list[BaseException] = []
        self.received: list[bytes] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def __aenter__(self) -> Upstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._writers.append(writer)
        try:
            await self.handler(reader, writer)
        except OSError as exc:
            self.errors.append(exc)
        except asyncio.CancelledError:
            pass
        finally:
            writer.close()


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()


def sends(payload: bytes, *, then_close: bool = True) -> Handler:
    """A handler that sends `payload` at once, then closes (or waits for the client's EOF)."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(payload)
        await writer.drain()
        if not then_close:
            await reader.read()
    return handler


@dataclass
class Harness:
    server: ApiServer
    client: Any  # toxiproxy.Toxiproxy (untyped)
    port: int
    upstreams: list[Upstream] = field(default_factory=list)

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A blocking toxiproxy-python call, off the event loop."""
        return await asyncio.wait_for(asyncio.to_thread(fn, *args, **kwargs), io_s_max)

    async def http(self, method: str, path: str, body: object = None, *,
                   raw: bytes | None = None,
                   headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """Status and decoded body (JSON when it parses, else text) of one plain request."""
        def request() -> tuple[int, Any]:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=io_s_max)
            try:
                data = raw if raw is not None else (
                    None if body is None else json.dumps(body).encode())
                connection.request(method, path, body=data, headers=headers or {})
                response = connection.getresponse()
                text = response.read().decode()
            finally:
                connection.close()
            try:
                return response.status, json.loads(text)
            except json.JSONDecodeError:
                return response.status, text
        return await asyncio.wait_for(asyncio.to_thread(request), io_s_max)

    async def upstream(self, handler: Handler) -> Upstream:
        upstream = await Upstream(handler).__aenter__()
        self.upstreams.append(upstream)
        return upstream

    async def proxy(self, name: str, upstream: Upstream, **kwargs: Any) -> Any:
        return await self.call(self.client.create, upstream=upstream.address, name=name,
                               listen="127.0.0.1:0", **kwargs)

    async def add_toxic(self, proxy: Any, **kwargs: Any) -> None:
        await self.call(proxy.add_toxic, **kwargs)

    def connections(self, name: str) -> int:
        return self.server.toxiproxy.proxies[name].connection_count


@asynccontextmanager
async def toxiproxy() -> AsyncIterator[Harness]:
    server = await start_server("127.0.0.1", 0, seed=1234)
    client = Toxiproxy()
    client.update_api_consumer("127.0.0.1", server.address[1])
    harness = Harness(server=server, client=client, port=server.address[1])
    try:
        yield harness
    finally:
        await server.close()
        for upstream in harness.upstreams:
            await upstream.__aexit__()


def split(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host, int(port)


@asynccontextmanager
async def connected(listen: str) -> AsyncIterator[tuple[asyncio.StreamReader,
                                                        asyncio.StreamWriter]]:
    host, port = split(listen)
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), io_s_max)
    try:
        yield reader, writer
    finally:
        writer.transport.abort()


async def round_trip_s(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       payload: bytes = b"ping") -> float:
    started = time.monotonic()
    writer.write(payload)
    await writer.drain()
    got = await asyncio.wait_for(reader.readexactly(len(payload)), io_s_max)
    assert got == payload
    return time.monotonic() - started


async def read_to_eof(reader: asyncio.StreamReader, *, timeout_s: float = io_s_max) -> bytes:
    return await asyncio.wait_for(reader.read(), timeout_s)


async def eventually(predicate: Callable[[], bool], *, timeout_s: float = io_s_max) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


# --- the REST API through the client -------------------------------------------------------

def test_version_and_running_answer() -> None:
    run(_version_and_running_answer)


async def _version_and_running_answer() -> None:
    async with toxiproxy() as tp:
        assert await tp.call(tp.client.running) is True
        version = json.loads(await tp.call(tp.client.version))
        assert version["version"].startswith("2.")
        assert await tp.http("GET", "/version") == (200, version)


def test_a_proxy_is_created_listed_found_and_destroyed() -> None:
    run(_a_proxy_is_created_listed_found_and_destroyed)


async def _a_proxy_is_created_listed_found_and_destroyed() -> None:
    async with toxiproxy() as tp:
        upstream = await tp.upstream(echo)
        proxy = await tp.proxy("db", upstream)
        host, port = split(proxy.listen)
        assert (host, proxy.upstream, proxy.enabled) == ("127.0.0.1", upstream.address, True)
        assert port != 0
        listed = await tp.call(tp.client.proxies)
        assert set(listed) == {"db"} and listed["db"].listen == proxy.listen
        assert (await tp.call(tp.client.get_proxy, "db")).upstream == upstream.address
        assert await tp.call(tp.client.get_proxy, "nope") is None
        assert await tp.http("GET", "/proxies/db") == (200, {
            "name": "db", "listen": proxy.listen, "upstream": upstream.address,
            "enabled": True, "toxics": []})
        async with connected(proxy.listen) as (reader, writer):
            assert await round_trip_s(reader, writer) < fast_s_max
        assert await tp.call(proxy.destroy) is True
        assert await tp.call(tp.client.proxies) == {}
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(host, port)
        await tp.proxy("a", upstream)
        await tp.proxy("b", upstream)
        await tp.call(tp.client.destroy_all)
        assert await tp.call(tp.client.proxies) == {}


def test_a_proxy_created_disabled_does_not_listen_until_enabled() -> None:
    run(_a_proxy_created_disabled_does_not_listen_until_enabled)


async def _a_proxy_created_disabled_does_not_listen_until_enabled() -> None:
    async with toxiproxy() as tp:
        upstream = await tp.upstream(echo)
        listen = f"127.0.0.1:{free_port()}"
        proxy = await tp.call(tp.client.create, upstream=upstream.address, name="off",
                              listen=listen, enabled=False)
        assert (proxy.enabled, proxy.listen) == (False, listen)
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(*split(listen))
        await tp.call(proxy.enable)
        async with connected(listen) as (reader, writer):
            assert await round_trip_s(reader, writer) < fast_s_max


def test_status_codes_and_error_shape_follow_toxiproxy() -> None:
    run(_status_codes_and_error_shape_follow_toxiproxy)


async def _status_codes_and_error_shape_follow_toxiproxy() -> None:
    async with toxiproxy() as tp:
        upstream = await tp.upstream(echo)
        proxy = await tp.proxy("p", upstream)
        body = {"name": "p", "upstream": upstream.address, "listen": "127.0.0.1:0"}
        assert await tp.http("POST", "/proxies", body) == (
            409, {"error": "proxy already exists", "status": 409})
        assert await tp.http("POST", "/proxies", {"name": "q"}) == (
            400, {"error": "missing required field: upstream", "status": 400})
        assert (await tp.http("POST", "/proxies", raw=b"{nope"))[0] == 400
        assert (await tp.http("POST", "/proxies", {**body, "name": "q",
                                                   "listen": "no-port"}))[0] == 400
        assert (await tp.http("POST", "/proxies", {**body, "name": "q",
                                                   "enabled": "yes"}))[0] == 400
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            taken = f"127.0.0.1:{busy.getsockname()[1]}"
            status, error = await tp.http("POST", "/proxies", {**body, "name": "q",
                                                               "listen": taken})
            assert status == 500 and error["status"] == 500
        not_found = {"error": "proxy not found", "status": 404}
        for method in ("GET", "POST", "DELETE"):
            assert await tp.http(method, "/proxies/missing", {}) == (404, not_found)
        assert await tp.http("GET", "/proxies/missing/toxics") == (404, not_found)
        toxic_not_found = {"error": "toxic not found", "status": 404}
        for method in ("GET", "POST", "DELETE"):
            assert await tp.http(method, "/proxies/p/toxics/missing", {}) == (
                404, toxic_not_found)
        latency = {"type": "latency", "attributes": {"latency": 1}}
        assert (await tp.http("POST", "/proxies/p/toxics", latency))[0] == 200
        assert await tp.http("POST", "/proxies/p/toxics", latency) == (
            409, {"error": "toxic already exists", "status": 409})
        assert await tp.http("POST", "/proxies/p/toxics", {"type": "flood"}) == (
            400, {"error": "invalid toxic type", "status": 400})
        assert (await tp.http("POST", "/proxies/p/toxics",
                              {"type": "latency", "stream": "sideways"}))[0] == 400
        assert (await tp.http("POST", "/proxies/p/toxics",
                              {"type": "latency", "name": "l2",
                               "attributes": {"latency": "slow"}}))[0] == 400
        assert (await tp.http("POST", "/proxies/p/toxics",
                              {"type": "latency", "name": "l3", "toxicity": 1.5}))[0] == 400
        assert (await tp.http("POST", "/proxies/p/toxics",
                              {"type": "slicer", "name": "s"}))[0] == 400
        assert (await tp.http("GET", "/nowhere"))[0] == 404
        assert (await tp.http("PUT", "/proxies"))[0] == 405
        assert (await tp.http("GET", "/proxies",
                              headers={"User-Agent": "Mozilla/5.0"}))[0] == 403
        # The same refusals, as the client reports them.
        with pytest.raises(ProxyExists):
            await tp.call(proxy.add_toxic, type="latency", attributes={"latency": 1})
        with pytest.raises(InvalidToxic):
            await tp.call(proxy.add_toxic, type="flood")
        with pytest.raises(NotFound):
            await tp.call(proxy.destroy_toxic, "missing")
        with pytest.raises(ProxyExists):  # the client checks the name before it posts
            await tp.proxy("p", upstream)
        await tp.call(proxy.destroy)
        with pytest.raises(NotFound):
            await tp.call(proxy.toxics)


def test_toxics_are_listed_shown_updated_and_deleted() -> None:
    run(_toxics_are_listed_shown_updated_and_deleted)


async def _toxics_are_listed_shown_updated_and_deleted() -> None:
    async with toxiproxy() as tp:
        upstream = await tp.upstream(echo)
        proxy = await tp.proxy("p", upstream)
        async with connected(proxy.listen) as (reader, writer):
            await tp.add_toxic(proxy, type="latency", attributes={"latency": 300})
            await tp.add_toxic(proxy, type="bandwidth", stream="upstream", toxicity=0.5,
                               attributes={"rate": 1000})
            toxics = await tp.call(proxy.toxics)
            assert set(toxics) == {"latency_downstream", "bandwidth_upstream"}
            latency = toxics["latency_downstream"]
            assert (latency.type, latency.stream, latency.toxicity) == (
                "latency", "downstream", 1.0)
            assert latency.attributes == {"latency": 300, "jitter": 0}
            assert (await tp.call(proxy.get_toxic, "bandwidth_upstream")).toxicity == 0.5
            assert await tp.call(proxy.get_toxic, "missing") is None
            assert await tp.http("GET", "/proxies/p/toxics") == (200, [
                {"attributes": {"rate": 1000}, "name": "bandwidth_upstream",
                 "type": "bandwidth", "stream": "upstream", "toxicity": 0.5},
                {"attributes": {"latency": 300, "jitter": 0}, "name": "latency_downstream",
                 "type": "latency", "stream": "downstream", "toxicity": 1.0}])
            assert (await tp.http("GET", "/proxies/p"))[1]["toxics"][1]["name"] == (
                "latency_downstream")
            assert await round_trip_s(reader, writer) >= 0.3
            # An update keeps the other attributes and acts on the open connection.
            status, updated = await tp.http("POST", "/proxies/p/toxics/latency_downstream",
                                            {"attributes": {"jitter": 5}})
            assert status == 200 and updated["attributes"] == {"latency": 300, "jitter": 5}
            status, updated = await tp.http("PATCH", "/proxies/p/toxics/latency_downstream",
                                            {"attributes": {"latency": 0, "jitter": 0},
                                             "toxicity": 0.25})
            assert status == 200 and updated["toxicity"] == 0.25
            assert await tp.http("GET", "/proxies/p/toxics/latency_downstream") == (
                200, updated)
            assert await round_trip_s(reader, writer) < fast_s_max
            assert await tp.call(proxy.destroy_toxic, "latency_downstream") is True
            assert set(await tp.call(proxy.toxics)) == {"bandwidth_upstream"}


def test_reset_enables_every_proxy_and_removes_every_toxic() -> None:
    run(_reset_enables_every_proxy_and_removes_every_toxic)


async def _reset_enables_every_proxy_and_removes_every_toxic() -> None:
    async with toxiproxy() as tp:
        upstream = await tp.upstream(echo)
        slow = await tp.proxy("slow", upstream)
        down = await tp.proxy("down", upstream)
        await tp.add_toxic(slow, type="latency", attributes={"latency": 500})
        await tp.add_toxic(slow, type="timeout", stream="upstream")
        await tp.call(down.disable)
        assert (await tp.call(tp.client.get_proxy, "down")).enabled is False
        assert await tp.call(tp.client.reset) is True
        proxies = await tp.call(tp.client.proxies)
        assert all(proxy.enabled for proxy in proxies.values())
        assert await tp.call(slow.toxics) == {}
        for proxy in (slow, down):
            async with connected(proxy.listen) as (reader, writer):
                assert await round_trip_s(reader, writer) < fast_s_max


def test_populate_creates_replaces_and_leaves_matching_proxies_alone() -> None:
    run(_populate_creates_replaces_and_leaves_matching_proxies_alone)


async def _populate_creates_replaces_and_leaves_matching_proxies_alone() -> None:
    async with toxiproxy() as tp:
        first = await tp.upstream(echo)
        second = await tp.upstream(sends(b"second"))
        wanted = [{"name": "a", "upstream": first.address, "listen": "127.0.0.1:0"},
                  {"name": "b", "upstream": first.address, "listen": "127.0.0.1:0",
                   "enabled": False}]
        status, body = await tp.http("POST", "/populate", wanted)
        assert status == 201
        assert [(p["name"], p["enabled"]) for p in body["proxies"]] == [
            ("a", True), ("b", False)]
        listen_a = body["proxies"][0]["listen"]
        assert (await tp.http("POST", "/proxies/a/toxics", {"type": "latency"}))[0] == 200
        again = [{"name": "a", "upstream": first.address, "listen": listen_a},
                 {"name": "b", "upstream": second.address, "listen": "127.0.0.1:0"}]
        status, body = await tp.http("POST", "/populate", again)
        assert status == 201
        kept, replaced = body["proxies"]
        assert (kept["listen"], len(kept["toxics"])) == (listen_a, 1)
        assert (replaced["upstream"], replaced["enabled"]) == (second.address, True)
        async with connected(replaced["listen"]) as (reader, _writer):
            assert await read_to_eof(reader) == b"second"
        assert await tp.http("POST", "/populate", [{"upstream": first.address}]) == (
            400, {"error": "missing required field: name at proxy 1", "status": 400,
                  "proxies": []})
        assert (await tp.http("POST", "/populate", {"name": "x"}))[0] == 400
        # The client's own populate (it creates through /proxies) sees the same proxies.
        created = await tp.call(tp.client.populate, [
            {"name": "a", "upstream": first.address, "listen": listen_a},
            {"name": "c", "upstream": first.address, "listen": "127.0.0.1:0"}])
        assert [proxy.name for proxy in created] == ["c"]


def test_an_update_moves_the_proxy_to_a_new_listen_or_upstream() -> None:
    run(_an_update_moves_the_proxy_to_a_new_listen_or_upstream)


async def _an_update_moves_the_proxy_to_a_new_listen_or_upstream() -> None:
    async with toxiproxy() as tp:
        old = await tp.upstream(sends(b"old"))
        new = await tp.upstream(sends(b"new"))
        proxy = await tp.proxy("p", old)
        status, body = await tp.http("POST", "/proxies/p", {"upstream": new.address})
        assert status == 200 and body["upstream"] == new.address and body["enabled"]
        async with connected(body["listen"]) as (reader, _writer):
            assert await read_to_eof(reader) == b"new"
        listen = f"127.0.0.1:{free_port()}"
        status, body = await tp.http("PATCH", "/proxies/p", {"listen": listen})
        assert (status, body["listen"]) == (200, listen)
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(*split(proxy.listen))
        async with connected(listen) as (reader, _writer):
            assert await read_to_eof(reader) == b"new"


def test_disabling_drops_connections_and_stops_listening() -> None:
    run(_disabling_drops_connections_and_stops_listening)


async def _disabling_drops_connections_and_stops_listening() -> None:
    async with toxiproxy() as tp:
        upstream = await tp.upstream(echo)
        proxy = await tp.proxy("p", upstream)
        async with connected(proxy.listen) as (reader, writer):
            assert await round_trip_s(reader, writer) < fast_s_max
            await tp.call(proxy.disable)
            assert await read_to_eof(reader, timeout_s=2.0) == b""
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(*split(proxy.listen))
        assert tp.connections("p") == 0
        await tp.call(proxy.enable)
        async with connected(proxy.listen) as (reader, writer):
            assert await round_trip_s(reader, writer) < fast_s_max

        def down_then_check() -> bool:
            with proxy.down(), socket.socket() as probe:
                probe.settimeout(io_s_max)
                return probe.connect_ex(split(proxy.listen)) != 0
        assert await tp.call(down_then_check) is True
        assert (await tp.call(tp.client.get_proxy, "p")).enabled is True


# --- traffic without toxics ----------------------------------------------------------------

def test_five_megabytes_each_way_arrive_byte_exact() -> None:
    run(_five_megabytes_each_way_arrive_byte_exact)


async def _five_megabytes_each_way_arrive_byte_exact() -> None:
    size_bytes = 5 * 1024 * 1024
    to_server, to_client = os.urandom(size_bytes), os.urandom(size_bytes)

    async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def send() -> None:
            writer.write(to_client)
            await writer.drain()
        sending = asyncio.create_task(send())
        upstream.received.append(await reader.read(-1))
        await sending

    async with toxiproxy() as tp:
        upstream = await tp.upstream(exchange)
        proxy = await tp.proxy("bulk", upstream)
        async with connected(proxy.listen) as (reader, writer):
            async def send() -> None:
                for offset in range(0, size_bytes, 100_000):
                    writer.write(to_server[offset:offset + 100_000])
                    await writer.drain()
                writer.write_eof()
            sending = asyncio.create_task(send())
            received = await read_to_eof(reader, timeout_s=20.0)
            await sending
        assert received == to_client
        await eventually(lambda: len(upstream.received) == 1)
        assert upstream.received[0] == to_server


def test_a_half_close_is_passed_on_and_the_other_direction_goes_on() -> None:
    run(_a_half_close_is_passed_on_and_the_other_direction_goes_on)


async def _a_half_close_is_passed_on_and_the_other_direction_goes_on() -> None:
    async def answer_after_eof(reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter) -> None:
        request = await reader.read(-1)
        writer.write(b"got %d bytes" % len(request))
        await writer.drain()

    async with toxiproxy() as tp:
        upstream = await tp.upstream(answer_after_eof)
        proxy = await tp.proxy("p", upstream)
        async with connected(proxy.listen) as (reader, writer):
            writer.write(b"x" * 1000)
            writer.write_eof()
            assert await read_to_eof(reader) == b"got 1000 bytes"
        await eventually(lambda: tp.connections("p") == 0)


def test_a_client_is_closed_when_the_upstream_cannot_be_reached() -> None:
    run(_a_client_is_closed_when_the_upstream_cannot_be_reached)


async def _a_client_is_closed_when_the_upstream_cannot_be_reached() -> None:
    async with toxiproxy() as tp:
        proxy = await tp.call(tp.client.create, upstream=f"127.0.0.1:{free_port()}",
                              name="nowhere", listen="127.0.0.1:0")
        async with connected(proxy.listen) as (reader, _writer):
            assert await read_to_eof(reader) == b""


def test_grpc_calls_flow_through_and_feel_its_latency() -> None:
    run(_grpc_calls_flow_through_and_feel_its_latency)


async def _grpc_calls_flow_through_and_feel_its_latency() -> None:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with toxiproxy() as tp:
            proxy = await tp.call(tp.client.create, upstream=f"127.0.0.1:{port}",
                                  name="grpc", listen="127.0.0.1:0")
            async with grpc.aio.insecure_channel(proxy.listen) as channel:
                stub: Any = health_pb2_grpc.HealthStub(channel)
                request = health_pb2.HealthCheckRequest(service="")
                replies = await asyncio.gather(*(stub.Check(request, timeout=io_s_max)
                                                 for _ in range(500)))
                assert {reply.status for reply in replies} == {
                    health_pb2.HealthCheckResponse.SERVING}
                await tp.add_toxic(proxy, type="latency", attributes={"latency": 200})
                started = time.monotonic()
                await stub.Check(request, timeout=io_s_max)
                assert time.monotonic() - started >= 0.2
    finally:
        await server.stop(grace=None)


def test_toxics_changing_under_a_running_transfer_lose_and_duplicate_nothing() -> None:
    run(_toxics_changing_under_a_running_transfer_lose_and_duplicate_nothing)


async def _toxics_changing_under_a_running_transfer_lose_and_duplicate_nothing() -> None:
    payload = os.urandom(2 * 1024 * 1024)
    changes = [
        ("POST", "/proxies/p/toxics", {"type": "latency", "attributes": {"latency": 5}}),
        ("POST", "/proxies/p/toxics", {"type": "slicer", "stream": "upstream",
                                       "attributes": {"average_size": 3000,
                                                      "size_variation": 1000}}),
        ("POST", "/proxies/p/toxics", {"type": "bandwidth",
                                       "attributes": {"rate": 20_000}}),
        ("POST", "/proxies/p/toxics/latency_downstream", {"attributes": {"latency": 1}}),
        ("POST", "/proxies/p/toxics", {"type": "slow_close", "stream": "upstream"}),
        ("DELETE", "/proxies/p/toxics/slicer_upstream", None),
        ("POST", "/proxies/p/toxics/bandwidth_downstream", {"attributes": {"rate": 0}}),
        ("DELETE", "/proxies/p/toxics/latency_downstream", None),
        ("POST", "/proxies/p/toxics", {"type": "slicer", "stream": "downstream",
                                       "attributes": {"average_size": 500}}),
        ("DELETE", "/proxies/p/toxics/bandwidth_downstream", None),
        ("DELETE", "/proxies/p/toxics/slow_close_upstream", None),
        ("DELETE", "/proxies/p/toxics/slicer_downstream", None),
    ]
    async with toxiproxy() as tp:
        upstream = await tp.upstream(echo)
        proxy = await tp.proxy("p", upstream)
        async with connected(proxy.listen) as (reader, writer):
            async def send() -> None:
                for offset in range(0, len(payload), 16_384):
                    writer.write(payload[offset:offset + 16_384])
                    await writer.drain()
                    await asyncio.sleep(0.001)
                writer.write_eof()

            async def change() -> None:
                for method, path, body in changes:
                    status, _ = await tp.http(method, path, body)
                    assert status in (200, 204)
                    await asyncio.sleep(0.02)

            sending = asyncio.create_task(send())
            changing = asyncio.create_task(change())
            await asyncio.sleep(0.15)  # back-pressure: every queue of the proxy fills up
            received = await read_to_eof(reader, timeout_s=20.0)
            await sending
            await changing
        assert len(received) == len(payload)
        assert received == payload


# --- each toxic ----------------------------------------------------------------------------

def test_latency_delays_round_trips_on_open_and_new_connections() -> None:
    run(_latency_delays_round_trips_on_open_and_new_connections)


async def _latency_delays_round_trips_on_open_and_new_connections() -> None:
    async with toxiproxy() as tp:
        upstream = await tp.upstream(echo)
        proxy = await tp.proxy("p", upstream)
        async with connected(proxy.listen) as (reader, writer):
            assert await round_trip_s(reader, writer) < fast_s_max
            await tp.add_toxic(proxy, type="latency", attributes={"latency": 300})
            assert 0.3 <= await round_trip_s(reader, writer) < 0.3 + 1.0
            await tp.add_toxic(proxy, type="latency", stream="upstream",
                               attributes={"latency": 200})
            assert await round_trip_s(reader, writer) >= 0.5
            await tp.call(proxy.destroy_toxic, "latency_downstream")
            await tp.call(proxy.destroy_toxic, "latency_upstream")
            assert await round_trip_s(reader, writer) < fast_s_max
        await tp.add_toxic(proxy, type="latency", attributes={"latency": 200, "jitter": 100})
        async with connected(proxy.listen) as (reader, writer):
            for _ in range(3):
                assert 0.1 <= await round_trip_s(reader, writer) < 0.3 + 0.5


def test_latency_delays_each_chunk_without_queueing_them_behind_each_other() -> None:
    run(_latency_delays_each_chunk_without_queueing_them_behind_each_other)


async def _latency_delays_each_chunk_without_queueing_them_behind_each_other() -> None:
    async with toxiproxy() as tp:
        upstream = await tp.upstream(echo)
        proxy = await tp.proxy("p", upstream)
        await tp.add_toxic(proxy, type="latency", attributes={"latency": 300})
        async with connected(proxy.listen) as (reader, writer):
            started = time.monotonic()
            for index in range(10):
                writer.write(b"%d," % index)
                await writer.drain()
                await asyncio.sleep(0.03)
            got = b""
            while len(got) < len(b"0,1,2,3,4,5,6,7,8,9,"):
                got += await asyncio.wait_for(reader.read(100), io_s_max)
            elapsed_s = time.monotonic() - started
        assert got == b"0,1,2,3,4,5,6,7,8,9,"
        assert 0.3 + 0.27 <= elapsed_s < 0.3 + 0.27 + 1.0  # not 10 x 300 ms


def test_bandwidth_limits_the_rate_also_on_an_open_connection() -> None:
    run(_bandwidth_limits_the_rate_also_on_an_open_connection)


async def _bandwidth_limits_the_rate_also_on_an_open_connection() -> None:
    payload = os.urandom(100_000)
    async with toxiproxy() as tp:
        upstream = await tp.upstream(echo)
        proxy = await tp.proxy("p", upstream)
        async with connected(proxy.listen) as (reader, writer):
            assert await round_trip_s(reader, writer, payload) < 0.5
            await tp.add_toxic(proxy, type="bandwidth", attributes={"rate": 100})  # KB/s
            elapsed_s = await round_trip_s(reader, writer, payload)
            assert 0.9 <= elapsed_s < 3.0  # 100 KB at 100 KB/s: 1 s
            await tp.call(proxy.destroy_toxic, "bandwidth_downstream")
            assert await round_trip_s(reader, writer, payload) < 0.5


def test_slow_close_holds_the_close_back() -> None:
    run(_slow_close_holds_the_close_back)


async def _slow_close_holds_the_close_back() -> None:
    async with toxiproxy() as tp:
        upstream = await tp.upstream(sends(b"bye"))
        proxy = await tp.proxy("p", upstream)
        async with connected(proxy.listen) as (reader, _writer):
            started = time.monotonic()
            assert await read_to_eof(reader) == b"bye"
            assert time.monotonic() - started < fast_s_max
        await tp.add_toxic(proxy, type="slow_close", attributes={"delay": 400})
        async with connected(proxy.listen) as (reader, _writer):
            started = time.monotonic()
            assert await asyncio.wait_for(reader.readexactly(3), io_s_max) == b"bye"
            assert time.monotonic() - started < fast_s_max
            assert await read_to_eof(reader) == b""
            assert time.monotonic() - started >= 0.4


def test_timeout_holds_data_until_removed_then_closes() -> None:
    run(_timeout_holds_data_until_removed_then_closes)


async def _timeout_holds_data_until_removed_then_closes() -> None:
    async with toxiproxy() as tp:
        upstream = await tp.upstream(echo)
        proxy = await tp.proxy("p", upstream)
        async with connected(proxy.listen) as (reader, writer):
            assert await round_trip_s(reader, writer) < fast_s_max
            await tp.add_toxic(proxy, type="timeout", stream="upstream",
                               attributes={"timeout": 0})
            writer.write(b"ping")
            await writer.drain()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.read(100), 0.5)
            await tp.call(proxy.destroy_toxic, "timeout_upstream")
            assert await read_to_eof(reader, timeout_s=2.0) == b""
        await tp.add_toxic(proxy, type="timeout", attributes={"timeout": 300})
        async with connected(proxy.listen) as (reader, writer):
            started = time.monotonic()
            writer.write(b"ping")
            await writer.drain()
            assert await read_to_eof(reader) == b""
            assert 0.3 <= time.monotonic() - started < 2.0


def test_reset_peer_resets_both_sides_after_its_timeout() -> None:
    run(_reset_peer_resets_both_sides_after_its_timeout)


async def _reset_peer_resets_both_sides_after_its_timeout() -> None:
    async with toxiproxy() as tp:
        upstream = await tp.upstream(echo)
        proxy = await tp.proxy("p", upstream)
        await tp.add_toxic(proxy, type="reset_peer", attributes={"timeout": 200})
        async with connected(proxy.listen) as (reader, writer):
            started = time.monotonic()
            writer.write(b"ping")
            await writer.drain()
            with pytest.raises(ConnectionResetError) as caught:
                await read_to_eof(reader)
            assert time.monotonic() - started >= 0.2
        assert caught.value.errno in (errno.ECONNRESET, None)
        await eventually(lambda: any(isinstance(error, ConnectionResetError)
                                     for error in upstream.errors))


def test_slicer_delivers_every_byte_in_pieces() -> None:
    run(_slicer_delivers_every_byte_in_pieces)


async def _slicer_delivers_every_byte_in_pieces() -> None:
    payload = os.urandom(4000)
    async with toxiproxy() as tp:
        upstream = await tp.upstream(sends(payload))
        proxy = await tp.proxy("p", upstream)
        await tp.add_toxic(proxy, type="slicer", attributes={
            "average_size": 100, "size_variation": 50, "delay": 5000})  # µs
        async with connected(proxy.listen) as (reader, _writer):
            started = time.monotonic()
            pieces = []
            while piece := await asyncio.wait_for(reader.read(65536), io_s_max):
                pieces.append(piece)
            elapsed_s = time.monotonic() - started
        assert b"".join(pieces) == payload
        assert len(pieces) >= 10
        assert elapsed_s >= 20 * 0.005  # at least 4000 / 150 pieces, 5 ms apart


def test_limit_data_closes_after_the_limit_in_each_direction() -> None:
    run(_limit_data_closes_after_the_limit_in_each_direction)


async def _limit_data_closes_after_the_limit_in_each_direction() -> None:
    async def collect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream.received.append(await reader.read(-1))

    async with toxiproxy() as tp:
        upstream = await tp.upstream(collect)
        source = await tp.upstream(sends(bytes(range(256)) * 4, then_close=False))
        down = await tp.proxy("down", source)
        await tp.add_toxic(down, type="limit_data", attributes={"bytes": 100})
        async with connected(down.listen) as (reader, _writer):
            assert await read_to_eof(reader) == bytes(range(100))
        up = await tp.proxy("up", upstream)
        await tp.add_toxic(up, type="limit_data", stream="upstream",
                           attributes={"bytes": 100})
        async with connected(up.listen) as (reader, writer):
            writer.write(b"a" * 1000)
            await writer.drain()
            assert await read_to_eof(reader) == b""
        await eventually(lambda: upstream.received == [b"a" * 100])


def test_toxicity_zero_never_applies_and_one_always_does() -> None:
    run(_toxicity_zero_never_applies_and_one_always_does)


async def _toxicity_zero_never_applies_and_one_always_does() -> None:
    async def trip(listen: str) -> float:
        async with connected(listen) as (reader, writer):
            return await round_trip_s(reader, writer)

    async with toxiproxy() as tp:
        upstream = await tp.upstream(echo)
        never = await tp.proxy("never", upstream)
        always = await tp.proxy("always", upstream)
        await tp.add_toxic(never, type="latency", toxicity=0.0, attributes={"latency": 2000})
        await tp.add_toxic(always, type="latency", toxicity=1.0, attributes={"latency": 300})
        never_s = await asyncio.gather(*(trip(never.listen) for _ in range(20)))
        always_s = await asyncio.gather(*(trip(always.listen) for _ in range(5)))
        assert max(never_s) < 1.0
        assert min(always_s) >= 0.3


# --- the launcher --------------------------------------------------------------------------

def test_the_launcher_runs_the_bundled_server_in_a_subprocess() -> None:
    port = free_port()
    with start_toxiproxy("127.0.0.1", port, use_binary=False) as handle:
        assert handle.bundled and handle.process.poll() is None
        client = Toxiproxy()
        client.update_api_consumer("127.0.0.1", port)
        assert json.loads(client.version())["version"].startswith("2.")
        assert client.proxies() == {}
    assert handle.process.returncode == 0
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    with pytest.raises(ValueError):
        start_toxiproxy("0.0.0.0", port)


# --- re-planning data in flight (pure) -----------------------------------------------------

def chunk(text: str) -> Chunk:
    return Chunk(text.encode(), 0.0)


def test_replan_keeps_order_and_sends_items_of_a_removed_toxic_to_the_next_one() -> None:
    items: list[tuple[int, Item]] = [(2, chunk("a")), (1, chunk("b")), (0, chunk("c"))]
    assert replan(items, old_names=["x", "y"], new_names=["x"], closing={}) == [
        (1, chunk("a")), (1, chunk("b")), (0, chunk("c"))]
    assert replan(items, old_names=["x", "y"], new_names=["x", "y", "z"], closing={}) == [
        (3, chunk("a")), (1, chunk("b")), (0, chunk("c"))]
    assert replan(items, old_names=["x", "y"], new_names=["y"], closing={}) == [
        (1, chunk("a")), (0, chunk("b")), (0, chunk("c"))]


def test_replan_ends_the_link_where_a_removed_timeout_stood() -> None:
    items: list[tuple[int, Item]] = [(2, chunk("a")), (1, chunk("b")), (0, chunk("c"))]
    assert replan(items, old_names=["x", "t"], new_names=["x"],
                  closing={"t": EndKind.CLOSE}) == [(1, chunk("a")), (1, End(EndKind.CLOSE))]


def test_slice_sizes_cover_the_chunk_within_the_variation() -> None:
    rng = random.Random(5)
    for total in (1, 99, 100, 151, 4000, 65536):
        sizes = slice_sizes(total, average_bytes=100, variation_bytes=50, rng=rng)
        assert sum(sizes) == total
        assert all(0 < size <= 150 for size in sizes)
