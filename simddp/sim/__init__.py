"""The step simulator: builds the workload, buckets and costs of a scenario and runs simpy."""

from simddp.sim.step import simulate_step

__all__ = ["simulate_step"]
