"""The timeline of a chaos run: acknowledged messages per second and write latency (p50, p99)
over time, each fault's window shaded and its start marked, each failover (the first write a
new epoch acknowledged) marked, as a PNG (matplotlib) and an HTML page that embeds it beside
the verdict and the fault table.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from raftlog.chaos.checks.availability import percentile
from raftlog.chaos.checks.calls import calls
from raftlog.chaos.checks.primaries import failovers
from raftlog.chaos.events import NEMESIS, PROBE, PUBLISH, PUBLISH_BATCH, Op, get_ints, get_str

bin_s = 1.0  # one point per second
figure_size_in = (11.0, 6.0)
figure_dpi = 110
WRITES = frozenset({PUBLISH, PUBLISH_BATCH, PROBE})


@dataclass(frozen=True)
class Bin:
    start_t: float
    acked: int  # messages acknowledged in this second
    p50_ms: float | None  # latency of the write calls that completed in it
    p99_ms: float | None


@dataclass(frozen=True)
class FaultSpan:
    name: str
    start_t: float
    stop_t: float
    targets: str


def bins(history: Sequence[Op]) -> list[Bin]:
    """Acknowledged messages and write latency per second of the run."""
    acked: dict[int, int] = {}
    latencies: dict[int, list[float]] = {}
    for call in calls(history):
        if call.f not in WRITES or not call.ok or call.completion is None:
            continue
        slot = int(call.completion.t // bin_s)
        if call.f == PROBE:
            count = 1
        else:
            count = sum(1 for seq in get_ints(call.completion.value, "seqs") if seq)
        acked[slot] = acked.get(slot, 0) + count
        latencies.setdefault(slot, []).append((call.completion.t - call.invoke.t) * 1000)
    last = max([*acked, *latencies, 0])
    points = []
    for slot in range(last + 1):
        ordered = sorted(latencies.get(slot, []))
        points.append(Bin(slot * bin_s, acked.get(slot, 0), percentile(ordered, 0.5),
                          percentile(ordered, 0.99)))
    return points


def fault_spans(history: Sequence[Op]) -> list[FaultSpan]:
    """Each fault's window, from its start event to its stop event."""
    open_at: dict[str, tuple[float, str]] = {}
    spans = []
    end_t = history[-1].t if history else 0.0
    for op in history:
        if op.process != NEMESIS:
            continue
        targets = ",".join(str(t) for t in op.value.get("targets", []) or [])  # type: ignore[union-attr]
        if get_str(op.value, "phase") == "start":
            open_at[op.f] = (op.t, targets)
        elif op.f in open_at:
            start_t, named = open_at.pop(op.f)
            spans.append(FaultSpan(op.f, start_t, op.t, named))
    spans += [FaultSpan(name, start_t, end_t, named)
              for name, (start_t, named) in open_at.items()]
    return sorted(spans, key=lambda span: span.start_t)


def write_png(history: Sequence[Op], path: Path, *, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = bins(history)
    spans = fault_spans(history)
    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=figure_size_in)
    xs = [p.start_t for p in points]
    top.plot(xs, [p.acked for p in points], color="tab:blue", linewidth=1.2,
             drawstyle="steps-post")
    top.set_ylabel("acknowledged msgs/s")
    bottom.plot(xs, [p.p50_ms if p.p50_ms is not None else float("nan") for p in points],
                color="tab:green", linewidth=1.0, label="p50")
    bottom.plot(xs, [p.p99_ms if p.p99_ms is not None else float("nan") for p in points],
                color="tab:red", linewidth=1.0, label="p99")
    bottom.set_ylabel("write latency, ms")
    bottom.set_yscale("log")
    bottom.set_xlabel("seconds since the run started")
    bottom.legend(loc="upper right")
    for axis in (top, bottom):
        for span in spans:
            axis.axvspan(span.start_t, span.stop_t, color="tab:orange", alpha=0.18)
            axis.axvline(span.start_t, color="tab:orange", linewidth=0.8)
        axis.grid(alpha=0.3)
    for span in spans:
        top.annotate(f"{span.name} {span.targets}", (span.start_t, 0), xycoords=(
            "data", "axes fraction"), xytext=(2, 2), textcoords="offset points", fontsize=7,
            rotation=90, va="bottom")
    changes = failovers(history)
    for change in changes:
        for axis in (top, bottom):
            axis.axvline(change.t, color="tab:purple", linewidth=1.0, linestyle="--")
        top.annotate(f"epoch {change.epoch}: {change.node}", (change.t, 1), xycoords=(
            "data", "axes fraction"), xytext=(2, -2), textcoords="offset points", fontsize=7,
            rotation=90, va="top", color="tab:purple")
    if changes:
        top.plot([], [], color="tab:purple", linestyle="--", label="failover (new epoch)")
        top.legend(loc="upper right")
    top.set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=figure_dpi)
    plt.close(figure)
    return path


def write_html(history: Sequence[Op], path: Path, *, png: Path, title: str,
               summary: str, audit: str = "", audit_link: str = "") -> Path:
    """A page with the chart, the verdict, the audit's summary (with a link to its page,
    `audit_link`, relative to this one) and the table of faults."""
    image = base64.b64encode(png.read_bytes()).decode()
    audited = (f"<h2>Audit</h2><pre>{html.escape(audit)}</pre>" if audit else "") + (
        f"<p><a href='{html.escape(audit_link, quote=True)}'>the audit's report</a></p>"
        if audit_link else "")
    rows = "".join(
        f"<tr><td>{html.escape(s.name)}</td><td>{html.escape(s.targets)}</td>"
        f"<td>{s.start_t:.1f}</td><td>{s.stop_t:.1f}</td></tr>" for s in fault_spans(history))
    changes = "".join(
        f"<tr><td>{html.escape(c.stream)}</td><td>{c.epoch}</td><td>{html.escape(c.node)}</td>"
        f"<td>{c.t:.1f}</td></tr>" for c in failovers(history))
    path.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 10px}"
        "pre{background:#f4f4f4;padding:1em}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><img alt='timeline' src='data:image/png;base64,{image}'>"
        f"<h2>Verdict</h2><pre>{html.escape(summary)}</pre>{audited}<h2>Faults</h2>"
        "<table><tr><th>fault</th><th>targets</th><th>start s</th><th>stop s</th></tr>"
        f"{rows}</table><h2>Failovers (first acknowledgement in a new epoch)</h2>"
        "<table><tr><th>stream</th><th>epoch</th><th>primary</th><th>at s</th></tr>"
        f"{changes}</table></body></html>\n", encoding="utf-8")
    return path
