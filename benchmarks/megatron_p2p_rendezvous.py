"""Experiment: does Megatron-LM's blocking, batched send/recv explain the Table 1 over-prediction? (No.)

Narayanan et al. Table 1's pipelined rows are over-predicted by 3-11% (docs/validation.md). One hypothesis:
Megatron's schedules (``megatron/schedules.py`` of 2021) communicate through ``p2p_communication``, whose
``_communicate`` posts sends and receives together with ``torch.distributed.batch_isend_irecv``, waits on
all of them and synchronises the device; an activation message (tens to hundreds of MB) is larger than
NCCL's buffers, so a send completes only once its receiver has posted the matching receive. A stage may
therefore wait for its neighbour to *reach* a call, not only for the data (a rendezvous); the interleaved
schedule also sends a forward's output only after the backward that follows it in the same iteration
(``send_forward_backward_recv_forward_backward``).

This script replays each rank's program exactly as Megatron's 2021 schedules issue it (warm-up, 1F1B and
cool-down loops, their ``recv_prev`` / ``recv_next`` flags, FIFO matching per channel) with the operation
and send/recv times of simddp's plan, and compares the schedule's end with simddp's model (a send blocks
its sender for the transfer; a receiver waits for the data). Nothing here changes simddp; the result is in
docs/validation.md.

    python benchmarks/megatron_p2p_rendezvous.py
"""

from __future__ import annotations

from typing import Any

import megatron_table1 as mt

import simddp
from simddp.sim import fast
from simddp.sim.pipeline import PipeOp
from simddp.sim.plan import StepPlan, build_plan

# A program item: ("C", op) computes; ("X", send_next, send_prev, recv_prev, recv_next) is one blocking call.
Item = tuple[Any, ...]


def programs(plan: StepPlan) -> list[list[Item]]:
    """Each rank's computations and blocking p2p calls, in Megatron's (2021) order."""
    par = plan.scenario.parallelism
    p, v, m = par.pp, par.virtual_stages, plan.num_micro_batches
    last_vs = p * v - 1
    out = []
    for r, ops in enumerate(plan.ops):
        prog: list[Item] = []

        def call(sn: PipeOp | None = None, sp: PipeOp | None = None, rp: bool = False, rn: bool = False,
                 prog: list[Item] = prog) -> None:
            if sn is not None or sp is not None or rp or rn:
                prog.append(("X", sn, sp, rp, rn))

        fwd = [o for o in ops if o.kind == "F"]
        bwd = [o for o in ops if o.kind == "B"]
        first, last = r == 0, r == p - 1
        if v == 1:  # forward_backward_pipelining_without_interleaving
            w = min(p - r - 1, m)
            rem = m - w
            for i in range(w):
                call(rp=not first)
                prog.append(("C", fwd[i]))
                call(sn=None if last else fwd[i])
            if rem:
                call(rp=not first)
            for i in range(rem):
                prog.append(("C", fwd[w + i]))
                call(sn=None if last else fwd[w + i], rn=not last)
                prog.append(("C", bwd[i]))
                call(sp=None if first else bwd[i], rp=not first and i != rem - 1)
            for i in range(rem, m):
                call(rn=not last)
                prog.append(("C", bwd[i]))
                call(sp=None if first else bwd[i])
        else:  # forward_backward_pipelining_with_interleaving
            total = m * v
            all_warmup = m == p
            w = total if all_warmup else min((p - r - 1) * 2 + (v - 1) * p, total)
            rem = total - w

            def chunk(k: int, forward: bool) -> int:
                c = (k % (p * v)) // p
                return c if forward else v - c - 1

            call(rp=not first)
            for k in range(w):
                prog.append(("C", fwd[k]))
                rp = not (first and chunk(k + 1, True) == 0) and k != total - 1
                sn = None if fwd[k].virtual_stage == last_vs else fwd[k]
                call(sn=sn, rp=rp, rn=(k == w - 1 and not all_warmup and not last))
            for k in range(rem):
                fk = k + w
                prog.append(("C", fwd[fk]))
                prog.append(("C", bwd[k]))
                rp = not (first and chunk(fk - (p - 1), True) == v - 1) and k != rem - 1
                rn = not (last and chunk(k - (p - 1), False) == 0)
                call(sn=None if fwd[fk].virtual_stage == last_vs else fwd[fk],
                     sp=None if bwd[k].virtual_stage == 0 else bwd[k], rp=rp, rn=rn)
            if all_warmup:
                call(rn=not last)
            for k in range(rem, total):
                prog.append(("C", bwd[k]))
                rn = not (last and chunk(k + 1, False) == v - 1) and k != total - 1
                call(sp=None if bwd[k].virtual_stage == 0 else bwd[k], rn=rn)
        out.append(prog)
    return out


