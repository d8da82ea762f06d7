"""The audit tests' one SparkSession (local[2], 2 shuffle partitions, the job's settings),
shared by the whole session and stopped at its end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from raftlog.audit import session

test_partitions = 2


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    active = session.build_session("local[2]", partitions=test_partitions)
    try:
        yield active
    finally:
        active.stop()
