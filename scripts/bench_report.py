"""What scripts/bench reports besides its own figures: the JetStream peer run (`run_peer`, its
medians: `peer_figures`), the ratios raftlog/JetStream against their targets (`COMPARISONS`,
`ratios`), the medians and spreads of repeated runs (`SPREAD_FIGURES`, `merge_runs`), the table
printed to stderr (`table`), and the facts and failures the JSON document carries (`host`,
`phase_errors`). Imported by scripts/bench.py (scripts/ is sys.path[0]).
"""

from __future__ import annotations

import copy
import os
import platform
import statistics
from pathlib import Path
from typing import Any

import bench_failover  # scripts/ is sys.path[0]

from raftlog.node.cli import format as fmt

peer_timeout_s = 1200.0
peer_timeout_quick_s = 400.0


def run_peer(*, quick: bool, replicas: int = 1, failover_trials: int = 0) -> dict[str, Any]:
    """Runs the peer (its progress goes to our stderr); its JSON, or {"error": ...}."""
    phases = "pub,failover" if failover_trials else "pub"
    return bench_failover.run_peer_command(
        ["--replicas", str(replicas), "--phases", phases,
         *(["--failover-trials", str(failover_trials)] if failover_trials else [])],
        quick=quick, timeout_s=peer_timeout_quick_s if quick else peer_timeout_s)


def peer_figures(peer: dict[str, Any], *, replicas: int = 1) -> dict[str, Any]:
    """The medians (at the run's replica count) the ratios use, plus the peer's own facts."""
    r1 = peer.get("summary", {}).get(f"R{replicas}", {})

    def median(phase: str, name: str) -> float | None:
        value = r1.get(phase, {}).get(name, {}).get("median")
        return float(value) if value is not None else None

    return {
        "sync_publish_msgs_per_s": median("sync_publish", "msgs_per_s"),
        "sync_publish_p50_ms": median("sync_publish", "p50_ms"),
        "sync_publish_p99_ms": median("sync_publish", "p99_ms"),
        "publish_async_msgs_per_s": median("publish_async", "msgs_per_s"),
        "gather_publish_msgs_per_s": median("gather_publish", "msgs_per_s"),
        "pull_consume_msgs_per_s": median("pull_consume", "msgs_per_s"),
        "pull_consume_batch": r1.get("pull_consume", {}).get("batch"),
        "nats_server": peer.get("meta", {}).get("nats_server"),
        "fsync_per_ack": peer.get("meta", {}).get("cluster", {}).get("fsync_per_ack"),
        "checks": peer.get("checks"),
        "duration_s": peer.get("meta", {}).get("duration_s"),
    }


# (name, raftlog figure path, JetStream figure, target op, target value); "<=" means lower is
# better (latency), ">=" higher (throughput); None = shown without a target.
COMPARISONS: tuple[tuple[str, tuple[str, ...], str, str | None, float | None], ...] = (
    ("batch_100_vs_publish_async", ("batch_publish", "batch_100", "msgs_per_s"),
     "publish_async_msgs_per_s", ">=", 3.0),
    ("batch_1000_vs_publish_async", ("batch_publish", "batch_1000", "msgs_per_s"),
     "publish_async_msgs_per_s", ">=", 4.0),
    ("stream_publish_vs_publish_async", ("stream_publish", "msgs_per_s"),
     "publish_async_msgs_per_s", ">=", 1.5),
    ("frames_publish_vs_publish_async", ("frames_publish", "msgs_per_s"),
     "publish_async_msgs_per_s", ">=", 1.5),
    ("fetch_ack_100_vs_pull_consume", ("fetch_ack", "batch_100", "msgs_per_s"),
     "pull_consume_msgs_per_s", ">=", 2.0),
    ("fetch_ack_1000_vs_pull_consume", ("fetch_ack", "batch_1000", "msgs_per_s"),
     "pull_consume_msgs_per_s", ">=", 3.0),
    # The same loop with each fetch carrying the acks of the batch before it (the last batch
    # acked by one Ack call that waits for the save): JetStream's msg.ack() does not wait either.
    ("fetch_carried_100_vs_pull_consume", ("fetch_carried", "batch_100", "msgs_per_s"),
     "pull_consume_msgs_per_s", ">=", 2.0),
    ("fetch_carried_1000_vs_pull_consume", ("fetch_carried", "batch_1000", "msgs_per_s"),
     "pull_consume_msgs_per_s", ">=", 3.0),
    ("unary_p50_vs_sync_publish_p50", ("unary_publish", "callers_1", "p50_ms"),
     "sync_publish_p50_ms", None, None),
    ("unary_p99_vs_sync_publish_p99", ("unary_publish", "callers_1", "p99_ms"),
     "sync_publish_p99_ms", None, None),
    ("unary_1_msgs_per_s_vs_sync_publish", ("unary_publish", "callers_1", "msgs_per_s"),
     "sync_publish_msgs_per_s", None, None),
)
# The figures whose spread between repeated runs (`--repeat N`) is reported: (name, path).
SPREAD_FIGURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("unary_1_msgs_per_s", ("unary_publish", "callers_1", "msgs_per_s")),
    ("unary_1_p50_ms", ("unary_publish", "callers_1", "p50_ms")),
    ("unary_8_msgs_per_s", ("unary_publish", "callers_8", "msgs_per_s")),
    ("batch_100_msgs_per_s", ("batch_publish", "batch_100", "msgs_per_s")),
    ("batch_1000_msgs_per_s", ("batch_publish", "batch_1000", "msgs_per_s")),
    ("stream_msgs_per_s", ("stream_publish", "msgs_per_s")),
    ("frames_msgs_per_s", ("frames_publish", "msgs_per_s")),
    ("fetch_ack_100_msgs_per_s", ("fetch_ack", "batch_100", "msgs_per_s")),
    ("fetch_ack_1000_msgs_per_s", ("fetch_ack", "batch_1000", "msgs_per_s")),
    ("fetch_carried_100_msgs_per_s", ("fetch_carried", "batch_100", "msgs_per_s")),
    ("fetch_carried_1000_msgs_per_s", ("fetch_carried", "batch_1000", "msgs_per_s")),
)
spread_target = 0.20  # (max - min) / median of one figure over repeated runs (issue 17)
# Targets on raftlog's own figures (issue 17): (name, figure path, op, value).
ABSOLUTE_TARGETS: tuple[tuple[str, tuple[str, ...], str, float], ...] = (
    ("unary_p50_ms", ("unary_publish", "callers_1", "p50_ms"), "<=", 1.3),
)


