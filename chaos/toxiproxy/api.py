"""The Toxiproxy REST operations over the set of proxies: every rule about what a request may
do, which status it gets, and what the answer looks like (Shopify Toxiproxy v2, api.go and
proxy_collection.go). Transport-free: server.py maps HTTP requests onto these methods.

Operations run one at a time (one lock), so a request never sees another half done.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable

from . import model
from .model import ApiError, Json, ProxyInput, Stream, ToxicSpec
from .proxy import Proxy

version = "2.12.0+raftlog.1"  # the Toxiproxy API version this server follows, + ours


@dataclasses.dataclass(frozen=True)
class Reply:
    status: int
    body: Json = None  # None: no body (204)


class Toxiproxy:
    """Every proxy of one server, by name."""

    def __init__(self, *, clock: Callable[[], float] | None = None,
                 rng: random.Random | None = None) -> None:
        self._clock = clock or (lambda: asyncio.get_running_loop().time())
        self._rng = rng or random.Random()
        self._proxies: dict[str, Proxy] = {}
        self._lock = asyncio.Lock()

    @property
    def proxies(self) -> dict[str, Proxy]:
        return dict(self._proxies)

    async def close(self) -> None:
        """Stop every proxy (server shutdown)."""
        async with self._lock:
            for proxy in self._proxies.values():
                await proxy.stop()

    async def list_proxies(self) -> Reply:
        return Reply(200, {name: _proxy_json(proxy) for name, proxy in self._proxies.items()})

    async def create_proxy(self, body: object) -> Reply:
        wanted = model.parse_proxy_create(body)
        async with self._lock:
            if wanted.name in self._proxies:
                raise model.proxy_already_exists
            self._check_room()
            proxy = await self._start_new(wanted)
            return Reply(201, _proxy_json(proxy))

    async def populate(self, body: object) -> Reply:
        """Create each proxy, or replace one whose listen or upstream differ; one that matches
        is left as it is (toxics, connections and enabled state included)."""
        try:
            wanted = model.parse_populate(body)
        except ApiError as error:
            return Reply(error.status, {**error.body(), "proxies": []})
        done: list[Proxy] = []
        async with self._lock:
            try:
                for item in wanted:
                    done.append(await self._add_or_replace(item))
            except ApiError as error:
                return Reply(error.status,
                             {**error.body(), "proxies": [_proxy_json(p) for p in done]})
        return Reply(201, {"proxies": [_proxy_json(proxy) for proxy in done]})

    async def show_proxy(self, name: str) -> Reply:
        return Reply(200, _proxy_json(self._proxy(name)))

    async def update_proxy(self, name: str, body: object) -> Reply:
        """New listen/upstream restart the proxy there; `enabled` starts or stops it."""
        async with self._lock:
            proxy = self._proxy(name)
            current = ProxyInput(name=name, listen=proxy.listen, upstream=proxy.upstream,
                                 enabled=proxy.enabled)
            wanted = model.parse_proxy_update(body, current=current)
            if await proxy.differs(listen=wanted.listen, upstream=wanted.upstream):
                await proxy.stop()
                proxy.listen, proxy.upstream = wanted.listen, wanted.upstream
            if wanted.enabled and not proxy.enabled:
                await _start(proxy)
            elif not wanted.enabled:
                await proxy.stop()
            return Reply(200, _proxy_json(proxy))

    async def delete_proxy(self, name: str) -> Reply:
        async with self._lock:
            proxy = self._proxy(name)
            await proxy.stop()
            del self._proxies[name]
            return Reply(204)

    async def list_toxics(self, name: str) -> Reply:
        return Reply(200, [spec.to_json() for spec in self._proxy(name).toxics()])

    async def create_toxic(self, name: str, body: object) -> Reply:
        async with self._lock:
            proxy = self._proxy(name)
            spec = model.parse_toxic_create(body)
            if proxy.find_toxic(spec.name) is not None:
                raise model.toxic_already_exists
            if len(proxy.toxics()) >= model.toxics_per_proxy_max:
                raise model.too_many.detail(f"at most {model.toxics_per_proxy_max} toxics")
            await proxy.set_chain(spec.stream, [*proxy.chains[spec.stream], spec])
            return Reply(200, spec.to_json())

    async def show_toxic(self, name: str, toxic_name: str) -> Reply:
        return Reply(200, self._toxic(self._proxy(name), toxic_name).to_json())

    async def update_toxic(self, name: str, toxic_name: str, body: object) -> Reply:
        async with self._lock:
            proxy = self._proxy(name)
            current = self._toxic(proxy, toxic_name)
            spec = model.parse_toxic_update(body, current=current)
            chain = [spec if item is current else item for item in proxy.chains[spec.stream]]
            await proxy.set_chain(spec.stream, chain)
            return Reply(200, spec.to_json())

    async def delete_toxic(self, name: str, toxic_name: str) -> Reply:
        async with self._lock:
            proxy = self._proxy(name)
            current = self._toxic(proxy, toxic_name)
            chain = [item for item in proxy.chains[current.stream] if item is not current]
            await proxy.set_chain(current.stream, chain)
            return Reply(204)

    async def reset(self) -> Reply:
        """Enable every proxy and remove every toxic."""
        async with self._lock:
            for proxy in self._proxies.values():
                await _start(proxy)
                for stream in Stream:
                    await proxy.set_chain(stream, [])
            return Reply(204)

    def _proxy(self, name: str) -> Proxy:
        proxy = self._proxies.get(name)
        if proxy is None:
            raise model.proxy_not_found
        return proxy

    @staticmethod
    def _toxic(proxy: Proxy, toxic_name: str) -> ToxicSpec:
        spec = proxy.find_toxic(toxic_name)
        if spec is None:
            raise model.toxic_not_found
        return spec

    def _check_room(self) -> None:
        if len(self._proxies) >= model.proxies_max:
            raise model.too_many.detail(f"at most {model.proxies_max} proxies")

    async def _start_new(self, wanted: ProxyInput) -> Proxy:
        proxy = Proxy(name=wanted.name, listen=wanted.listen, upstream=wanted.upstream,
                      clock=self._clock, rng=self._rng)
        if wanted.enabled:
            await _start(proxy)
        self._proxies[wanted.name] = proxy
        return proxy

    async def _add_or_replace(self, wanted: ProxyInput) -> Proxy:
        existing = self._proxies.get(wanted.name)
        if existing is not None:
            if not await existing.differs(listen=wanted.listen, upstream=wanted.upstream):
                return existing
            await existing.stop()  # stays, stopped, if the new one cannot listen (as Toxiproxy)
        else:
            self._check_room()
        return await self._start_new(wanted)


async def _start(proxy: Proxy) -> None:
    try:
        await proxy.start()
    except OSError as exc:
        raise model.listen_failed.detail(f"{proxy.listen}: {exc.strerror or exc}") from None


def _proxy_json(proxy: Proxy) -> dict[str, Json]:
    return model.proxy_json(name=proxy.name, listen=proxy.listen, upstream=proxy.upstream,
                            enabled=proxy.enabled, toxics=proxy.toxics())
