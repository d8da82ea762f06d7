"""`raftlog top`: a live view of a cluster, read from the nodes' Prometheus endpoints
(`--metrics`, docs/metrics.md), with no gRPC connection at all (docs/top.md).

    raftlog top --metrics 127.0.0.1:9400,127.0.0.1:9401,127.0.0.1:9402
    raftlog top --dir ./cluster                   the addresses `cluster up` recorded
    raftlog top --dir ./cluster --once --json     one snapshot, for scripts

Every refresh scrapes each node once (in parallel, each bounded by `scrape_timeout_s`) and
parses the text with prometheus_client's own parser. Gauges are shown as read; a rate is the
difference of a counter (or of a stream's last seq) between this scrape and the previous one
of the same node, over the time between them. The first view has no rates, so `--once`
scrapes twice, `--interval` apart.

The computation (`view`) is pure: two sets of scrapes in, one `View` out; the scraping, the
clock and the terminal are only in `run`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from raftlog.node.cli import format as fmt
from raftlog.node.cli.base import (
    EXIT_ERROR,
    EXIT_OK,
    UsageError,
    address_list,
    seconds,
    show,
    typed,
    warn,
)
from raftlog.node.cli.localcluster_procs import pid_files, read_pid_file

interval_s_default = 1.0
interval_s_min = 0.1
scrape_timeout_s = 2.0  # one node's /metrics; a node slower than this shows as down
scrape_bytes_max = 16 * 1024 * 1024  # a /metrics answer longer than this is refused
CLEAR_SCREEN = "\x1b[H\x1b[2J"
HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


# ---------------------------------------------------------------------------------------------
# Scrapes: what one node's /metrics said at one moment.


@dataclass(frozen=True)
class Target:
    name: str  # the node id when known (--dir), else the metrics address
    address: str  # HOST:PORT of its /metrics


@dataclass(frozen=True)
class Scrape:
    target: Target
    at_s: float  # a monotonic clock reading
    samples: Samples = field(default_factory=dict)
    error: str = ""  # why the node did not answer; "" when it did

    @property
    def up(self) -> bool:
        return not self.error


def parse_samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, by name and label set. Raises ValueError
    on text the parser cannot read."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = float(sample.value)
    return samples


def scrape(target: Target, *, at_s: float, timeout_s: float = scrape_timeout_s) -> Scrape:
    """One GET of http://ADDRESS/metrics; a node that does not answer is a Scrape with an
    error (never an exception)."""
    try:
        with urllib.request.urlopen(f"http://{target.address}/metrics",
                                    timeout=timeout_s) as answer:
            body = answer.read(scrape_bytes_max + 1)
        if len(body) > scrape_bytes_max:
            return Scrape(target, at_s, error=f"answer over {scrape_bytes_max} bytes")
        return Scrape(target, at_s, parse_samples(body.decode("utf-8", "replace")))
    except (OSError, http.client.HTTPException) as exc:  # refused, timed out, cut short
        return Scrape(target, at_s, error=str(getattr(exc, "reason", exc)))
    except ValueError as exc:
        return Scrape(target, at_s, error=f"unreadable metrics: {exc}")


def scrape_all(targets: Sequence[Target], pool: concurrent.futures.Executor) -> list[Scrape]:
    """Every target at once (a down node costs at most scrape_timeout_s, not one each)."""
    at_s = time.monotonic()
    return list(pool.map(lambda target: scrape(target, at_s=at_s), targets))


# ---------------------------------------------------------------------------------------------
# Reading samples.


def total(samples: Samples, name: str, **labels: str) -> float | None:
    """The sum of `name` over the samples whose labels include `labels`; None when none."""
    wanted = set(labels.items())
    found = [v for (n, have), v in samples.items() if n == name and wanted <= have]
    return sum(found) if found else None


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    """`name`'s samples keyed by the value of one label (the others summed)."""
    out: dict[str, float] = {}
    for (n, have), v in samples.items():
        value = dict(have).get(label) if n == name else None
        if value is not None:
            out[value] = out.get(value, 0.0) + v
    return out


