"""Each CPU benchmark runs end to end with --quick and prints its table (no timing is asserted:
speed is what the scripts report, not what tests check)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
CPU_SCRIPTS = ["sampling_cost", "workload_impact", "sharpness", "storage", "display"]
GPU_SCRIPTS = ["gpu_nvml_cost", "gpu_sharpness", "gpu_pause_resume"]


def _run(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *args], capture_output=True,
                          text=True, timeout=600, cwd=BENCH.parent)


@pytest.mark.timeout(700)
@pytest.mark.parametrize("name", CPU_SCRIPTS)
def test_cpu_benchmark_runs_quick_and_prints_table(name: str) -> None:
    p = _run(name, "--quick")
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert any(line.startswith("# machine:") for line in lines), p.stdout
    titles = [i for i, line in enumerate(lines) if line.startswith("## ")]
    assert titles, p.stdout
    for i in titles:  # a title, a header, a rule, at least one row with figures
        assert set(lines[i + 2].replace(" ", "")) == {"-"}, p.stdout
        assert lines[i + 3].strip() and "nan" not in lines[i + 3].lower(), p.stdout


@pytest.mark.parametrize("name", GPU_SCRIPTS)
def test_gpu_benchmark_parses_its_arguments(name: str) -> None:
    p = _run(name, "--help")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "--quick" in p.stdout


def test_benchmark_rejects_bad_repeats() -> None:
    p = _run("storage", "--repeats", "0")
    assert p.returncode == 2 and "--repeats must be >= 1" in p.stderr
