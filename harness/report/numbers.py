"""The one number formatter of every table gembench prints: terminal, Markdown and the HTML page."""

from __future__ import annotations

import math


def si(value: float, unit: str = "") -> str:
    """1234567 -> '1.23 M'; keeps tables narrow without losing the order of magnitude."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".strip()


def figures2(value: float) -> str:
    """At least two significant figures, no exponent: 0.0123 -> '0.012', 1.5 -> '1.5', 123 -> '123'."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    places = max(0, 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{places}f}"


def pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f}"


def num(v: float | None) -> str:
    """A measured value at four significant places; '-' where there is none."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if v != 0 and (abs(v) >= 1e6 or abs(v) < 1e-3):
        return f"{v:.4g}"
    return f"{v:.4f}".rstrip("0").rstrip(".") if abs(v) < 100 else f"{v:.1f}"


def count(v: float | None) -> str:
    """An exact count as an integer with thousands separators."""
    return "-" if v is None else f"{v:,.0f}" if float(v).is_integer() else f"{v:,}"


def change(v: float | None) -> str:
    """A relative change, signed: +1.25%."""
    return "-" if v is None else f"{100 * v:+.2f}%"


def ratio(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.4f}"
