"""The one way sizes, rates and counts are written."""

from __future__ import annotations

import pytest

from app.units import format_bytes, format_count, format_si


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (512, "512 B"), (1000, "1.00 kB"), (999_700, "1.00 MB"), (350e6, "350 MB"),
    (6e9, "6.00 GB"), (24e9, "24.0 GB"), (9.999e9, "10.0 GB"), (1.5e12, "1.50 TB"), (None, "?"),
])
def test_format_bytes_keeps_three_significant_figures(n: float | None, text: str) -> None:
    assert format_bytes(n) == text


def test_format_bytes_in_a_fixed_unit() -> None:
    assert format_bytes(2e8, "GB") == "0.20 GB"
    assert format_bytes(24e9, "GB") == "24.0 GB"
    assert format_bytes(123, "B") == "123 B"
    with pytest.raises(KeyError):
        format_bytes(1, "GiB")


def test_format_si_and_count() -> None:
    assert format_si(1.5e9, "B/s") == "1.50 GB/s"
    assert format_si(2.5e11, "FLOP/s") == "250 GFLOP/s"
    assert format_si(0.5, "s") == "0.50 s"
    assert format_count(135_000_000) == "135M"
    assert format_count(1_240_000_000) == "1.24B"
    assert format_count(812) == "812"
