"""The one machine description: what reports, step costs and benchmarks record."""

import os

from latticekit._machine import cpu_name, machine


def test_machine_names_the_cpu_its_vector_extensions_and_the_load() -> None:
    info = machine()
    assert info["cpu"] == cpu_name() and cpu_name().endswith(f"{os.cpu_count()} cpus")
    assert isinstance(info["isa"], list) and set(info["isa"]) <= {"avx2", "avx512f", "avx512_bf16", "avx512_vnni",
                                                                   "amx_tile", "neon", "asimd"}
    flags = open("/proc/cpuinfo").read().split() if os.path.exists("/proc/cpuinfo") else []
    assert ("avx2" in info["isa"]) == ("avx2" in flags)
    assert len(info["load_average"]) == 3 and info["python"].count(".") == 2
