"""`raftlog top`'s view from two scrapes (node/cli/top.py), on exposition text written here:
no node, no socket. The text is what a node's /metrics serves (docs/metrics.md), parsed by the
same prometheus_client parser the command uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlog.node.cli import top
from raftlog.node.cli.base import UsageError
from raftlog.node.cli.localcluster_procs import write_pid_file


def exposition(*, calls: float, errors: float | None = None, fsyncs: float, leader: bool,
               last_seq: int, primary: bool = True, term: int = 3) -> str:
    """A /metrics answer with one stream `orders` and one consumer `billing`."""
    lines = [
        "# TYPE raftlog_rpc_calls counter",
        f'raftlog_rpc_calls_total{{frontend="raftlog.v1",service="raftlog.v1.Streams",'
        f'method="Publish"}} {calls * 0.75}',
        f'raftlog_rpc_calls_total{{frontend="waymaker",service="waymaker.streams.S",'
        f'method="Fetch"}} {calls * 0.25}',
        "# TYPE raftlog_rpc_errors counter",
        *([f'raftlog_rpc_errors_total{{frontend="raftlog.v1",reason="STREAM_NOT_FOUND"}} '
           f'{errors}'] if errors is not None else []),
        "# TYPE raftlog_fsyncs counter", f"raftlog_fsyncs_total {fsyncs}",
        "# TYPE raftlog_raft_term gauge", f"raftlog_raft_term {term}",
        "# TYPE raftlog_raft_is_leader gauge", f"raftlog_raft_is_leader {int(leader)}",
        "# TYPE raftlog_raft_leader_known gauge", "raftlog_raft_leader_known 1",
        "# TYPE raftlog_metrics_state_ok gauge", "raftlog_metrics_state_ok 1",
        "# TYPE process_resident_memory_bytes gauge", "process_resident_memory_bytes 8.0e+07",
        "# TYPE raftlog_stream_last_seq gauge", f'raftlog_stream_last_seq{{stream="orders"}} '
        f"{last_seq}",
        "# TYPE raftlog_stream_commit_seq gauge", f'raftlog_stream_commit_seq{{stream="orders"}} '
        f"{last_seq - 2}",
        "# TYPE raftlog_stream_is_primary gauge",
        f'raftlog_stream_is_primary{{stream="orders"}} {int(primary)}',
    ]
    if primary:
        lines += [
            "# TYPE raftlog_replication_lag_messages gauge",
            'raftlog_replication_lag_messages{stream="orders",replica="n2"} 0',
            'raftlog_replication_lag_messages{stream="orders",replica="n3"} 7',
            "# TYPE raftlog_consumer_pending_messages gauge",
            'raftlog_consumer_pending_messages{stream="orders",consumer="billing"} 40',
            "# TYPE raftlog_consumer_ack_pending_messages gauge",
            'raftlog_consumer_ack_pending_messages{stream="orders",consumer="billing"} 5',
        ]
    return "\n".join(lines) + "\n"


N1 = top.Target("n1", "127.0.0.1:9400")
N2 = top.Target("n2", "127.0.0.1:9401")


def scraped(target: top.Target, at_s: float, text: str) -> top.Scrape:
    return top.Scrape(target, at_s, top.parse_samples(text))


def test_rates_are_counter_increases_over_the_time_between_two_scrapes() -> None:
    before = scraped(N1, 10.0, exposition(calls=100, errors=2, fsyncs=50, leader=True,
                                          last_seq=1000))
    now = scraped(N1, 12.0, exposition(calls=300, errors=6, fsyncs=90, leader=True,
                                       last_seq=1400))
    v = top.view([now], [before])
    [node] = v.nodes
    assert (node.calls_per_s, node.errors_per_s, node.fsyncs_per_s) == (100.0, 2.0, 20.0)
    assert (node.up, node.role, node.term, node.rss_bytes) == (True, "leader", 3, 80_000_000)
    [stream] = v.streams
    assert stream.publish_per_s == 200.0
    assert (stream.name, stream.primary, stream.last_seq, stream.commit_seq) == (
        "orders", "n1", 1400, 1398)
    assert stream.replication_lag == {"n2": 0, "n3": 7}
    assert stream.consumers == {"billing": {"pending": 40, "ack_pending": 5}}


def test_first_view_has_gauges_but_no_rates() -> None:
    v = top.view([scraped(N1, 1.0, exposition(calls=5, fsyncs=5, leader=False, last_seq=9))])
    [node] = v.nodes
    assert (node.calls_per_s, node.errors_per_s, node.fsyncs_per_s) == (None, None, None)
    assert node.role == "follower"
    assert v.streams[0].publish_per_s is None and v.streams[0].last_seq == 9


def test_an_error_counter_that_appears_counts_from_zero() -> None:
    before = scraped(N1, 0.0, exposition(calls=10, fsyncs=1, leader=True, last_seq=5))
    now = scraped(N1, 1.0, exposition(calls=10, errors=3, fsyncs=1, leader=True, last_seq=5))
    assert top.view([now], [before]).nodes[0].errors_per_s == 3.0


def test_a_counter_that_went_down_is_a_restart_counted_from_zero() -> None:
    before = scraped(N1, 0.0, exposition(calls=1000, fsyncs=500, leader=True, last_seq=5))
    now = scraped(N1, 4.0, exposition(calls=40, fsyncs=8, leader=True, last_seq=5))
    node = top.view([now], [before]).nodes[0]
    assert (node.calls_per_s, node.fsyncs_per_s) == (10.0, 2.0)


def test_a_node_that_did_not_answer_is_down_and_the_primary_comes_from_the_others() -> None:
    before = [scraped(N1, 0.0, exposition(calls=0, fsyncs=0, leader=True, last_seq=100)),
              scraped(N2, 0.0, exposition(calls=0, fsyncs=0, leader=False, last_seq=100,
                                          primary=False))]
    now = [top.Scrape(N1, 1.0, error="Connection refused"),
           scraped(N2, 1.0, exposition(calls=0, fsyncs=0, leader=True, last_seq=150))]
    v = top.view(now, before)
    assert [(n.name, n.up, n.error) for n in v.nodes] == [
        ("n1", False, "Connection refused"), ("n2", True, "")]
    [stream] = v.streams
    assert (stream.primary, stream.last_seq, stream.publish_per_s) == ("n2", 150, 50.0)
    assert "down n1: Connection refused" in top.render(v)


def test_a_stream_with_no_answering_primary_has_no_primary_lag_or_consumers() -> None:
    now = [scraped(N2, 1.0, exposition(calls=0, fsyncs=0, leader=False, last_seq=3,
                                       primary=False))]
    [stream] = top.view(now).streams
    assert (stream.primary, stream.replication_lag, stream.consumers) == ("", {}, {})


def test_a_standalone_node_has_no_raft_role() -> None:
    text = "# TYPE raftlog_fsyncs counter\nraftlog_fsyncs_total 3\n"
    node = top.view([scraped(N1, 0.0, text)]).nodes[0]
    assert (node.role, node.term) == ("standalone", None)


def test_json_document_names_every_field() -> None:
    v = top.view([scraped(N1, 0.0, exposition(calls=1, fsyncs=1, leader=True, last_seq=2))])
    document = v.to_dict()
    assert set(document["nodes"][0]) >= {"name", "up", "role", "term", "calls_per_s",
                                          "errors_per_s", "fsyncs_per_s", "rss_bytes"}
    assert set(document["streams"][0]) >= {"name", "primary", "publish_per_s", "last_seq",
                                            "commit_seq", "replication_lag", "consumers"}


def test_unreadable_text_is_refused() -> None:
    with pytest.raises(ValueError):
        top.parse_samples("raftlog_fsyncs_total{ 3\n")


def test_dir_targets_come_from_the_pid_files_of_nodes_started_with_metrics(
        tmp_path: Path) -> None:
    write_pid_file(tmp_path / "n1.pid", pid=1, command=["x", "--metrics", "127.0.0.1:9400"])
    write_pid_file(tmp_path / "n2.pid", pid=2, command=["x", "--grpc", "127.0.0.1:7403"])
    assert top.dir_targets(tmp_path) == [top.Target("n1", "127.0.0.1:9400")]
    with pytest.raises(UsageError, match="not a directory"):
        top.dir_targets(tmp_path / "n2.pid")
    (tmp_path / "n1.pid").unlink()
    with pytest.raises(UsageError, match="no node recorded there serves metrics"):
        top.dir_targets(tmp_path)


def test_a_node_too_busy_to_report_its_state_has_an_unknown_role() -> None:
    text = ("# TYPE raftlog_metrics_state_ok gauge\nraftlog_metrics_state_ok 0\n"
            "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes 1e6\n")
    node = top.view([scraped(N1, 0.0, text)]).nodes[0]
    assert (node.up, node.state_ok, node.role, node.rss_bytes) == (True, False, "unknown", 1e6)
    assert "up (busy)" in top.render(top.View([node], []))
