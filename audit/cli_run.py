"""`raftlog audit run --input DIR [--master URL] [--out DIR] [--plan FILE]` (and, registered
from here, `raftlog audit cluster up|down`).

Exit status: 0 when every replica agrees, 1 when divergences were found, 2 for bad input.
Progress goes to stderr, the summary table to stdout; the JSON report, the HTML page and the
repair plan to files (`--out`, by default DIR/.audit, which the input checks skip).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from pyspark.sql import SparkSession

from raftlog.audit import cli_cluster, html_report, plan, report, schema, session
from raftlog.audit.inputs import BadInput, check_exports
from raftlog.audit.job import AuditResult, audit
from raftlog.audit.progress import Progress

EXIT_CLEAN = 0
EXIT_DIVERGENT = 1
EXIT_BAD_INPUT = 2
DEFAULT_OUT = ".audit"  # under the input directory


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "run", help="audit an export with Spark: classify every divergence, write the "
        "report and a repair plan")
    add_arguments(parser)
    parser.set_defaults(run=run)
    cli_cluster.register(commands)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, type=Path,
                        help="the export directory (one subdirectory per node)")
    parser.add_argument("--master", default=None,
                        help=f"Spark master URL (default {session.DEFAULT_MASTER}; under "
                        "spark-submit, spark-submit's)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"where report.json, report.html and plan.json go "
                        f"(default INPUT/{DEFAULT_OUT})")
    parser.add_argument("--plan", type=Path, default=None,
                        help="where the repair plan goes (default OUT/plan.json)")
    parser.add_argument("--partitions", type=int, default=None,
                        help="spark.sql.shuffle.partitions (default: the session's cores)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace, *, spark: SparkSession | None = None,
        stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """The command; `spark`: a session to use (and leave running) instead of building one."""
    stdout = stdout or sys.stdout
    progress = Progress(stderr, quiet=args.quiet)
    try:
        exports = check_exports(args.input)
    except BadInput as error:
        print(f"raftlog audit: bad input: {error}", file=stderr or sys.stderr)
        return EXIT_BAD_INPUT
    for warning in exports.warnings:
        progress.say(f"warning: {warning}")
    owned = spark is None
    with progress.phase("session", f"starting Spark ({args.master or session.DEFAULT_MASTER})"):
        spark = spark or session.build_session(
            args.master, partitions=args.partitions,
            message_rows=exports.rows(schema.MESSAGES_FILE))
    try:
        result = audit(spark, exports, progress)
    finally:
        if owned:
            spark.stop()
    write_outputs(result, args, progress)
    print(report.summary_table(result), file=stdout)
    return EXIT_CLEAN if result.clean else EXIT_DIVERGENT


def write_outputs(result: AuditResult, args: argparse.Namespace, progress: Progress) -> None:
    out: Path = args.out or args.input / DEFAULT_OUT
    out.mkdir(parents=True, exist_ok=True)
    plan_path: Path = args.plan or out / "plan.json"
    repair = plan.build_plan(result.divergences, input_dir=str(args.input),
                             created_ms=int(time.time() * 1000))
    _write_json(plan_path, repair)
    document = report.report_json(result, plan_file=str(plan_path))
    document["timing_s"]["total"] = round(progress.elapsed_s(), 3)
    _write_json(out / "report.json", document)
    (out / "report.html").write_text(html_report.render(result, repair), encoding="utf-8")
    progress.say(f"wrote {out / 'report.json'}, {out / 'report.html'}, {plan_path} "
                 f"({len(repair['actions'])} actions)")


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, sort_keys=False, default=str) + "\n",
                    encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """`run` alone, for `spark-submit audit/job_main.py --input DIR ...`."""
    parser = argparse.ArgumentParser(prog="raftlog-audit-job", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