def rendezvous_ends(plan: StepPlan) -> list[float]:
    """Each rank's schedule end when every call blocks until its transfers, matched FIFO per channel, are done
    (a transfer starts once both its sender and its receiver have posted their calls)."""
    p = plan.scenario.parallelism.pp
    progs = programs(plan)
    hold = [{**{("F", vs): rp.fwd_alone_s[vs] for vs in rp.fwd_alone_s},
             **{("B", vs): rp.bwd_alone_s[vs] for vs in rp.bwd_alone_s}} for rp in plan.ranks]
    gather = plan.p2p_gather.time_s if plan.p2p_gather is not None else 0.0
    sends: dict[tuple[str, int], list[tuple[float, float]]] = {}
    recvs: dict[tuple[str, int], list[float]] = {}
    pc, clock = [0] * p, [0.0] * p
    posted: list[list[tuple[str, tuple[str, int], int]] | None] = [None] * p

    def cost(op: PipeOp) -> float:
        c = plan.p2p.get(op.virtual_stage if op.kind == "F" else op.virtual_stage - 1)
        return c.time_s if c is not None else 0.0

    remaining = sum(len(x) for x in progs)
    while remaining:
        progressed = False
        for r in range(p):
            while pc[r] < len(progs[r]):
                item = progs[r][pc[r]]
                if item[0] == "C":
                    clock[r] += hold[r][(item[1].kind, item[1].virtual_stage)]
                else:
                    _, sn, sp, rp, rn = item
                    mine = posted[r]
                    if mine is None:
                        mine = posted[r] = []
                        for op, ch in ((sn, ("f", r)), (sp, ("b", r))):
                            if op is not None:
                                sends.setdefault(ch, []).append((clock[r], cost(op)))
                                mine.append(("s", ch, len(sends[ch]) - 1))
                        for wanted, ch in ((rp, ("f", (r - 1) % p)), (rn, ("b", (r + 1) % p))):
                            if wanted:
                                recvs.setdefault(ch, []).append(clock[r])
                                mine.append(("r", ch, len(recvs[ch]) - 1))
                    if any(i >= len(sends.get(ch, [])) or i >= len(recvs.get(ch, [])) for _, ch, i in mine):
                        break
                    end = clock[r]
                    for _, ch, i in mine:
                        start, c = sends[ch][i]
                        end = max(end, max(start, recvs[ch][i]) + c)
                    clock[r] = end + gather * sum(kind == "r" for kind, _, _ in mine)
                    posted[r] = None
                pc[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("the Megatron programs deadlock")
    return clock


def compare(data: dict[str, Any]) -> tuple[float, float]:
    """simddp's step and the step with Megatron's rendezvous (same tail after the schedule), seconds."""
    plan = build_plan(simddp.as_scenario(data))
    outs = fast._run_pipeline(plan)
    ends = rendezvous_ends(plan)
    return max(o.end_s for o in outs), max(e + o.end_s - o.compute_end_s for e, o in zip(ends, outs, strict=True))


def main() -> None:
    print("| model | v | simddp | with rendezvous | change |\n|---|---|---|---|---|")
    for size, heads, h, layers, tp, pp, gpus, batch, mbs, v, published in mt.TABLE1:
        if pp == 1:
            continue
        now, rdv = compare(mt.megatron(heads, h, layers, tp, pp, gpus, batch, mbs, v, name=f"{size}B", year=2021))
        flop = mt.eq3_flop(batch, layers, h) / gpus / 1e12
        print(f"| {size}B | {v} | {flop / now:.1f} TFLOP/s ({flop / now / published - 1:+.1%}) | "
              f"{flop / rdv:.1f} ({flop / rdv / published - 1:+.1%}) | {rdv / now - 1:+.2%} |")


if __name__ == "__main__":
    main()
