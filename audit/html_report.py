"""The HTML page a person opens: one self-contained file (inline SVG chart, inline CSS).

It shows the verdict, the per-stream summary, divergences per stream and per node as a
stacked bar chart (matplotlib, drawn as SVG), the divergences, the first differing records of
each divergent stream side by side, and the repair plan's actions.
"""

from __future__ import annotations

import html
import io
from collections import Counter
from typing import Any

from raftlog.audit import classes
from raftlog.audit.job import AuditResult
from raftlog.audit.report import stream_summaries

rows_shown_max = 500  # divergence rows in the page (the JSON report has them all)
_RECORD_FIELDS = ("epoch", "digest", "subject", "ts_ms", "size", "msg_id")
_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.25em .6em;
text-align:left;font-size:.9em}th{background:#f3f3f3}.clean{color:#176f2c}.bad{color:#b00020}
.auth{background:#eef7ee}.diff{background:#fdecea}code{font-size:.85em}
"""


def render(result: AuditResult, plan: dict[str, Any] | None = None) -> str:
    verdict = ('<p class="clean">Clean: every replica agrees.</p>' if result.clean else
               f'<p class="bad">{len(result.divergences)} divergences.</p>')
    spark = result.spark
    parts = [
        f"<h1>raftlog audit</h1><p>Input <code>{_e(result.exports.root)}</code>, cluster "
        f"<code>{_e(result.exports.cluster[:16] or '-')}</code>, Spark "
        f"<code>{_e(spark.get('master'))}</code> ({_e(spark.get('version'))}), "
        f"{result.figures['message_rows']:,} message rows in "
        f"{result.figures['classify_s']:.1f} s.</p>", verdict,
        *[f"<p>{_e(line)}</p>" for line in result.note_lines()],
        _summary(result), _chart(result), _divergences(result), _records(result),
        _plan(plan), _meanings()]
    return ("<!doctype html><html><head><meta charset='utf-8'><title>raftlog audit</title>"
            f"<style>{_STYLE}</style></head><body>{''.join(parts)}</body></html>\n")


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _table(header: list[str], rows: list[list[Any]], *, classes_of: list[str] | None = None
           ) -> str:
    head = "".join(f"<th>{_e(cell)}</th>" for cell in header)
    body = "".join(
        f"<tr class='{(classes_of or [''] * len(rows))[i]}'>"
        + "".join(f"<td>{_e(cell)}</td>" for cell in row) + "</tr>"
        for i, row in enumerate(rows))
    return f"<table><tr>{head}</tr>{body}</table>"


def _summary(result: AuditResult) -> str:
    rows = stream_summaries(result)
    shown = [name for name in classes.ORDER if any(name in row["divergences"] for row in rows)]
    return "<h2>Streams</h2>" + _table(
        ["stream", "replicas", "primary", "head", "committed end", *shown],
        [[row["stream"], ", ".join(row["replicas"]) or "(unknown to the metadata)",
          row["primary"], row["head"], row["committed_end"],
          *[row["divergences"].get(name, "") for name in shown]] for row in rows])


def _chart(result: AuditResult) -> str:
    if result.clean:
        return ""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(1, 2, figsize=(11, 0.5 + 0.35 * max(
        len({d.stream for d in result.divergences}), len({d.node for d in result.divergences}),
        4)))
    for axis, key, title in ((axes[0], "stream", "per stream"), (axes[1], "node", "per node")):
        counts: dict[str, Counter[str]] = {}
        for item in result.divergences:
            counts.setdefault(getattr(item, key), Counter())[item.cls] += 1
        labels = sorted(counts)
        left = [0] * len(labels)
        for name in classes.ORDER:
            values = [counts[label].get(name, 0) for label in labels]
            if any(values):
                axis.barh(labels, values, left=left, label=name)
                left = [a + b for a, b in zip(left, values, strict=True)]
        axis.set_title(f"divergences {title}")
        axis.xaxis.get_major_locator().set_params(integer=True)
        axis.invert_yaxis()
    axes[1].legend(fontsize="small", loc="lower right")
    figure.tight_layout()
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")
    pyplot.close(figure)
    svg = buffer.getvalue()
    return "<h2>Divergences</h2>" + svg[svg.index("<svg"):]


def _divergences(result: AuditResult) -> str:
    if result.clean:
        return ""
    shown = result.divergences[:rows_shown_max]
    more = len(result.divergences) - len(shown)
    rows = [[d.stream, d.node, d.cls, d.span(), d.seqs or "",
             f"{d.consumer} ({d.holder})" if d.consumer else "", ", ".join(d.sources),
             _brief(d.evidence)] for d in shown]
    note = f"<p>{more} more in report.json.</p>" if more > 0 else ""
    return _table(["stream", "node", "class", "seqs", "count", "consumer", "sources",
                   "evidence"], rows) + note


def _brief(evidence: dict[str, Any]) -> str:
    keep = ("epoch", "authority_epoch", "digest", "authority_digest", "committed_end", "head",
            "heads", "reasons", "problems", "differs", "set")
    return ", ".join(f"{key}={evidence[key]}" for key in keep if evidence.get(key) is not None)


def _records(result: AuditResult) -> str:
    firsts: dict[str, int] = {}
    for item in result.divergences:
        if item.cls in classes.RECORD_CLASSES and item.first_seq is not None:
            firsts[item.stream] = min(firsts.get(item.stream, item.first_seq), item.first_seq)
    if not firsts:
        return ""
    parts = ["<h2>First differing records</h2>"]
    for stream, seq in sorted(firsts.items()):
        records = {row["node"]: row for row in result.records.get((stream, seq), [])}
        authority = {d.evidence.get("authority_digest_hash") for d in result.divergences
                     if d.stream == stream and d.first_seq == seq} - {None}
        nodes = sorted(records)
        header = ["field", *[f"{node} (authority)" if records[node]["digest_hash"] in authority
                             else node for node in nodes]]
        rows = [[name, *[records[node].get(name) for node in nodes]] for name in _RECORD_FIELDS]
        differs = ["diff" if len({str(r[i]) for i in range(1, len(r))}) > 1 else ""
                   for r in rows]
        missing = [d.node for d in result.divergences if d.stream == stream
                   and d.first_seq == seq and d.node not in records]
        note = f"<p>No record at this seq on: {_e(', '.join(missing))}.</p>" if missing else ""
        parts.append(f"<h3>{_e(stream)} seq {seq}</h3>" + _table(header, rows,
                                                               classes_of=differs) + note)
    return "".join(parts)


def _plan(plan: dict[str, Any] | None) -> str:
    if not plan or not (plan["actions"] or plan["unplanned"]):
        return ""
    rows = [[a["node"], a["stream"], a["action"], _action_detail(a),
             "yes" if a["touches_committed"] else "", a["why"]] for a in plan["actions"]]
    skipped = [[s["divergence"], s["reason"]] for s in plan["unplanned"]]
    return ("<h2>Repair plan</h2>" + _table(
        ["node", "stream", "action", "what", "touches committed", "why"], rows)
        + ("<h3>Not planned</h3>" + _table(["divergence", "reason"], skipped)
           if skipped else ""))


def _action_detail(action: dict[str, Any]) -> str:
    kind = action["action"]
    if kind == "truncate":
        return f"after seq {action['after_seq']}"
    if kind == "copy":
        return f"seqs {action['first_seq']}-{action['last_seq']} from {action['from_node']}"
    if kind == "reseed":
        return f"from {action['from_node']}"
    return (f"{action['consumer']} ({action['holder']}): delivered {action['delivered_seq']}, "
            f"ack floor {action['ack_floor']}")


def _meanings() -> str:
    return "<h2>Classes</h2>" + _table(["class", "meaning"], [
        [name, classes.MEANING[name]] for name in classes.ORDER])