def rate(now: float | None, before: float | None, seconds_between: float) -> float | None:
    """Per second between two readings of a counter; a counter that went down (the node
    restarted) counts from zero. None without both readings or time between them."""
    if now is None or before is None or seconds_between <= 0:
        return None
    increase = now - before if now >= before else now
    return increase / seconds_between


# ---------------------------------------------------------------------------------------------
# The view: pure, from the previous and the current scrapes.


@dataclass(frozen=True)
class NodeRow:
    name: str
    address: str
    up: bool
    error: str = ""
    role: str = ""  # leader, follower, no-leader; standalone without Raft; unknown when busy
    term: int | None = None
    calls_per_s: float | None = None
    errors_per_s: float | None = None
    fsyncs_per_s: float | None = None
    rss_bytes: int | None = None
    state_ok: bool = True


@dataclass(frozen=True)
class StreamRow:
    name: str
    primary: str  # the node that serves it ("" when no node that answered does)
    last_seq: int  # seqs number every message ever published: the publish count
    commit_seq: int
    publish_per_s: float | None
    replication_lag: dict[str, int]  # replica -> messages not acknowledged yet
    consumers: dict[str, dict[str, int]]  # name -> pending, ack_pending


@dataclass(frozen=True)
class View:
    nodes: list[NodeRow]
    streams: list[StreamRow]

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": [asdict(row) for row in self.nodes],
                "streams": [asdict(row) for row in self.streams]}


def role_of(samples: Samples) -> str:
    if total(samples, "raftlog_metrics_state_ok") == 0.0:
        return "unknown"  # the node was too busy to report its state in this scrape
    if total(samples, "raftlog_raft_term") is None:
        return "standalone"
    if total(samples, "raftlog_raft_is_leader"):
        return "leader"
    return "follower" if total(samples, "raftlog_raft_leader_known") else "no-leader"


def node_row(now: Scrape, before: Scrape | None) -> NodeRow:
    target = now.target
    if not now.up:
        return NodeRow(target.name, target.address, up=False, error=now.error)
    s = now.samples  # a labelled counter has no sample before its first increment: 0
    p = before.samples if before is not None and before.up else {}
    dt = now.at_s - before.at_s if before is not None else 0.0
    term = total(s, "raftlog_raft_term")
    rss = total(s, "process_resident_memory_bytes")
    return NodeRow(
        target.name, target.address, up=True, role=role_of(s),
        term=int(term) if term is not None else None,
        calls_per_s=rate(total(s, "raftlog_rpc_calls_total") or 0.0,
                         (total(p, "raftlog_rpc_calls_total") or 0.0) if p else None, dt),
        errors_per_s=rate(total(s, "raftlog_rpc_errors_total") or 0.0,
                          (total(p, "raftlog_rpc_errors_total") or 0.0) if p else None, dt),
        fsyncs_per_s=rate(total(s, "raftlog_fsyncs_total"),
                          total(p, "raftlog_fsyncs_total") if p else None, dt),
        rss_bytes=int(rss) if rss is not None else None,
        state_ok=total(s, "raftlog_metrics_state_ok") != 0.0,
    )


def _stream_last_seq(scrapes: Iterable[Scrape], stream: str) -> float | None:
    """The highest last seq any answering node holds for the stream."""
    seqs = [v for scrape in scrapes if scrape.up
            for v in [by_label(scrape.samples, "raftlog_stream_last_seq", "stream").get(stream)]
            if v is not None]
    return max(seqs) if seqs else None


