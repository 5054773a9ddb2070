"""The one size/rate parser: decimal vs binary prefixes, bits, rates; bare numbers are base units."""

from __future__ import annotations

import pytest

from simddp.units import GB, GBIT, KiB, MiB, parse_rate, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1048576", 1048576),
        ("256MiB", 256 * MiB),
        ("256MB", 256 * 10**6),  # decimal: MB is 10^6 bytes, not MiB
        ("80GB", 80 * GB),
        ("80GiB", 80 * 1024**3),
        ("1.5KiB", 1536),
        ("4kB", 4000),
        ("4KB", 4000),
        ("1Gbit", 125_000_000),
        ("8bit", 1),
        (" 64 KiB ", 64 * KiB),
        ("2.5e9", 2_500_000_000),
    ],
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected
    assert isinstance(parse_size(text), int)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("25e9", 25e9),
        ("25GB/s", 25e9),
        ("400Gbit/s", 400 * GBIT),
        ("400Gbps", 400 * GBIT),
        ("400Gb/s", 400 * GBIT),
        ("3.35TB/s", 3.35e12),
        ("1GiB/s", 1024**3),
    ],
)
def test_rates(text: str, expected: float) -> None:
    assert parse_rate(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (parse_size, "8G", "unit 'G' is ambiguous: write 8GB (decimal), 8GiB (binary) or 8Gbit"),
        (parse_size, "8Mi", "unit 'Mi' lacks B: write 8MiB"),
        (parse_size, "25mb", "unknown unit 'mb'"),
        (parse_size, "12Q", "unknown unit 'Q'"),
        (parse_size, "abc", "expected a number with an optional unit"),
        (parse_size, "25GB/s", "'25GB/s' is a rate; expected a size"),
        (parse_size, "1.5B", "'1.5B' is not a whole number of bytes"),
        (parse_rate, "25GB", "'25GB' is a size; expected a rate"),
        (parse_rate, "1Kibit/s", "unknown unit 'Kibit/s'"),
        # Refused before any arithmetic (a probe's 1e2000000 ran for minutes in int(); 1e1000000B overflowed Decimal,
        # 1e999999999999999999999 was past its range: internal errors), and ASCII digits only.
        (parse_size, "1e2000000", "'1e2000000' is too large: sizes and rates go up to 10^30"),
        (parse_size, "1e1000000B", "'1e1000000B' is too large"),
        (parse_rate, "1e31GB/s", "'1e31GB/s' is too large"),
        (parse_size, "1e999999999999999999999", "its exponent is out of range"),
        (parse_size, "\u0663", "expected a number with an optional unit"),
        (parse_size, "\uff11\uff12", "expected a number with an optional unit"),
    ],
)
def test_errors_name_the_problem(parse, text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
