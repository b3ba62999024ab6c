"""How sizes, rates and counts are written for people: one function each, used by the CLI and by ui/.

Decimal (SI) units throughout, as disk makers and llama.cpp's own model sizes use them: 1 GB = 10^9 bytes.
Three significant figures: "512 B", "6.00 GB", "24.0 GB", "350 MB".
"""

from __future__ import annotations

_PREFIXES = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))
_BYTE_UNITS = {"B": 1.0, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def _three_figures(value: float) -> str:
    size = abs(value)
    decimals = 2 if size < 10 else 1 if size < 100 else 0
    text = f"{value:.{decimals}f}"
    if decimals and float(text) >= (10 if decimals == 2 else 100):  # 9.999 rounds up to "10.00"
        text = f"{value:.{decimals - 1}f}"
    return text


def format_si(value: float | None, unit: str) -> str:
    """`value` with an SI prefix and `unit`: format_si(1.5e9, "B/s") == "1.50 GB/s"; "?" for None."""
    if value is None:
        return "?"
    for prefix, scale in _PREFIXES:
        if abs(value) >= scale * 0.9995:  # 999.6 kB is written 1.00 MB, not "1000 kB"
            return f"{_three_figures(value / scale)} {prefix}{unit}"
    if float(value).is_integer():
        return f"{value:.0f} {unit}"
    return f"{_three_figures(value)} {unit}"


def format_bytes(n: float | None, unit: str | None = None) -> str:
    """A byte count for people: format_bytes(6e9) == "6.00 GB"; with `unit` ("B", "kB", "MB", "GB", "TB")
    always in that unit, so rows of a table line up: format_bytes(2e8, "GB") == "0.20 GB"."""
    if n is None:
        return "?"
    if unit is None:
        return format_si(n, "B")
    scale = _BYTE_UNITS[unit]
    return f"{n:.0f} B" if unit == "B" else f"{_three_figures(n / scale)} {unit}"


def format_count(n: float) -> str:
    """A count (parameters, tokens) for people: "135M", "1.24B", "812"."""
    for prefix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale * 0.9995:
            return f"{float(_three_figures(n / scale)):g}{prefix}"
    return f"{n:.0f}"
