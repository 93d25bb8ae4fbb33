"""Parsing and formatting of sizes and durations given by users.

>>> parse_bytes("2GiB")
2147483648
>>> parse_duration("20ms")
0.02
>>> format_bytes(3 * 2**30)
'3.00 GiB'
"""

from __future__ import annotations

import math
import re

__all__ = ["GiB", "MiB", "parse_bytes", "parse_duration", "format_bytes", "format_duration"]

KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40
_BYTE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB,
}
_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_NUM = r"([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"


def _scaled(text: str, units: dict[str, float], what: str, hint: str) -> float:
    """'<number><unit>' -> number x units[unit]; ValueError naming ``what`` and a ``hint``."""
    m = re.fullmatch(_NUM + r"\s*([A-Za-z]*)", str(text).strip())
    unit = m.group(2).lower() if m else None
    if not m or unit not in units:
        raise ValueError(f"invalid {what} {text!r}: {hint}")
    return float(m.group(1)) * units[unit]


def parse_bytes(text: str | int, *, allow_zero: bool = False) -> int:
    """'2GiB', '512MiB', '1.5GB', '4096' -> bytes. Raises ValueError with a clear message."""
    if isinstance(text, bool):
        raise ValueError(f"invalid size {text!r}")
    if isinstance(text, int):
        value = text
    else:
        value = _scaled(text, _BYTE_UNITS, "size",
                        "use a number with an optional unit, e.g. 512MiB, 2GiB, 1GB")
        if not math.isfinite(value):
            raise ValueError(f"invalid size {text!r}")
        value = int(round(value))
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"invalid size {text!r}: must be {'>= 0' if allow_zero else '> 0'} bytes")
    return value


def parse_duration(text: str | float | int, *, allow_zero: bool = False) -> float:
    """'20ms', '30s', '1.5s', '2m', '1h', '0.02' (seconds) -> seconds as float."""
    if isinstance(text, bool):
        raise ValueError(f"invalid duration {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        value = _scaled(text, _SECONDS, "duration", "use a number with a unit, e.g. 20ms, 30s, 2m")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"invalid duration {text!r}: must be {'>= 0' if allow_zero else '> 0'}")
    return value


def format_bytes(n: float | int | None, *, signed: bool = False) -> str:
    """Bytes -> '1.25 GiB' (binary units; GiB only at display). None/NaN -> 'n/a'."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "n/a"
    sign = ("+" if n > 0 else "-" if n < 0 else "") if signed else ("-" if n < 0 else "")
    a = abs(float(n))
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if a >= size:
            return f"{sign}{a / size:.2f} {unit}"
    return f"{sign}{int(a)} B"


def format_duration(s: float | None) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "n/a"
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"
