"""The machine a figure was measured on: one description for reports, step costs and benchmarks."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

__all__ = ["cpu_name", "machine"]

#: The instruction-set extensions that change which kernels run (and so the ratios measured).
_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "neon", "asimd")


def _cpuinfo() -> dict[str, str]:
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "flags", "Features") and key not in fields:
                fields[key] = value.strip()
    except OSError:
        pass
    return fields


def cpu_name() -> str:
    """The CPU's model name and count, e.g. ``AMD EPYC 9B14, 2 cpus``."""
    name = _cpuinfo().get("model name") or platform.processor() or platform.machine()
    return f"{name}, {os.cpu_count()} cpus"


def machine() -> dict[str, Any]:
    """The CPU (name, count, the vector extensions that matter: AVX2 or AVX-512 ratios differ),
    the OS and Python, and the load average when the figures were taken."""
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    out: dict[str, Any] = {
        "cpu": cpu_name(),
        "arch": platform.machine(),
        "isa": [flag for flag in _ISA_FLAGS if flag in flags],
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return out
