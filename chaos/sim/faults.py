"""Fault schedules: a seed and a node count make a list of `Fault`s at virtual times, made
before the run (so a schedule can be printed and replayed) by `make_schedule`.

Kinds (all undone by the final heal):
- crash / restart: the node's process dies (kill -9: what it wrote stays in the OS page cache
  and reaches the disk) / starts again;
- power-loss: the node's machine loses power: writes no fsync covered are lost, except a seeded
  prefix of them (off unless asked for: see the report's findings);
- isolate, split, bridge, one-way: partitions (a node alone; two halves; two halves and one node
  that reaches both; some directions only);
- slow-link: latency and retransmissions (loss) on both directions of one link;
- duplicate: unary requests on both directions of one link run twice on the callee;
- reset-link: the connections between two nodes reset (stream calls break);
- slow-disk: a node's fsyncs take longer;
- clock-jump: a node's wall clock steps (forward or back, within the dedupe window);
- election: the Raft leader steps down;
- heal: every partition and slow link ends (crashed nodes stay down);
- quiet: nothing (time passes).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

step_gap_s_min = 0.05  # virtual seconds between two faults, seeded in this range
step_gap_s_max = 0.4
slow_latency_s_min = 0.001  # one-way latency of a slow link, seeded in this range
slow_latency_s_max = 0.15
loss_p_max = 0.3  # share of a slow link's messages that need a retransmission, at most
dup_p_min = 0.1  # share of a duplicating link's unary requests that run twice, in this range
dup_p_max = 0.5
slow_fsync_s_min = 0.002  # a slow disk's fsync, seeded in this range
slow_fsync_s_max = 0.05
clock_jump_ms_max = 30_000  # well inside the default dedupe window (2 min)
clients_cut_p = 0.5  # an isolated node is cut off from the clients too

# kind -> weight (how often it is picked); crash and restart are adjusted to what is down.
WEIGHTS = {"crash": 3, "power-loss": 0, "restart": 4, "isolate": 2, "split": 2, "bridge": 1,
           "one-way": 2, "slow-link": 2, "duplicate": 2, "reset-link": 2, "slow-disk": 1,
           "clock-jump": 1, "election": 1, "heal": 3, "quiet": 2}


@dataclass(frozen=True)
class Fault:
    """One step of a schedule."""

    at_s: float
    kind: str
    nodes: tuple[str, ...] = ()
    others: tuple[str, ...] = ()  # the other side of a partition, or a link's far end
    value: float = 0.0  # latency s, dup share, fsync s, jump ms, or 1.0 = clients cut off too
    extra: float = 0.0  # a slow link's loss share
    bridge: str = ""  # the node that reaches both sides of a bridge partition

    def describe(self) -> str:
        parts = [f"{self.at_s:7.3f}s {self.kind}"]
        if self.nodes:
            parts.append(",".join(self.nodes))
        if self.bridge:
            parts.append(f"<{self.bridge}>")
        if self.others:
            parts.append("| " + ",".join(self.others))
        if self.value or self.extra:
            parts.append(f"{self.value:g} {self.extra:g}")
        return " ".join(parts)


POWER_LOSS_WEIGHT = 2  # the weight of power-loss when a run asks for it


def make_schedule(rng: random.Random, *, nodes: tuple[str, ...], steps: int,
                  power_loss: bool = False) -> list[Fault]:
    """`steps` faults at increasing virtual times (from the first gap on), seeded."""
    weights = dict(WEIGHTS)
    if power_loss:
        weights["power-loss"] = POWER_LOSS_WEIGHT
    schedule: list[Fault] = []
    down: set[str] = set()
    at_s = 0.0
    for _ in range(steps):
        at_s += rng.uniform(step_gap_s_min, step_gap_s_max)
        fault = _one(rng, at_s, nodes=nodes, down=down, weights=weights)
        if fault.kind in ("crash", "power-loss"):
            down.add(fault.nodes[0])
        elif fault.kind == "restart":
            down.discard(fault.nodes[0])
        schedule.append(fault)
    return schedule


def _one(rng: random.Random, at_s: float, *, nodes: tuple[str, ...], down: set[str],
         weights: dict[str, int]) -> Fault:
    weights = dict(weights)
    if not down:
        weights["restart"] = 0
    if len(down) == len(nodes):
        weights["crash"] = weights["power-loss"] = 0
    kind = rng.choices(sorted(weights), weights=[weights[k] for k in sorted(weights)])[0]
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    if kind in ("crash", "power-loss"):
        return Fault(at_s, kind, (rng.choice([n for n in nodes if n not in down]),))
    if kind == "restart":
        return Fault(at_s, kind, (rng.choice(sorted(down)),))
    if kind == "isolate":
        return Fault(at_s, kind, (shuffled[0],), tuple(sorted(shuffled[1:])),
                     value=float(rng.random() < clients_cut_p))
    if kind == "split":
        cut = rng.randint(1, len(nodes) - 1)
        return Fault(at_s, kind, tuple(sorted(shuffled[:cut])), tuple(sorted(shuffled[cut:])))
    if kind == "bridge":
        half = (len(nodes) - 1) // 2
        return Fault(at_s, kind, tuple(sorted(shuffled[1:1 + half])),
                     tuple(sorted(shuffled[1 + half:])), bridge=shuffled[0])
    if kind == "one-way":
        far = rng.randint(2, len(nodes))
        return Fault(at_s, kind, (shuffled[0],), tuple(sorted(shuffled[1:far])))
    if kind == "slow-link":
        return Fault(at_s, kind, (shuffled[0],), (shuffled[1],),
                     value=rng.uniform(slow_latency_s_min, slow_latency_s_max),
                     extra=rng.uniform(0, loss_p_max))
    if kind == "duplicate":
        return Fault(at_s, kind, (shuffled[0],), (shuffled[1],),
                     value=rng.uniform(dup_p_min, dup_p_max))
    if kind == "reset-link":
        return Fault(at_s, kind, (shuffled[0],), (shuffled[1],))
    if kind == "slow-disk":
        return Fault(at_s, kind, (shuffled[0],),
                     value=rng.uniform(slow_fsync_s_min, slow_fsync_s_max))
    if kind == "clock-jump":
        return Fault(at_s, kind, (shuffled[0],),
                     value=float(rng.randint(-clock_jump_ms_max, clock_jump_ms_max)))
    return Fault(at_s, kind)
