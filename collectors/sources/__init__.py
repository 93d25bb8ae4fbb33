"""Memory sources, one module per backend. Nothing here imports a vendor library at import time.

>>> from collectors.sources import make_source
>>> src = make_source("host")
>>> src.discovery.available
True
"""

from __future__ import annotations

import importlib
from typing import Any

from collectors.sources.base import Source, SourceError

__all__ = ["REGISTRY", "DEFAULT_SOURCES", "Source", "SourceError", "make_source", "discover_all"]

# name -> "module:Class"; modules are imported only when the source is asked for.
REGISTRY: dict[str, str] = {
    "host": "collectors.sources.host:HostSource",
    "nvml": "collectors.sources.nvml:NvmlSource",
    "sysman": "collectors.sources.sysman:SysmanSource",
    "torch": "collectors.sources.torch_source:TorchSource",
}
# What `memsaver record` polls when --sources is not given: every physical source that is
# available. torch is in-process accounting, opt-in (it would initialise CUDA in the recorder).
DEFAULT_SOURCES = ("host", "nvml", "sysman")


def make_source(name: str, **options: Any) -> Source:
    """Build a source by registry name; unknown names raise ValueError listing the known ones."""
    try:
        target = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown source {name!r}; known sources: {', '.join(REGISTRY)}") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)(**options)


def discover_all(names: tuple[str, ...] | list[str] | None = None, **options: Any) -> dict[str, Source]:
    """Build and discover each named source (all registered ones by default)."""
    out: dict[str, Source] = {}
    for name in names or REGISTRY:
        src = make_source(name, **options.get(name, {}))
        src.discovery  # noqa: B018 - runs discover() once
        out[name] = src
    return out
