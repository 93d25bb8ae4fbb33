"""GPU-only tests: skipped, with the reason, where there is no NVIDIA GPU and NVML."""

from __future__ import annotations

import os
import sys

import pytest


def _gpu_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    from collectors.sources.nvml import NvmlSource

    d = NvmlSource().discovery
    return None if d.available else f"NVML unavailable: {d.reason}"


def pytest_collection_modifyitems(config, items):
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    session.config._memsaver_exitstatus = int(exitstatus)


def pytest_unconfigure(config):
    # torch_memory_saver 0.0.10 on CUDA exits 1 in interpreter teardown (collectors.cli.exit_process
    # says why); keep pytest's own verdict as the process status.
    status = getattr(config, "_memsaver_exitstatus", None)
    if status is not None and "torch_memory_saver" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
