"""Units, constants and human formatting.

Inside simddp every quantity is in base SI-like units: bytes (int), seconds, FLOP, bytes/s and
FLOP/s. This module is the only place where other units appear. Vendors quote bandwidth in decimal
GB/s (10^9 bytes/s) and memory in binary GiB; torch's ``bucket_cap_mb`` is MiB (2^20 bytes).
This module imports nothing from simddp.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024**2
GiB = 1024**3
KB = 1000
MB = 1000**2
GB = 1000**3
TB = 1000**4

US = 1e-6
MS = 1e-3

TFLOP = 1e12
PFLOP = 1e15

GBIT = 1e9 / 8  # one Gbit/s in bytes/s: NIC line rates are quoted in Gbit/s

#: Bytes per element of the dtypes torch reports (``tensor.element_size()``).
DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


def dtype_bytes(dtype: str) -> int:
    """Element size of ``dtype`` (a torch dtype name, with or without the ``torch.`` prefix)."""
    name = dtype.removeprefix("torch.")
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPE_BYTES)}") from None


def mib_to_bytes(mib: float) -> int:
    """MiB to bytes, truncating exactly as torch does for ``bucket_cap_mb``: ``int(mb * 1024 * 1024)``."""
    return int(mib * 1024 * 1024)


def fmt_time(seconds: float) -> str:
    """Seconds as a readable string (us, ms or s)."""
    if seconds < 1e-3:
        return f"{seconds / US:.1f} us"
    if seconds < 1.0:
        return f"{seconds / MS:.2f} ms"
    return f"{seconds:.3f} s"


def fmt_bytes(num_bytes: float) -> str:
    """Bytes in binary units (memory is quoted in GiB/MiB)."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{int(num_bytes)} B"


def fmt_bandwidth(bytes_per_s: float) -> str:
    """Bandwidth in decimal GB/s, as vendors and nccl-tests quote it."""
    return f"{bytes_per_s / GB:.1f} GB/s"


def fmt_flop_rate(flop_per_s: float) -> str:
    """A FLOP rate in TFLOP/s."""
    return f"{flop_per_s / TFLOP:.1f} TFLOP/s"
