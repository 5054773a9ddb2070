"""The step simulator: builds the workload, buckets and costs of a scenario and runs simpy."""

from simddp.sim.plan import build_plan, rank_gradients
from simddp.sim.step import run_plan, simulate_step

__all__ = ["build_plan", "rank_gradients", "run_plan", "simulate_step"]
