"""A Toxiproxy proxy on every link of a local cluster, so that any partition, one-way cut or
slow link can be made (DESIGN §4).

Links: each client's way to node i (`client_address(i)`), and for every ordered pair of nodes
(a, b) the connections a opens to b's Raft port, peer listener and client port. Node a learns
its proxies through `--dial ADDR=VIA` (`dial_args`): it still knows b by b's own addresses (Raft
names peers by address), and connects through the proxy. pysyncobj opens one connection per
pair (from one side only), so a Raft link is carried by one of the pair's two Raft proxies.

Faults are toxics on proxies (toxiproxy-python): a cut is a `timeout` toxic (data stops; the
connection closes after `cut_close_ms`, and every new one is cut the same way until the toxic
goes), one-way on one direction of the pair's proxies; slow links are `latency`, `bandwidth`,
`slicer`, `reset_peer`, `limit_data`. `heal()` removes every toxic.

`Net` is what the nemeses need of a network; ProxyNet is one, chaos/hosts.py's HostNet (each
node in its own network namespace, faults by packet filter) the other.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from toxiproxy import Toxiproxy  # type: ignore[import-untyped]
from toxiproxy.api import APIConsumer  # type: ignore[import-untyped]
from toxiproxy.exceptions import NotFound  # type: ignore[import-untyped]

from raftlog.node.cli.localcluster import NodeSpec

cut_close_ms = 2_000  # a cut connection is closed this long after the cut, like a TCP timeout
TOXIC_PREFIX = "chaos_"


class LinkKind(enum.Enum):
    RAFT = "raft"
    PEER = "peer"
    GRPC = "grpc"


@dataclass(frozen=True)
class Link:
    """Connections that `source` opens to `target` (0: a client)."""

    source: int
    target: int
    kind: LinkKind

    @property
    def name(self) -> str:
        source = "client" if self.source == 0 else f"n{self.source}"
        return f"{source}-n{self.target}-{self.kind.value}"


class Net(Protocol):
    """The faults a chaos run makes on its network; nodes are numbered from 1, 0 is the
    client. A net that cannot make a fault raises (HostNet: hosts.HostModeUnsupported)."""

    def cut(self, a: int, b: int, *, one_way: bool = False) -> None:
        """Nothing passes between a and b (`one_way`: nothing from a reaches b)."""
        ...

    def partition(self, groups: Sequence[Iterable[int]], *, one_way: bool = False) -> None:
        """Cuts every pair of nodes that are in different groups."""
        ...

    def isolate_client(self, i: int) -> None: ...

    def slow(self, links: Iterable[Link], *, latency_ms: int = 0, jitter_ms: int = 0,
             rate_kbps: int = 0, reset_after_ms: int | None = None,
             slice_bytes: int = 0, limit_bytes: int = 0, toxicity: float = 1.0) -> None: ...

    def heal(self) -> None:
        """Undoes every fault this net made."""
        ...


def _address(spec: NodeSpec, kind: LinkKind) -> str:
    return {LinkKind.RAFT: spec.raft_address, LinkKind.PEER: spec.peer_address,
            LinkKind.GRPC: spec.grpc_address}[kind]


class ProxyNet:
    """The proxies of one cluster on one Toxiproxy server (its API at host:port)."""

    def __init__(self, specs: Sequence[NodeSpec], *, api_host: str, api_port: int) -> None:
        APIConsumer.host = api_host  # toxiproxy-python keeps its server address globally
        APIConsumer.port = api_port
        self._server = Toxiproxy()
        self.specs = {spec.index: spec for spec in specs}
        self.listen: dict[Link, str] = {}
        self._toxics: dict[str, set[str]] = {}  # proxy name -> toxic names added
        self._lock = threading.Lock()  # faults are made and healed from worker threads
        self._serial = itertools.count(1)

    def create(self) -> ProxyNet:
        """One proxy per link (replacing any of the same name)."""
        self._server.destroy_all()
        for link in self.links():
            proxy = self._server.create(upstream=_address(self.specs[link.target], link.kind),
                                        name=link.name, listen="127.0.0.1:0")
            self.listen[link] = str(proxy.listen)
        return self

    def links(self) -> list[Link]:
        nodes = sorted(self.specs)
        pairs = [Link(a, b, kind) for a in nodes for b in nodes if a != b for kind in LinkKind]
        return [Link(0, i, LinkKind.GRPC) for i in nodes] + pairs

    def dial_args(self, spec: NodeSpec) -> list[str]:
        """`raftlog node` flags that send node `spec`'s connections through its proxies."""
        args: list[str] = []
        for link, listen in sorted(self.listen.items(), key=lambda item: item[0].name):
            if link.source == spec.index:
                args += ["--dial", f"{_address(self.specs[link.target], link.kind)}={listen}"]
        return args

    def client_address(self, i: int) -> str:
        return self.listen[Link(0, i, LinkKind.GRPC)]

    # -- faults -----------------------------------------------------------------------------

    def _add(self, link: Link, toxic_type: str, *, stream: str = "downstream",
             toxicity: float = 1.0, **attributes: Any) -> None:
        proxy = self._server.get_proxy(link.name)
        if proxy is None:
            raise KeyError(f"no proxy {link.name}")
        with self._lock:
            name = f"{TOXIC_PREFIX}{toxic_type}_{stream}_{next(self._serial)}"
            proxy.add_toxic(name=name, type=toxic_type, stream=stream, toxicity=toxicity,
                            attributes=attributes)
            self._toxics.setdefault(link.name, set()).add(name)

    def node_links(self, a: int, b: int, kinds: Iterable[LinkKind] = tuple(LinkKind)
                   ) -> list[Link]:
        """The links between nodes a and b, both ways."""
        wanted = tuple(kinds)
        return [Link(x, y, kind) for x, y in ((a, b), (b, a)) for kind in wanted]

    def cut(self, a: int, b: int, *, one_way: bool = False,
            kinds: Iterable[LinkKind] = tuple(LinkKind)) -> None:
        """Nothing passes between a and b (`one_way`: nothing from a reaches b; b's bytes
        still reach a)."""
        for link in self.node_links(a, b, kinds):
            if not one_way:
                self._add(link, "timeout", stream="upstream", timeout=cut_close_ms)
                self._add(link, "timeout", stream="downstream", timeout=cut_close_ms)
            else:
                # bytes from a: upstream on a's own connections, downstream on b's
                stream = "upstream" if link.source == a else "downstream"
                self._add(link, "timeout", stream=stream, timeout=0)

    def partition(self, groups: Sequence[Iterable[int]], *, one_way: bool = False) -> None:
        """Cuts every pair of nodes that are in different groups."""
        sets = [set(group) for group in groups]
        for x, y in itertools.combinations(range(len(sets)), 2):
            for a in sets[x]:
                for b in sets[y]:
                    self.cut(a, b, one_way=one_way)

    def isolate_client(self, i: int) -> None:
        """Clients cannot reach node i."""
        link = Link(0, i, LinkKind.GRPC)
        self._add(link, "timeout", stream="upstream", timeout=cut_close_ms)
        self._add(link, "timeout", stream="downstream", timeout=cut_close_ms)

    def slow(self, links: Iterable[Link], *, latency_ms: int = 0, jitter_ms: int = 0,
             rate_kbps: int = 0, reset_after_ms: int | None = None,
             slice_bytes: int = 0, limit_bytes: int = 0, toxicity: float = 1.0) -> None:
        """Toxics on both directions of `links`: latency with jitter, a bandwidth cap (KB/s),
        reset_peer after `reset_after_ms`, slicing into pieces of ~`slice_bytes`, a data
        limit."""
        for link in links:
            for stream in ("upstream", "downstream"):
                if latency_ms or jitter_ms:
                    self._add(link, "latency", stream=stream, toxicity=toxicity,
                              latency=latency_ms, jitter=jitter_ms)
                if rate_kbps:
                    self._add(link, "bandwidth", stream=stream, toxicity=toxicity,
                              rate=rate_kbps)
                if slice_bytes:
                    self._add(link, "slicer", stream=stream, toxicity=toxicity,
                              average_size=slice_bytes, size_variation=slice_bytes // 2,
                              delay=100)
                if limit_bytes:
                    self._add(link, "limit_data", stream=stream, toxicity=toxicity,
                              bytes=limit_bytes)
            if reset_after_ms is not None:
                self._add(link, "reset_peer", stream="upstream", toxicity=toxicity,
                          timeout=reset_after_ms)

    def heal(self) -> None:
        """Removes every toxic this net added (one already gone counts as removed)."""
        with self._lock:
            for proxy_name, names in list(self._toxics.items()):
                proxy = self._server.get_proxy(proxy_name)
                for name in sorted(names):
                    if proxy is not None:
                        with contextlib.suppress(NotFound):
                            proxy.destroy_toxic(name)
                    names.discard(name)
                del self._toxics[proxy_name]

    def destroy(self) -> None:
        with self._lock:
            self._toxics.clear()
            self._server.destroy_all()
