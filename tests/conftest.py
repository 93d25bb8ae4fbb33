from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.proc import AllocatorChild


@pytest.fixture
def allocator_child() -> Iterator[AllocatorChild]:
    child = AllocatorChild()
    yield child
    child.exit()
    if child.proc.poll() is None:
        child.proc.kill()


