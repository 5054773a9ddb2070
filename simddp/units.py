"""Units, constants and human formatting.

Inside simddp every quantity is in base SI-like units: bytes (int), seconds, FLOP, bytes/s and
FLOP/s. This module is the only place where other units appear. Vendors quote bandwidth in decimal
GB/s (10^9 bytes/s) and memory in binary GiB; torch's ``bucket_cap_mb`` is MiB (2^20 bytes).
It also parses sizes and rates written with units (:func:`parse_size`, :func:`parse_rate`): one parser
for ``--set``, ``--bytes`` and scenario fields in bytes or bytes/s. This module imports nothing from simddp.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Literal

KiB = 1024
MiB = 1024**2
GiB = 1024**3
KB = 1000
MB = 1000**2
GB = 1000**3
TB = 1000**4

US = 1e-6
MS = 1e-3
MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0

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
    """Seconds as a readable string (us, ms or s); a negative time (a pipeline wait below zero) by its size."""
    if seconds < 0:
        return "-" + fmt_time(-seconds)
    if seconds < 1e-3:
        return f"{seconds / US:.1f} us"
    if seconds < 1.0:
        return f"{seconds / MS:.2f} ms"
    return f"{seconds:.3f} s"


def fmt_duration(seconds: float) -> str:
    """A duration: fmt_time below a minute, then minutes, hours or days."""
    if seconds < 60:
        return fmt_time(seconds)
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds / 86400:.2f} days"


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


# ------------------------------------------------------------------------------------ parsing
#: Prefixes of the size parser. Decimal (SI) prefixes step by 1000, binary (IEC) ones by 1024; both
#: k and K mean 1000.
SIZE_PREFIXES: dict[str, int] = {
    "": 1, "k": KB, "K": KB, "M": MB, "G": GB, "T": TB, "P": 1000**5,
    "Ki": KiB, "Mi": MiB, "Gi": GiB, "Ti": 1024**4, "Pi": 1024**5,
}
SIZE_UNITS_HELP = (
    "a bare number is bytes (bytes/s); units: B kB MB GB TB PB (decimal, x1000), KiB MiB GiB TiB PiB (binary, x1024), "
    "bit kbit Mbit Gbit Tbit (or Gb: bits, /8); rates end in /s or bps: 25GB/s, 400Gbit/s, 400Gbps"
)
# ASCII digits only (re.ASCII: \d would take the Arabic-Indic and fullwidth ones, as the other flags refuse).
_QUANTITY = re.compile(r"\s*(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(?P<unit>[A-Za-z/]*)\s*", re.ASCII)
#: The largest power of ten a size or rate may be written with (10^30 bytes: far past any memory or link).
_MAX_EXPONENT = 30


def parse_quantity(text: str, rate_hint: bool = False) -> tuple[Decimal, Literal["number", "size", "rate"]]:
    """A number with an optional size or rate unit, in bytes or bytes/s: ``(value, kind)``.

    ``kind`` is ``"number"`` for a bare number (already in base units), ``"size"`` for ``256MiB`` or
    ``1Gbit``, ``"rate"`` for ``25GB/s``, ``400Gbit/s`` or ``400Gbps``. Units are case-sensitive where
    the case carries meaning: ``B`` is a byte, ``b``/``bit`` a bit; ``M``, ``G``, ``T`` are upper case.
    A prefix without ``B`` or ``bit`` ("8G") is refused: it could mean GB, GiB or Gbit (``rate_hint``: the
    message suggests rates, GB/s, GiB/s or Gbit/s).
    """
    m = _QUANTITY.fullmatch(text)
    if not m:
        raise ValueError(f"expected a number with an optional unit ({SIZE_UNITS_HELP})")
    try:
        value, unit = Decimal(m.group("num")), m.group("unit")
    except InvalidOperation:  # an exponent past Decimal's own range (1e999999999999999999999, 1e-99...)
        raise ValueError(f"{text.strip()!r}: its exponent is out of range (sizes and rates go up to "
                         f"10^{_MAX_EXPONENT}, bytes or bytes/s)") from None
    if value and value.adjusted() > _MAX_EXPONENT:
        # Refused before any arithmetic: int() of 1e2000000 takes minutes, and Decimal's own range ends at 1e999999
        # (a probe's --bytes 1e2000000 ran on for minutes; 1e1000000B ended in an internal error, Overflow).
        raise ValueError(f"{text.strip()!r} is too large: sizes and rates go up to 10^{_MAX_EXPONENT} (bytes, bytes/s)")
    if not unit:
        return value, "number"
    rate = unit.endswith(("/s", "bps"))
    base = unit[:-2] if unit.endswith("/s") else unit[:-2] + "it" if unit.endswith("bps") else unit
    if base.endswith("B"):
        prefix, per_unit = base[:-1], Decimal(1)
    elif base.endswith(("bit", "b")):
        prefix, per_unit = base.removesuffix("bit").removesuffix("b"), Decimal("0.125")
    else:
        n, ps = m.group("num"), "/s" if rate or rate_hint else ""
        if base in SIZE_PREFIXES and base.endswith("i"):
            raise ValueError(f"unit {unit!r} lacks B: write {n}{base}B{ps}")
        if base in SIZE_PREFIXES:
            raise ValueError(f"unit {unit!r} is ambiguous: write {n}{base}B{ps} (decimal), {n}{base}iB{ps} (binary) "
                             f"or {n}{base}bit{ps}")
        raise ValueError(f"unknown unit {unit!r} ({SIZE_UNITS_HELP})")
    if prefix not in SIZE_PREFIXES or (per_unit != 1 and prefix.endswith("i")):
        raise ValueError(f"unknown unit {unit!r} ({SIZE_UNITS_HELP})")
    return value * SIZE_PREFIXES[prefix] * per_unit, "rate" if rate else "size"


def parse_size(text: str) -> int:
    """Bytes from ``'1048576'``, ``'256MiB'`` (2^20 steps), ``'80GB'`` (10^9) or ``'1Gbit'`` (bits / 8)."""
    value, kind = parse_quantity(text)
    if kind == "rate":
        raise ValueError(f"{text.strip()!r} is a rate; expected a size such as 256MiB or 80GB")
    if value != value.to_integral_value():
        raise ValueError(f"{text.strip()!r} is not a whole number of bytes")
    return int(value)


def parse_rate(text: str) -> float:
    """Bytes/s from ``'25e9'``, ``'25GB/s'`` (decimal, as vendors quote), ``'400Gbit/s'`` or ``'400Gbps'``."""
    value, kind = parse_quantity(text, rate_hint=True)
    if kind == "size":
        raise ValueError(f"{text.strip()!r} is a size; expected a rate such as 25GB/s or 400Gbit/s")
    return float(value)
