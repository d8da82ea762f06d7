"""Long-lived gRPC channels to other nodes' client ports, pooled by address."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from raftlog.base import limits
from raftlog.node.transport.tls import secure_channel

# Channels for relayed server streams (Subscribe): without the BDP probe a stream's receive window
# stays at gRPC's 64 KiB, so a relay whose client does not read holds at most that much of the
# serving node's answer, not the megabytes a grown window lets in.
STREAM_RELAY_OPTIONS: list[tuple[str, Any]] = [("grpc.http2.bdp_probe", 0)]


class ChannelPool:
    """At most limits.channels_max channels; beyond, the least recently used leaves the pool
    (not closed: calls may still run on it; it goes once nothing holds it)."""

    def __init__(self, *, options: list[tuple[str, Any]] | None = None,
                 dial: Callable[[str], str] | None = None,
                 credentials: Callable[[], grpc.ChannelCredentials] | None = None) -> None:
        """`dial` maps the address a node is known by to the one to connect to (a proxy on
        the link, config.NodeConfig.dial); channels stay keyed by the former. `credentials`
        (tls.CertificateFiles.channel_credentials): each new channel is TLS with what it
        returns then; None: plaintext."""
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._dial = dial or (lambda address: address)
        self._credentials = credentials
        merged = dict([
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
            # A node that restarts is reachable again within a second, not after grpc's
            # default backoff of up to two minutes.
            ("grpc.initial_reconnect_backoff_ms", limits.reconnect_backoff_ms),
            ("grpc.min_reconnect_backoff_ms", limits.reconnect_backoff_ms),
            ("grpc.max_reconnect_backoff_ms", limits.reconnect_backoff_ms_max),
            # Each channel its own connections: by default gRPC shares them between channels
            # to one address, so a renewed channel would inherit the old one's backoff.
            ("grpc.use_local_subchannel_pool", 1),
        ])
        merged.update(options or ())  # the caller's options replace the defaults
        self._options = list(merged.items())

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.pop(address, None)
        if channel is None:
            channel = secure_channel(
                self._dial(address),
                self._credentials() if self._credentials is not None else None,
                options=self._options)
            if len(self._channels) >= limits.channels_max:
                oldest = next(iter(self._channels))
                self._channels.pop(oldest)
        self._channels[address] = channel
        return channel

    def renew(self, address: str, stale: grpc.aio.Channel) -> grpc.aio.Channel:
        """A fresh channel to `address` in place of `stale`, which could not connect (it may
        be waiting out a reconnect backoff; a new one dials at once). If `stale` was already
        replaced, its replacement: one renewal per failure, however many calls saw it."""
        if self._channels.get(address) is stale:
            del self._channels[address]  # left to go once nothing holds it, as an evicted one
        return self.get(address)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()
