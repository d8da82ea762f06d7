"""A TLS-only cluster, made as `raftlog cluster up --tls` makes it (a CA and node certificates
under the cluster directory): clients that trust the CA publish, also through a node that
forwards to the primary; plaintext clients, peer callers whose certificate another CA signed,
and (on the node with `--tls-client-auth require`) clients without a certificate are refused;
a node rotated onto a new certificate serves it to new connections without a restart.

One module-scoped 3-node cluster; n3's client port requires client certificates.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.internal import replication_pb2, replication_pb2_grpc
from raftlog.node.cli import certs
from raftlog.node.transport.credentials import PEER_TOKEN_HEADER
from raftlog.node.transport.peer import METHOD_PING
from raftlog.v1 import cluster_pb2, cluster_pb2_grpc, streams_pb2, streams_pb2_grpc, types_pb2

call_timeout_s = 10.0
refused_timeout_s = 3.0  # a refused handshake fails fast; this only bounds a hang
REQUIRE_NODE = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("tls") / "cluster"
    local = LocalCluster(root, nodes=3, tls=True, node_args=lambda spec: (
        ["--tls-client-auth", "require"] if spec.index == REQUIRE_NODE else []))
    try:
        yield local.start_all()
    finally:
        local.stop_all()


def client_files(cluster: LocalCluster) -> certs.TlsPaths:
    return certs.paths_of(cluster.root.resolve(), certs.CLIENT_NAME)


def ca_only(cluster: LocalCluster) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=client_files(cluster).ca.read_bytes())


def with_client_cert(cluster: LocalCluster, issued: certs.Issued | None = None,
                     ) -> grpc.ChannelCredentials:
    paths = client_files(cluster)
    key, cert = ((issued.key_pem, issued.cert_pem) if issued is not None
                 else (paths.key.read_bytes(), paths.cert.read_bytes()))
    return grpc.ssl_channel_credentials(root_certificates=paths.ca.read_bytes(),
                                        private_key=key, certificate_chain=cert)


def health_code(channel: grpc.Channel) -> grpc.StatusCode:
    try:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                  timeout=refused_timeout_s)
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def served_serial(address: str, ca: Path) -> int:
    """The serial of the certificate a fresh TLS connection to `address` is shown."""
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=refused_timeout_s) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return certs.serial_of(ssl.DER_cert_to_PEM_cert(der).encode())


def test_a_client_trusting_the_ca_publishes_also_through_a_forwarding_node(
        cluster: LocalCluster) -> None:
    with grpc.secure_channel(cluster.address(1), ca_only(cluster)) as channel:
        streams = streams_pb2_grpc.StreamsStub(channel)
        wait_until(lambda: _created(streams, "tls-orders"), 15, interval_s=0.1,
                   what="stream tls-orders created over TLS")
        route = cluster_pb2_grpc.ClusterStub(channel).ExplainRoute(
            cluster_pb2.ExplainRouteRequest(stream="tls-orders"), timeout=call_timeout_s)
    via = 2 if route.primary == "n1" else 1  # a node that is not the primary: it forwards
    assert route.primary != f"n{via}"
    with grpc.secure_channel(cluster.address(via), ca_only(cluster)) as channel:
        streams = streams_pb2_grpc.StreamsStub(channel)
        ack = streams.Publish(streams_pb2.PublishRequest(
            stream="tls-orders", subject="orders.eu", payload=b"over tls"),
            timeout=call_timeout_s)
        got = streams.GetMessage(streams_pb2.GetMessageRequest(stream="tls-orders",
                                                               seq=ack.seq),
                                 timeout=call_timeout_s)
    assert got.payload == b"over tls"


def _created(streams: streams_pb2_grpc.StreamsStub, name: str) -> bool:
    try:
        streams.CreateStream(streams_pb2.CreateStreamRequest(
            config=types_pb2.StreamConfig(name=name, subjects=["orders.>"], replicas=3)),
            timeout=call_timeout_s)
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.UNAVAILABLE:
            return False
        raise
    return True


def test_a_plaintext_client_is_refused(cluster: LocalCluster) -> None:
    with grpc.insecure_channel(cluster.address(1)) as channel:
        assert health_code(channel) == grpc.StatusCode.UNAVAILABLE
    with grpc.secure_channel(cluster.address(1), ca_only(cluster)) as channel:
        assert health_code(channel) == grpc.StatusCode.OK  # the same call over TLS


def _ping(channel: grpc.Channel, cluster: LocalCluster) -> grpc.StatusCode:
    token = cluster.credential().token(principal="test", method=METHOD_PING)
    try:
        replication_pb2_grpc.ReplicationStub(channel).Ping(
            replication_pb2.PingRequest(from_node="test"), timeout=refused_timeout_s,
            metadata=((PEER_TOKEN_HEADER, token),))
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_the_peer_port_refuses_a_certificate_from_another_ca(cluster: LocalCluster) -> None:
    stranger_ca = certs.make_ca(common_name="not the cluster's CA")
    stranger = certs.issue(stranger_ca, common_name="n9")
    address = cluster.peer_address(2)
    with grpc.secure_channel(address, with_client_cert(cluster, stranger)) as channel:
        assert _ping(channel, cluster) == grpc.StatusCode.UNAVAILABLE
    with grpc.secure_channel(address, ca_only(cluster)) as channel:  # no certificate at all
        assert _ping(channel, cluster) == grpc.StatusCode.UNAVAILABLE
    with grpc.insecure_channel(address) as channel:
        assert _ping(channel, cluster) == grpc.StatusCode.UNAVAILABLE
    # The same signed call with a certificate the cluster's CA issued is answered.
    with grpc.secure_channel(address, with_client_cert(cluster)) as channel:
        assert _ping(channel, cluster) == grpc.StatusCode.OK


def test_client_auth_require_refuses_a_client_without_a_certificate(
        cluster: LocalCluster) -> None:
    address = cluster.address(REQUIRE_NODE)
    with grpc.secure_channel(address, ca_only(cluster)) as channel:
        assert health_code(channel) == grpc.StatusCode.UNAVAILABLE
    with grpc.secure_channel(address, with_client_cert(cluster)) as channel:
        assert health_code(channel) == grpc.StatusCode.OK
    with grpc.secure_channel(cluster.address(1), ca_only(cluster)) as channel:
        assert health_code(channel) == grpc.StatusCode.OK  # n1 asks for none


def test_a_rotated_certificate_is_served_to_new_connections(cluster: LocalCluster) -> None:
    paths = certs.paths_of(cluster.root.resolve(), "n1")
    before = served_serial(cluster.address(1), paths.ca)
    assert before == certs.serial_of(paths.cert.read_bytes())
    rotated = certs.issue(certs.load_ca(cluster.root.resolve()), common_name="n1")
    certs.write_issued(rotated, cert=paths.cert, key=paths.key)
    new_serial = certs.serial_of(rotated.cert_pem)
    wait_until(lambda: served_serial(cluster.address(1), paths.ca) == new_serial, 10,
               interval_s=0.1, what="n1 serving its rotated certificate")
    with grpc.secure_channel(cluster.address(1), ca_only(cluster)) as channel:
        assert health_code(channel) == grpc.StatusCode.OK
    # Its peer listener rotated too, and still accepts the other members' certificates.
    with grpc.secure_channel(cluster.peer_address(1), with_client_cert(cluster)) as channel:
        assert _ping(channel, cluster) == grpc.StatusCode.OK
    assert cluster.leader_id() is not None
