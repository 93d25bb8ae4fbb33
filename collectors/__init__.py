"""memsaver-dashboard collectors: sources, recorder, store, controls.

Importing this package never imports a vendor binding (NVML, pyzes, torch, torch_memory_saver).

>>> from collectors import Recorder, Store
>>> rec = Recorder(Store(":memory:"), sources=["host"])
"""

from __future__ import annotations

__version__ = "0.1.0"

from collectors.model import DeviceInfo, Discovery, Event, Sample  # noqa: E402
from collectors.recorder import Recorder  # noqa: E402
from collectors.store import Store, StoreError  # noqa: E402

__all__ = ["DeviceInfo", "Discovery", "Event", "Recorder", "Sample", "Store", "StoreError",
           "__version__"]