def stream_rows(now: Sequence[Scrape], before: Mapping[str, Scrape]) -> list[StreamRow]:
    """One row per stream any answering node stores. The primary's scrape gives the commit
    seq, the replicas' lag and the consumers; the rate is how far the stream's last seq
    (highest over the nodes) moved since the previous scrapes."""
    names = sorted({stream for scrape in now if scrape.up
                    for stream in by_label(scrape.samples, "raftlog_stream_last_seq", "stream")})
    rows = []
    for stream in names:
        primary = next((scrape for scrape in now if scrape.up and by_label(
            scrape.samples, "raftlog_stream_is_primary", "stream").get(stream)), None)
        last = _stream_last_seq(now, stream) or 0.0
        earlier = [before[scrape.target.address] for scrape in now
                   if scrape.target.address in before]
        previous = _stream_last_seq(earlier, stream)
        dt = (max(s.at_s for s in now) - max(s.at_s for s in earlier)) if earlier else 0.0
        rows.append(StreamRow(
            name=stream, primary=primary.target.name if primary else "", last_seq=int(last),
            commit_seq=int(_labelled(primary, "raftlog_stream_commit_seq", stream=stream)),
            publish_per_s=rate(last, previous, dt),
            replication_lag=_lags(primary, stream), consumers=_consumers(primary, stream)))
    return rows


def _labelled(scrape: Scrape | None, name: str, **labels: str) -> float:
    return (total(scrape.samples, name, **labels) or 0.0) if scrape is not None else 0.0


def _lags(primary: Scrape | None, stream: str) -> dict[str, int]:
    if primary is None:
        return {}
    lags = {}
    for (name, have), lag in primary.samples.items():
        labels = dict(have)
        if name == "raftlog_replication_lag_messages" and labels.get("stream") == stream:
            lags[labels.get("replica", "")] = int(lag)
    return dict(sorted(lags.items()))


def _consumers(primary: Scrape | None, stream: str) -> dict[str, dict[str, int]]:
    if primary is None:
        return {}
    out: dict[str, dict[str, int]] = {}
    for key, name in (("pending", "raftlog_consumer_pending_messages"),
                      ("ack_pending", "raftlog_consumer_ack_pending_messages")):
        for (n, have), value in primary.samples.items():
            labels = dict(have)
            if n == name and labels.get("stream") == stream:
                out.setdefault(labels.get("consumer", ""), {})[key] = int(value)
    return dict(sorted(out.items()))


def view(now: Sequence[Scrape], before: Sequence[Scrape] = ()) -> View:
    """The view of the current scrapes, with rates against the previous ones (by address)."""
    previous = {scrape.target.address: scrape for scrape in before if scrape.up}
    return View(nodes=[node_row(scrape, previous.get(scrape.target.address)) for scrape in now],
                streams=stream_rows(now, previous))


# ---------------------------------------------------------------------------------------------
# Text.


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _bytes(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / (1024 * 1024):,.1f} MiB"


def render(v: View) -> str:
    nodes = fmt.render_table(
        ["NODE", "METRICS", "STATE", "ROLE", "TERM", "CALLS/S", "ERRORS/S", "FSYNCS/S", "RSS"],
        [(n.name, n.address, ("up" if n.state_ok else "up (busy)") if n.up else "down",
          n.role or "-", "-" if n.term is None else n.term, _num(n.calls_per_s),
          _num(n.errors_per_s), _num(n.fsyncs_per_s), _bytes(n.rss_bytes)) for n in v.nodes],
        right_align=[4, 5, 6, 7, 8])
    streams = fmt.render_table(
        ["STREAM", "PRIMARY", "PUB/S", "LAST SEQ", "COMMIT SEQ", "REPL LAG", "CONSUMERS"],
        [(s.name, s.primary or "-", _num(s.publish_per_s), s.last_seq, s.commit_seq,
          max(s.replication_lag.values(), default=0),
          ", ".join(f"{c} {p.get('pending', 0)}/{p.get('ack_pending', 0)}"
                    for c, p in s.consumers.items()) or "-") for s in v.streams],
        right_align=[2, 3, 4, 5])
    down = [f"{n.name}: {n.error}" for n in v.nodes if not n.up]
    footer = "\n".join(["", *(f"down {line}" for line in down)]) if down else ""
    legend = "consumers: NAME pending/ack-pending; REPL LAG: the most behind replica"
    return f"{nodes}\n\n{streams if v.streams else '(no streams)'}\n\n{legend}{footer}"