def figure(figures: dict[str, Any], path: tuple[str, ...]) -> float | None:
    """The number at `path` in a figures document (None when it is not there)."""
    value: Any = figures
    for key in path:
        value = value.get(key, {}) if isinstance(value, dict) else None
    return float(value) if isinstance(value, int | float) else None


def merge_runs(runs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The figures of repeated runs of `run_raftlog` as one: the first run's document with each
    of SPREAD_FIGURES (and every phase's p99) replaced by its median over the runs, and the
    spread of each, {name: {values, median, spread, met}} where spread = (max - min) / median.
    One run gives a spread of None."""
    merged = copy.deepcopy(runs[0])
    paths = [path for _, path in SPREAD_FIGURES]
    paths += [(*path[:-1], "p99_ms") for path in paths if path[-1] == "p50_ms"]
    for path in paths:
        values = [v for v in (figure(run, path) for run in runs) if v is not None]
        if not values:
            continue
        target: Any = merged
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = statistics.median(values)
    spreads: dict[str, Any] = {}
    for name, path in SPREAD_FIGURES:
        values = [v for v in (figure(run, path) for run in runs) if v is not None]
        spread = _spread(values)
        # The client's CPU per message in the same phase: the same work in every run, so its
        # spread is the machine's own speed changing between runs, not raftlog's.
        client = [v for v in (figure(run, (*path[:-1], "client_cpu_us_per_msg"))
                              for run in runs) if v is not None]
        spreads[name] = {"values": values,
                         "median": statistics.median(values) if values else None,
                         "spread": spread,
                         "met": None if spread is None else spread < spread_target,
                         "client_cpu_us_per_msg": client, "client_cpu_spread": _spread(client)}
    return merged, spreads


def _spread(values: list[float]) -> float | None:
    """(max - min) / median; None for fewer than 2 values."""
    median = statistics.median(values) if values else 0
    return None if len(values) < 2 or not median else round((max(values) - min(values)) / median, 3)


def absolute(raftlog: dict[str, Any]) -> dict[str, Any]:
    """Each of ABSOLUTE_TARGETS with raftlog's figure and whether it was met."""
    out: dict[str, Any] = {}
    for name, path, op, target in ABSOLUTE_TARGETS:
        ours: Any = raftlog
        for key in path:
            ours = ours.get(key, {}) if isinstance(ours, dict) else None
        value = ours if isinstance(ours, int | float) else None
        met = None if value is None else (value <= target if op == "<=" else value >= target)
        out[name] = {"raftlog": value, "target": f"{op} {target:g}", "met": met}
    return out


def ratios(raftlog: dict[str, Any], js: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, path, js_key, op, target in COMPARISONS:
        ours: Any = raftlog
        for key in path:
            ours = ours.get(key, {}) if isinstance(ours, dict) else None
        theirs = js.get(js_key) if js else None
        ratio = ours / theirs if isinstance(ours, int | float) and theirs else None
        met = None
        if ratio is not None and op is not None and target is not None:
            met = ratio >= target if op == ">=" else ratio <= target
        out[name] = {
            "raftlog": ours if isinstance(ours, int | float) else None,
            "jetstream": theirs,
            "ratio": None if ratio is None else round(ratio, 3),
            "target": None if op is None else f"{op} {target:g}",
            "met": met,
        }
    return out


def table(document: dict[str, Any]) -> str:
    """The run's figures, and the ratios when the peer ran, as text for stderr."""
    rl = document["raftlog"]
    rows: list[tuple[str, str, str]] = []

    def phase(label: str, figures: dict[str, Any], *, latency: bool) -> None:
        text = f"{figures['msgs_per_s']:,.0f} msgs/s"
        if latency:
            text += f", p50 {figures['p50_ms']:.3f} / p99 {figures['p99_ms']:.3f} ms"
        cpu = f"{figures.get('server_cpu_pct', 0):.0f}% / {figures.get('client_cpu_pct', 0):.0f}%"
        rows.append((label, text, cpu if figures["error"] is None else figures["error"]))

    phase("unary publish, 1 caller", rl["unary_publish"]["callers_1"], latency=True)
    phase("unary publish, 8 callers", rl["unary_publish"]["callers_8"], latency=True)
    phase("batch publish, 100/call", rl["batch_publish"]["batch_100"], latency=False)
    phase("batch publish, 1000/call", rl["batch_publish"]["batch_1000"], latency=False)
    phase("client-streaming publish", rl["stream_publish"], latency=False)
    if "frames_publish" in rl:
        phase("frame streaming, 100/frame", rl["frames_publish"], latency=True)
    for size, figures in rl["fetch_ack"].items():
        depth = figures.get("ack_calls_in_flight")
        label = f"fetch({size.removeprefix('batch_')}) + ack"
        phase(label if depth is None else f"{label}, {depth} Ack calls in flight", figures,
              latency=False)
    for size, figures in rl.get("fetch_carried", {}).items():
        phase(f"fetch({size.removeprefix('batch_')}) carrying acks", figures, latency=False)
    parts = [
        f"raftlog {_setup(document)}, {document['meta']['payload_bytes']} B messages, "
        "fsync before ack",
        fmt.render_table(("phase", "raftlog", "node / client CPU"), rows),
    ]
    for name, item in document.get("targets", {}).items():
        met = {True: "met", False: "NOT met", None: "-"}[item["met"]]
        parts.append(f"{name}: {item['raftlog']} (target {item['target']}: {met})")
    spreads = document.get("spread") or {}
    if any(item["spread"] is not None for item in spreads.values()):
        parts.append(f"spread over {document['meta']['repeat']} runs, (max - min) / median "
                     f"(target < {spread_target:.0%}); figures above are medians")
        parts.append(fmt.render_table(
            ("figure", "runs", "median", "spread", "met", "client CPU/msg spread"),
            [(name, " ".join(_number(v) for v in item["values"]), _number(item["median"]),
              "-" if item["spread"] is None else f"{item['spread']:.0%}",
              {True: "yes", False: "NO", None: "-"}[item["met"]],
              "-" if item.get("client_cpu_spread") is None
              else f"{item['client_cpu_spread']:.0%}")
             for name, item in spreads.items()],
            right_align=(2, 3, 5)))
        parts.append("client CPU/msg spread: the client's CPU per message in that phase, the "
                     "same work in every run; when it moves, the machine's speed moved")
    if document["jetstream"] is not None:
        comparison_rows = [
            (
                name,
                _number(item["raftlog"]),
                _number(item["jetstream"]),
                "-" if item["ratio"] is None else f"{item['ratio']:.2f}x",
                item["target"] or "-",
                {True: "yes", False: "NO", None: "-"}[item["met"]],
            )
            for name, item in document["ratios"].items()
        ]
        parts.append(
            f"raftlog / JetStream R{document['meta']['replicas']} (publish_async window 64, "
            "pull fetch(100)+ack, "
            "sync_publish; JetStream does not fsync per ack)"
        )
        parts.append(
            fmt.render_table(
                ("figure", "raftlog", "JetStream", "ratio", "target", "met"),
                comparison_rows,
                right_align=(1, 2, 3),
            )
        )
    return "\n\n".join(parts)


def _setup(document: dict[str, Any]) -> str:
    replicas = document["meta"]["replicas"]
    return "single node (R1)" if replicas == 1 else f"{replicas}-node cluster (R{replicas})"


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3f}"


def host() -> dict[str, Any]:
    """The machine the run measured on (the JSON's meta.host)."""
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "os": platform.system(),
        "kernel": platform.release(),
        "cpu_model": cpu_model,
        "nproc": os.cpu_count(),
    }


def phase_errors(raftlog: dict[str, Any]) -> list[str]:
    """One line per raftlog phase that failed (`run_raftlog`'s figures)."""
    errors = []
    for group in ("unary_publish", "batch_publish", "fetch_ack", "fetch_carried"):
        errors += [f"{group}.{k}: {v['error']}"
                   for k, v in raftlog.get(group, {}).items() if v["error"]]
    for single in ("stream_publish", "frames_publish"):
        if raftlog.get(single, {}).get("error"):
            errors.append(f"{single}: {raftlog[single]['error']}")
    return errors
