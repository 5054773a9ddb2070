"""What one GPU shares: its compute stream (slowed while NCCL kernels run beside it) and its links.

Both are fluid servers in simpy. A job brings work in seconds at full rate; the server's jobs progress
together, each at ``rate / n`` with n jobs in service (processor sharing). A link (the GPU's NVLink/PCIe
port, or its share of the node's NICs) serves the transfer part of every collective in flight on it, so
two collectives at the same time each take twice as long as alone and the link is never busier than the
step is long. The compute stream serves one kernel sequence at a time at rate 1, or ``1 / (1 + i)`` while
any collective of this GPU is in flight (NCCL kernels occupy SMs and memory bandwidth; ``i`` is
``cluster.comm_compute_interference``); when that changes mid-kernel, the rest of the kernel runs at the
new rate. Every resource keeps its busy time and total work, which the bounds and the breakdown use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from simddp.collectives import CollectiveCost

#: Work below this many seconds counts as done (floating-point residue of rate changes)...
_EPS_S = 1e-15
#: ... or below this fraction of the current time, where a smaller remainder could not move the clock.
_EPS_REL = 1e-13


@dataclass
class _Job:
    remaining_s: float
    done: simpy.Event


@dataclass
class FluidServer:
    """Jobs progress together at ``rate() / n`` each (n jobs in service)."""

    env: simpy.Environment
    name: str
    rate: Callable[[], float]
    jobs: list[_Job] = field(default_factory=list)
    busy_s: float = 0.0  # time with at least one job in service
    work_s: float = 0.0  # total work submitted (seconds at full rate)
    _last: float = 0.0
    _rate_now: float = 1.0
    _version: int = 0

    def submit(self, work_s: float) -> simpy.Event:
        """An event that fires when ``work_s`` seconds of full-rate work are done."""
        done = self.env.event()
        if work_s <= 0:
            done.succeed()
            return done
        self.work_s += work_s
        self._advance()
        self.jobs.append(_Job(work_s, done))
        self._schedule()
        return done

    def rerate(self) -> None:
        """The rate may have changed: settle progress at the old rate, plan at the new one."""
        if self.jobs:
            self._advance()
            self._schedule()
        else:
            self._rate_now = self.rate()

    def _advance(self) -> None:
        now = self.env.now
        n = len(self.jobs)
        if n:
            share = (now - self._last) * self._rate_now / n
            for job in self.jobs:
                job.remaining_s -= share
            self.busy_s += now - self._last
        self._last = now

    def _schedule(self) -> None:
        self._version += 1
        self._rate_now = self.rate()
        eps = max(_EPS_S, self.env.now * _EPS_REL)
        finished = [j for j in self.jobs if j.remaining_s <= eps]
        if finished:
            self.jobs = [j for j in self.jobs if j.remaining_s > eps]
            for job in finished:
                job.done.succeed()
        if not self.jobs:
            return
        n = len(self.jobs)
        delay = min(j.remaining_s for j in self.jobs) * n / self._rate_now
        version = self._version

        def wake(_: simpy.Event) -> None:
            if version == self._version:
                self._advance()
                self._schedule()

        self.env.timeout(delay).callbacks.append(wake)


class Gpu:
    """One simulated GPU (every rank of its data- and tensor-parallel group behaves the same)."""

    def __init__(self, env: simpy.Environment, interference: float, name: str = "") -> None:
        self.env = env
        self.name = name
        self.interference = interference
        self.comm_in_flight = 0
        self.compute = FluidServer(env, "compute", self._compute_rate)
        self.links = {tier: FluidServer(env, tier, lambda: 1.0) for tier in ("intra", "inter")}
        # One NCCL stream per communicator: collectives of one group run one after another.
        self.streams: dict[str, simpy.Resource] = {}

    def _compute_rate(self) -> float:
        return 1.0 / (1.0 + self.interference) if self.comm_in_flight else 1.0

    def run(self, work_s: float) -> simpy.Event:
        """Kernels worth ``work_s`` seconds at full rate on the compute stream."""
        return self.compute.submit(work_s)

    def stream(self, name: str) -> simpy.Resource:
        if name not in self.streams:
            self.streams[name] = simpy.Resource(self.env, 1)
        return self.streams[name]

    def collective(self, cost: CollectiveCost, stream: str) -> simpy.events.ProcessGenerator:
        """Run one collective on its communicator's stream: the hops, then the transfer on its link.

        Returns (start, end) of the collective itself (after waiting for its stream).
        """
        times = yield from self.collectives((cost,), stream)
        return times[0]

    def collectives(self, costs: tuple[CollectiveCost, ...], stream: str) -> simpy.events.ProcessGenerator:
        """Collectives issued together on one stream: they run back to back, before anything issued later.

        Returns the (start, end) of each.
        """
        times = []
        with self.stream(stream).request() as turn:
            yield turn
            for cost in costs:
                start = self.env.now
                if cost.time_s > 0:
                    yield from self._run(cost)
                times.append((start, self.env.now))
        return times

    def _run(self, cost: CollectiveCost) -> simpy.events.ProcessGenerator:
        slows = 1 if cost.sm_interference else 0  # NCCL kernels take SMs; host-staged gloo does not
        self.comm_in_flight += slows
        self.compute.rerate()
        if cost.latency_s > 0:
            yield self.env.timeout(cost.latency_s)
        yield self.links[cost.tier].submit(cost.transfer_s)
        self.comm_in_flight -= slows
        self.compute.rerate()
