"""Print simddp's collective presets against every published figure (markdown), as in docs/collectives.md.

    python benchmarks/nccl_validation.py            # summary, fit rows, held-out nccl-tests rows, OpenXLA table
    python benchmarks/nccl_validation.py --all      # also every held-out row below 1 MiB

The rows, their fit / held-out role and the sets are defined in tests/validation/test_nccl_tests.py; the
curves and OpenXLA's table are read from benchmarks/data/.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "validation"))

from test_nccl_tests import SETS, Published, _nccl_rows, cluster_of, error, predict, stats, xla_rows

from simddp.units import GB, GiB, MiB


def _size(size: int) -> str:
    if size >= GiB:
        return f"{size / GiB:g} GiB"
    if size >= MiB:
        return f"{size / MiB:g} MiB"
    return f"{size / 1024:g} KiB" if size >= 1024 else f"{size} B"


def _table(rows: list[Published]) -> None:
    print("| cluster | GPUs | op | size | run | simddp picks | measured busbw GB/s | simddp GB/s | error | role "
          "| source |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c = predict(r)
        gpus = r.ranks if r.ranks is not None else cluster_of(r).num_gpus
        role = f"fit: {r.fit}" if r.fit else "held-out"
        print(f"| {r.cluster} | {gpus} | {r.op} | {_size(r.size_bytes)} | {r.algorithm} | {c.algorithm}/{c.protocol} | "
              f"{r.busbw_gb_per_s:.1f} | {c.busbw_bytes_per_s / GB:.1f} | {error(r):+.1%} | {role} | {r.source} |")


def _xla_matrix() -> None:
    """OpenXLA's table at >= 64 MiB: error by op and grouping (columns: sizes)."""
    rows = [r for r in xla_rows() if r.size_bytes >= 64 * MiB]
    sizes = sorted({r.size_bytes for r in rows})
    cells: dict[tuple[str, int, int], dict[int, str]] = defaultdict(dict)
    for r in rows:
        c = predict(r)
        cells[(r.op, r.groups, r.ranks or 0)][r.size_bytes] = (
            f"{r.busbw_gb_per_s:.0f} / {c.busbw_bytes_per_s / GB:.0f} ({error(r):+.0%})")
    print(f"| op | groups x GPUs | simddp picks ({_size(sizes[-1])}) | " + " | ".join(_size(s) for s in sizes) + " |")
    print("|---|---|---|" + "---|" * len(sizes))
    for (op, groups, ranks), by_size in sorted(cells.items()):
        algo = predict(next(r for r in rows if (r.op, r.groups, r.ranks) == (op, groups, ranks)
                            and r.size_bytes == sizes[-1])).algorithm
        print(f"| {op} | {groups}x{ranks} | {algo} | " + " | ".join(by_size[s] for s in sizes) + " |")
    print("\nCells: measured / simddp bus bandwidth, GB/s (error).")


def main() -> None:
    print("| set | rows | mean abs error | max abs error | asserted bounds (mean, max) |")
    print("|---|---|---|---|---|")
    for name, (select, mean_bound, max_bound) in SETS.items():
        n, mean, worst = stats(select())
        print(f"| {name} | {n} | {mean:.1%} | {worst:.1%} | {mean_bound:.1%}, {max_bound:.1%} |")
    everything = _nccl_rows()
    print("\n### In-sample rows (each set the constant it names)\n")
    _table([r for r in everything if not r.held_out])
    print("\n### Held-out nccl-tests rows, >= 1 MiB\n")
    _table([r for r in everything if r.held_out and r.size_bytes >= MiB])
    if "--all" in sys.argv:
        print("\n### Held-out nccl-tests rows, < 1 MiB\n")
        _table([r for r in everything if r.held_out and r.size_bytes < MiB])
    print("\n### Held-out: OpenXLA's measured H100 collectives, >= 64 MiB\n")
    print("Times are medians of a whole XLA executable (a 20-100 us launch floor at small sizes), so only sizes\n"
          "where the transfer dominates (>= 64 MiB) are compared. The table says sm_90 only: assumed H100 SXM\n"
          "(dgx-h100-80gb).\n")
    _xla_matrix()


if __name__ == "__main__":
    main()
