"""Python API example: Llama-3-8B (ZeRO-2, so that Adam states and gradients fit) on 1 to 128 DGX H100 nodes.

Per-GPU work is constant (weak scaling); the ring latency grows with the ranks, NCCL switches algorithm,
and the table shows how much of the step communication takes at each size.

    python examples/api_scaling.py
"""

import simddp
from simddp.units import fmt_time

for nodes in (1, 2, 4, 8, 16, 32, 64, 128):
    result = simddp.simulate(
        {
            "cluster": {"preset": "dgx-h100-80gb", "num_nodes": nodes},
            "model": {"preset": "llama3-8b"},
            "parallelism": {"zero_stage": 2},
            "training": {"micro_batch_size": 1, "seq_len": 8192, "recompute": "selective"},
            "ddp": {"bucket_cap_mb": 25, "gradient_as_bucket_view": True},
        },
        trace=False,
    )
    print(
        f"{result.num_gpus:5d} GPUs  step {fmt_time(result.step_time_s):>10}  "
        f"exposed comm {result.exposed_comm_fraction:6.1%}  efficiency {result.scaling_efficiency:6.1%}  "
        f"memory {result.memory.verdict() if result.memory else '-'}"
    )
