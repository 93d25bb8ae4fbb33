"""The host saver really returns pages to the kernel (RSS drops) while its accounting stays flat."""

from __future__ import annotations

import numpy as np
import psutil
import pytest

from collectors.controls import make_control
from collectors.controls.host_saver import PAGE_SIZE, HostSaver
from collectors.store import Store

MiB = 2**20
SIZE = 32 * MiB
# RSS of this process also moves with whatever else the test process does; 90% of the tag size
# is far above that noise and far below what a release really frees.
TOL = 0.9


def rss() -> int:
    return psutil.Process().memory_info().rss


@pytest.fixture
def saver():
    store = Store(":memory:")
    s = HostSaver(store)
    yield s
    s.close()


def test_rss_drops_on_pause_and_returns_on_resume_while_accounting_is_flat(saver):
    r0 = rss()
    saver.allocate("weights", SIZE)
    r1 = rss()
    assert r1 - r0 >= TOL * SIZE  # pages are really resident after allocate
    src = saver.accounting_source()
    assert src.discovery.available
    acc_before = src.read()[0].value

    ev = saver.pause(["weights"])
    r2 = rss()
    assert ev.ok and ev.action == "pause" and ev.expected_bytes == SIZE
    assert r1 - r2 >= TOL * SIZE
    assert src.read()[0].value == acc_before == SIZE  # accounting does not see the release

    ev = saver.resume(["weights"])
    r3 = rss()
    assert ev.ok and ev.expected_bytes == SIZE
    assert r3 - r2 >= TOL * SIZE
    assert src.read()[0].value == SIZE


def test_without_backup_content_is_gone_after_resume(saver):
    saver.allocate("kv_cache", 4 * MiB)
    assert saver.content_ok("kv_cache")
    assert saver.pause(["kv_cache"]).ok
    assert saver.resume(["kv_cache"]).ok
    assert not saver.content_ok("kv_cache")
    data = np.frombuffer(saver._regions["kv_cache"].mm, dtype=np.uint8).reshape(-1, PAGE_SIZE)
    # pages came back zero-filled except the one byte per page written to re-commit them
    assert int(data[:, 1:].max()) == 0 and bool((data[:, 0] == 1).all())
    del data


def test_backup_restores_content_and_still_drops_rss(saver, tmp_path):
    s = HostSaver(Store(":memory:"), backup_dir=tmp_path)
    try:
        s.allocate("weights", SIZE, backup=True)
        r1 = rss()
        assert s.pause(["weights"]).ok
        assert r1 - rss() >= TOL * SIZE  # backup lives in a file, not in this process's RSS
        assert s.state()["weights"].backup and s.state()["weights"].paused
        ev = s.resume(["weights"])
        assert ev.ok, ev.error
        assert s.content_ok("weights")
    finally:
        s.close()


def test_pause_all_skips_paused_tags_and_expected_counts_only_what_changes(saver):
    saver.allocate("weights", 4 * MiB)
    saver.allocate("kv_cache", 8 * MiB)
    assert saver.pause(["weights"]).ok
    ev = saver.pause()
    assert ev.ok and ev.tags == [] and ev.expected_bytes == 8 * MiB
    assert all(st.paused for st in saver.state().values())
    ev = saver.resume()
    assert ev.ok and ev.expected_bytes == 12 * MiB
    assert not any(st.paused for st in saver.state().values())


def test_errors_are_failed_events_and_change_nothing(saver):
    saver.allocate("weights", 4 * MiB)
    before = saver.state()
    for ev, msg in (
        (saver.resume(["weights"]), "never released"),
        (saver.pause(["nope"]), "unknown tag"),
        (saver.pause(["bad tag!"]), "invalid tag name"),
        (saver.pause(["weights", "weights"]), "twice"),
    ):
        assert not ev.ok and msg in ev.error
    assert saver.state() == before
    assert saver.pause(["weights"]).ok
    ev = saver.pause(["weights"])
    assert not ev.ok and "already released" in ev.error
    events = saver.store.events()
    assert list(events["action"]) == ["allocate", "resume", "pause", "pause", "pause", "pause", "pause"]
    assert list(events["ok"]) == [True, False, False, False, False, True, False]
    assert all(d == {"pid": psutil.Process().pid, "device": "host"} for d in events["details"])


@pytest.mark.parametrize("tag, size, msg", [
    ("weights", 0, "positive"), ("weights", -1, "positive"), ("weights", 1.5, "positive"),
    ("", 4096, "invalid tag"), ("a/b", 4096, "invalid tag"), (3, 4096, "must be a string"),
])
def test_allocate_rejects_bad_arguments(saver, tag, size, msg):
    with pytest.raises(ValueError, match=msg):
        saver.allocate(tag, size)
    assert saver.state() == {}


def test_allocate_twice_and_free(saver):
    saver.allocate("weights", 4096)
    with pytest.raises(ValueError, match="already allocated"):
        saver.allocate("weights", 4096)
    assert saver.pause(["weights"]).ok
    ev = saver.free("weights")
    assert ev.action == "free" and ev.ok and saver.state() == {}
    with pytest.raises(ValueError, match="unknown tag"):
        saver.free("weights")


def test_sizes_round_up_to_whole_pages(saver):
    saver.allocate("weights", 1000)
    assert saver.state()["weights"].bytes == PAGE_SIZE


def test_make_control_builds_kinds_and_rejects_unknown():
    s = make_control("host", Store(":memory:"), origin="test")
    assert isinstance(s, HostSaver) and s.target == "host-saver" and s.origin == "test"
    with pytest.raises(ValueError, match="unknown control"):
        make_control("tpu")
