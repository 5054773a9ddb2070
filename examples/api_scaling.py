"""Python API example: how exposed communication grows with the number of H100 nodes for Llama-3-8B.

    python examples/api_scaling.py
"""

import simddp
from simddp.units import fmt_time

for nodes in (1, 2, 4, 8, 16, 32, 64, 128):
    result = simddp.simulate(
        {
            "cluster": {"preset": "dgx-h100-80gb", "num_nodes": nodes},
            "model": {"preset": "llama3-8b"},
            "training": {"micro_batch_size": 1, "seq_len": 8192},
            "ddp": {"bucket_cap_mb": 25},
        },
        trace=False,
    )
    print(
        f"{result.num_gpus:5d} GPUs  step {fmt_time(result.step_time_s):>10}  "
        f"exposed comm {result.exposed_comm_fraction:6.1%}  efficiency {result.scaling_efficiency:6.1%}"
    )
