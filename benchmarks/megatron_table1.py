"""Reproduce Narayanan et al. (SC'21) Table 1: GPT weak scaling on DGX A100 (Selene), 1.7B to 1T.

Configurations from the paper's Table 1 and NVIDIA/Megatron-LM examples/sc21/CONFIG.sh (micro-batch
sizes, interleaving); vocab 51,200, sequence 2048, fp16, full (uniform) activation recompute. The paper
reports achieved TFLOP/s per GPU from its eq. 3, F = 96 B s l h^2 (1 + s/6h + V/16lh), which counts the
recompute forward; we apply the same formula to the simulated step time.

    python benchmarks/megatron_table1.py
"""

from __future__ import annotations

import simddp

# (params B, heads, hidden, layers, tp, pp, gpus, batch, micro-batch, virtual stages, published TFLOP/s)
TABLE1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 16, 1, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 16, 1, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 16, 1, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 8, 1, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 4, 1, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 2, 3, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 2, 2, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 1, 2, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 1, 3, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 1, 1, 163),
]


def scenario(row: tuple) -> dict:
    _, heads, hidden, layers, tp, pp, gpus, batch, mbs, v, _ = row
    return {
        "name": f"megatron-{row[0]}B",
        "cluster": {"preset": "dgx-a100-80gb", "num_nodes": gpus // 8},
        "model": {"transformer": {"num_layers": layers, "hidden_size": hidden, "num_heads": heads,
                                  "ffn_hidden_size": 4 * hidden, "vocab_size": 51200,
                                  "max_position_embeddings": 2048}},
        "parallelism": {"tp": tp, "pp": pp,
                        "pipeline_schedule": "interleaved-1f1b" if v > 1 else "1f1b", "virtual_stages": v},
        "training": {"precision": "fp16-mixed", "micro_batch_size": mbs, "global_batch_size": batch,
                     "seq_len": 2048, "recompute": "full"},
    }


def eq3_flop(row: tuple) -> float:
    _, _, h, layers, *_ = row
    batch, s, vocab = row[7], 2048, 51200
    return 96 * batch * s * layers * h**2 * (1 + s / (6 * h) + vocab / (16 * layers * h))


def main() -> list[tuple[float, float, float]]:
    print("| model | GPUs | tp | pp | v | published TFLOP/s/GPU | simddp | error | bubble | TP comm | exposed DP |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    out = []
    for row in TABLE1:
        r = simddp.simulate(scenario(row), trace=False)
        tflops = eq3_flop(row) / r.step_time_s / row[6] / 1e12
        err = tflops / row[-1] - 1
        out.append((row[0], row[-1], tflops))
        print(f"| {row[0]}B | {row[6]} | {row[4]} | {row[5]} | {row[9]} | {row[-1]} | {tflops:.0f} | {err:+.1%} | "
              f"{r.pipeline_bubble_time_s / r.step_time_s:.1%} | {r.tp_comm_time_s / r.step_time_s:.1%} | "
              f"{(r.exposed_comm_time_s - r.tp_comm_time_s) / r.step_time_s:.1%} |")
    errs = [abs(t / p - 1) for _, p, t in out]
    print(f"\nMAPE {sum(errs) / len(errs):.1%}, max {max(errs):.1%}")
    return out


if __name__ == "__main__":
    main()