# ---------------------------------------------------------------------------------------------
# The command.


def add_top_command(commands: Any) -> None:
    top = commands.add_parser(
        "top", help="a live view of nodes and streams, from the nodes' /metrics",
        description="Per node: up or down, Raft role and term, calls/s, errors/s, fsyncs/s and "
        "memory; per stream: primary, publishes/s, seqs, replication lag and consumers' "
        "pending; read from each node's Prometheus endpoint (docs/top.md). Ctrl-C exits.")
    where = top.add_mutually_exclusive_group(required=True)
    where.add_argument("--metrics", type=typed(address_list), metavar="HOST:PORT[,...]",
                       help="the nodes' metrics addresses")
    where.add_argument("--dir", type=Path, metavar="DIR",
                       help="a `raftlog cluster up` directory: the nodes it started with "
                       "--metrics-base-port")
    top.add_argument("--interval", type=typed(seconds), default=interval_s_default,
                     metavar="DURATION", help="time between refreshes (default 1s)")
    top.add_argument("--once", action="store_true",
                     help="print one view (two scrapes --interval apart) and exit")
    top.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                     help="JSON instead of text (live: one document per line)")
    top.set_defaults(run=run)


def targets_of(args: argparse.Namespace) -> list[Target]:
    if args.metrics:
        return [Target(name=address, address=address) for address in args.metrics]
    return dir_targets(args.dir)


def dir_targets(root: Path) -> list[Target]:
    """The nodes recorded under a local cluster directory that were started with --metrics."""
    if not root.is_dir():
        raise UsageError(f"--dir {root}: not a directory")
    targets = []
    for path in pid_files(root):
        try:
            record = read_pid_file(path)
        except (OSError, ValueError):
            continue
        if record.metrics_address:
            targets.append(Target(name=record.node_id, address=record.metrics_address))
    if not targets:
        raise UsageError(f"--dir {root}: no node recorded there serves metrics (start the "
                         "cluster with `raftlog cluster up --metrics-base-port P`)")
    return targets


def run(args: argparse.Namespace) -> int:
    if args.interval < interval_s_min:
        raise UsageError(f"--interval must be at least {interval_s_min}s")
    targets = targets_of(args)
    if not targets:
        raise UsageError("--metrics names no address")
    as_json = bool(getattr(args, "json", False))
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(targets)) as pool:
        if args.once:
            return _once(targets, pool, interval_s=args.interval, as_json=as_json)
        return _live(targets, pool, interval_s=args.interval, as_json=as_json)


def _once(targets: Sequence[Target], pool: concurrent.futures.Executor, *,
          interval_s: float, as_json: bool) -> int:
    first = scrape_all(targets, pool)
    time.sleep(interval_s)
    current = view(scrape_all(targets, pool), first)
    show(fmt.to_json(current.to_dict()) if as_json else render(current))
    return EXIT_OK if any(node.up for node in current.nodes) else EXIT_ERROR


def _live(targets: Sequence[Target], pool: concurrent.futures.Executor, *,
          interval_s: float, as_json: bool) -> int:
    redraw = sys.stdout.isatty() and not as_json
    previous: list[Scrape] = []
    if redraw:
        sys.stdout.write(HIDE_CURSOR)
    try:
        while True:
            started = time.monotonic()
            current = scrape_all(targets, pool)
            shown = view(current, previous)
            if as_json:
                show(json.dumps(shown.to_dict(), ensure_ascii=False))
            else:
                stamp = time.strftime("%H:%M:%S")
                show(f"{CLEAR_SCREEN if redraw else ''}raftlog top  {stamp}  every "
                     f"{interval_s:g}s  (Ctrl-C to quit)\n\n{render(shown)}\n")
            previous = current
            time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    except KeyboardInterrupt:
        if not redraw:
            warn("interrupted")
        return EXIT_OK
    finally:
        if redraw:
            sys.stdout.write(SHOW_CURSOR)
            sys.stdout.flush()
