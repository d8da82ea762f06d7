"""A primary that restarts does not resume leading at its old fence epoch (the Raft rule: a
restarted leader never resumes its term). Its copy may have lost an unsynced tail its replicas
hold (it replicates while it fsyncs); leading on at the same epoch reused those seqs for other
messages, and the replicas diverged (G7, then G1 at the next failover). Now it reports the
stream in trouble and the Raft leader's failover round promotes the most complete copy at a new
epoch. Found by chaos/sim seed 136 with power losses.
"""

from __future__ import annotations

from raftlog.chaos.sim.run import SimConfig, run_schedule

# python -m raftlog.chaos.sim --seed 136 --schedules 1 --nodes 3 --steps 20 --power-loss --strict
RESTART_SEED = 136
RESTART_CONFIG = SimConfig(nodes=3, steps=20, power_loss=True, strict=True)


def test_a_primary_that_lost_its_tail_and_restarts_is_replaced_at_a_new_epoch() -> None:
    verdict = run_schedule(RESTART_SEED, RESTART_CONFIG)
    assert verdict.ok, verdict.report()
    assert verdict.failovers >= 1, "the restarted primary's streams were not failed over"


def test_single_copy_streams_lead_on_after_a_restart() -> None:
    """R1: no other copy can hold what the primary lost; it leads at once, no failover."""
    config = SimConfig(nodes=3, steps=20, power_loss=True, strict=True, replicas=1)
    verdicts = [run_schedule(seed, config) for seed in (RESTART_SEED, 1, 2)]
    failed = [v.report() for v in verdicts if not v.ok]
    assert not failed, "\n\n".join(failed)
    assert all(v.failovers == 0 for v in verdicts), [v.failovers for v in verdicts]

