"""The audit's SparkSession: loopback only, no UI, as many shuffle partitions as cores (the
default 200 is waste for an audit on a few cores), UTC. `local[*]` unless a master is given;
under `spark-submit` the master and resources come from spark-submit and are left alone.

Adaptive execution is off and joins broadcast only where the job says so: past the block pass
(one scan with a map-side aggregation) the job is many small-table stages, and AQE runs each
of those as a job of its own (measured on a 30-row export: 65 jobs instead of 27, planning 3x
slower).
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
driver_memory_mb = 2_048
app_name = "raftlog-audit"
# JVM options of the driver and the executors. The throughput collector always: an audit is a
# batch job. The client compiler alone up to `client_compiler_rows_max` message rows: a cold
# JVM spends most of a small audit compiling (measured on local[2]: 20k rows, 15 s cold with
# the client compiler alone, 45 s and twice the CPU with both), while at 10M rows a cold audit
# takes as long either way (21.7 s, 21.8 s) and the optimising compiler's scan is faster once
# warm (8.2 s against 14.0 s).
gc_option = "-XX:+UseParallelGC"
client_compiler_option = "-XX:TieredStopAtLevel=1"
client_compiler_rows_max = 3_000_000


def jvm_options(message_rows: int | None) -> str:
    """The JVM options for an audit of `message_rows` rows (None: not known, a small one)."""
    if message_rows is None or message_rows <= client_compiler_rows_max:
        return f"{gc_option} {client_compiler_option}"
    return gc_option


def under_spark_submit() -> bool:
    """True in the Python driver that `spark-submit` started (it passes the gateway port)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(master: str | None, *, partitions: int | None = None,
                  message_rows: int | None = None) -> SparkSession:
    """`partitions`: spark.sql.shuffle.partitions; by default the cores the session has
    (`defaultParallelism`): after the block pass every shuffle is small, and each partition
    is a task whose scheduling costs more than its rows. `message_rows`: the export's, for
    the JVM options (`jvm_options`)."""
    builder = SparkSession.builder.appName(app_name)
    if master or not under_spark_submit():
        builder = builder.master(master or DEFAULT_MASTER)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.autoBroadcastJoinThreshold": "-1",
        "spark.driver.memory": f"{driver_memory_mb}m",
        "spark.driver.extraJavaOptions": jvm_options(message_rows),
        "spark.executor.extraJavaOptions": jvm_options(message_rows),
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }
    if not under_spark_submit():
        settings |= {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    for key, value in settings.items():
        builder = builder.config(key, value)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.shuffle.partitions",
                   str(partitions or spark.sparkContext.defaultParallelism))
    return spark
