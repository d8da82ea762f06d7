"""Raft addresses (`host:port`) and the rule that a Raft port beyond loopback needs the
cluster secret."""

from __future__ import annotations

import ipaddress
import socket

from raftlog.base.errors import RaftlogError, Reason


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RaftlogError(Reason.INVALID_CONFIG, f"{address!r} is not host:port")
    return host.strip("[]"), int(port)


def is_loopback_host(host: str) -> bool:
    """True when every address the host names is a loopback address."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def check_raft_config(*, bind_address: str, secret: str) -> None:
    """A Raft port beyond loopback must be encrypted and authenticated with the cluster secret:
    without it anyone who reaches the port can impersonate a member."""
    host, _ = split_address(bind_address)
    if not secret and not is_loopback_host(host):
        raise RaftlogError(
            Reason.INVALID_CONFIG,
            f"raft listens on {bind_address}, beyond loopback: set a cluster secret "
            "(--cluster-secret) or bind raft to 127.0.0.1",
            bind_address=bind_address)
