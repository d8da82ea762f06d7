"""The audit's readable results: the summary table for the terminal and the JSON report.

Both are pure functions of an `AuditResult`; the HTML page is `html_report.py`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from raftlog.audit import classes
from raftlog.audit.job import AuditResult

REPORT_FORMAT = "raftlog-audit-report"
REPORT_VERSION = 1


def stream_summaries(result: AuditResult) -> list[dict[str, Any]]:
    """Per stream (known to the metadata or held by some node): replicas, primary, the
    authoritative seq range and the divergences per class."""
    counts: dict[str, Counter[str]] = {}
    for item in result.divergences:
        counts.setdefault(item.stream, Counter())[item.cls] += 1
    rows: list[dict[str, Any]] = []
    for stream in result.streams:
        head, end = stream["head"] or 1, stream["committed_end"] or 0
        rows.append({"stream": stream["stream"], "replicas": list(stream["replicas"] or ()),
                     "primary": stream["primary"], "head": head, "committed_end": end,
                     "seqs": max(0, end - head + 1),
                     "divergences": dict(counts.pop(stream["stream"], Counter()))})
    for name, counter in sorted(counts.items()):  # streams the metadata does not know
        rows.append({"stream": name, "replicas": [], "primary": None, "head": None,
                     "committed_end": None, "seqs": None, "divergences": dict(counter)})
    return rows


def summary_table(result: AuditResult) -> str:
    rows = stream_summaries(result)
    shown = [name for name in classes.ORDER if any(name in row["divergences"] for row in rows)]
    header = ["stream", "replicas", "primary", "seqs", *shown]
    lines = [header] + [[
        row["stream"], ",".join(row["replicas"]) or "(unknown)", row["primary"] or "-",
        "-" if row["seqs"] is None else f"{row['head']}..{row['committed_end']} ({row['seqs']:,})",
        *[str(row["divergences"].get(name, "")) for name in shown]] for row in rows]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    text = "\n".join("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths,
                                                                           strict=True)).rstrip()
                     for line in lines)
    figures = result.figures
    verdict = ("clean: every replica agrees" if result.clean else
               f"{len(result.divergences)} divergences")
    notes = "".join(f"\n{line}" for line in result.note_lines())
    return (f"{text}\n\n{verdict} ({figures['streams']} streams, {figures['nodes']} nodes, "
            f"{figures['message_rows']:,} message rows, {figures['classify_s']:.1f} s){notes}")


def report_json(result: AuditResult, *, plan_file: str | None = None) -> dict[str, Any]:
    exports = result.exports
    return {
        "format": REPORT_FORMAT, "version": REPORT_VERSION, "input": str(exports.root),
        "clean": result.clean,
        "inputs": {
            "cluster": exports.cluster, "members": list(exports.members),
            "not_exported": list(exports.not_exported), "warnings": list(exports.warnings),
            "nodes": [{"node": n.node, "directory": str(n.directory),
                       "source": n.manifest.source, "exported_ms": n.manifest.exported_ms,
                       "applied_index": n.manifest.applied_index, "rows": n.rows}
                      for n in exports.nodes]},
        "spark": result.spark, "timing_s": result.timing_s, "figures": result.figures,
        "classes": classes.MEANING,
        "streams": stream_summaries(result),
        "divergences": [item.to_json() for item in result.divergences],
        "notes": [item.to_json() for item in result.notes],
        "records": [{"stream": stream, "seq": seq, "records": rows}
                    for (stream, seq), rows in sorted(result.records.items())],
        "plan": plan_file,
    }
