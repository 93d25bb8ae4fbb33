"""``memsaver devices`` / ``memsaver record`` in child processes over the compiled fake loader,
plus the start-up failures that need a fresh process (pyzes binds one library per process)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from collectors.store import Store
from tests.zes import fake_loader as fz
from tests.zes.fake_loader import FakeDevice, FakeModule, FakeProcess, FakeZe, GiB

ROOT = Path(__file__).parents[1]


def memsaver(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "collectors", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def sysman_discovery(env: dict[str, str], *prefix: str) -> dict:
    """``memsaver devices --json --sources sysman`` (optionally after a python -c prelude)."""
    if prefix:
        cmd = [sys.executable, "-c", *prefix]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    else:
        proc = memsaver("devices", "--json", "--sources", "sysman", env=env)
    assert proc.returncode == 0, proc.stderr
    [d] = json.loads(proc.stdout)
    return d


def no_loader_env(h: fz.ZeHarness, **extra: str) -> dict[str, str]:
    env = h.env(**extra)
    env.pop(fz.LOADER_ENV)
    return env


@pytest.fixture
def ze(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[fz.ZeHarness]:
    with fz.activate(tmp_path, monkeypatch) as h:
        yield h


def test_devices_json_lists_xpus_exactly_as_on_real_hardware(ze):
    ze.write(FakeZe([
        FakeDevice(uuid="0123456789abcdef0123456789abcdef", bdf="0000:29:00.0", subdevices=2, modules=[
            FakeModule(64 * GiB, 60 * GiB, subdevice=0), FakeModule(64 * GiB, 62 * GiB, subdevice=1)]),
        FakeDevice(name="Intel(R) Arc(TM) A770 Graphics", modules=[FakeModule(16 * GiB, 15 * GiB)]),
    ]))
    d = sysman_discovery(ze.env())
    assert d["available"] and d["details"]["mapping"] == "enumeration"
    devs = {x["device"]: x for x in d["devices"]}
    assert set(devs) == {"xpu:0", "xpu:0.0", "xpu:0.1", "xpu:1"}
    assert devs["xpu:0"]["uuid"] == "01234567-89ab-cdef-0123-456789abcdef"
    assert devs["xpu:0"]["details"]["pci_bus_id"] == "0000:29:00.0"
    assert devs["xpu:0"]["total_bytes"] == 128 * GiB
    assert devs["xpu:1"]["name"] == "Intel(R) Arc(TM) A770 Graphics"
    assert d["details"]["loader"] == str(ze.lib)
    assert any("enumeration order" in m for m in d["diagnostics"])


def test_devices_text_shows_devices_and_warnings(ze):
    ze.write(FakeZe([FakeDevice(modules=[FakeModule(16 * GiB, 16 * GiB)], processes=[FakeProcess(5, GiB)])]))
    proc = memsaver("devices", "--sources", "sysman", env=ze.env())
    assert proc.returncode == 0, proc.stderr
    assert "xpu:0" in proc.stdout and "Intel(R) Data Center GPU Max 1100" in proc.stdout
    assert "needs root or CAP_PERFMON on i915" in proc.stdout


def test_loader_found_on_the_library_search_path(ze):
    # No MEMSAVER_ZE_LOADER and no Debian path: ctypes.util.find_library (RHEL's /usr/lib64, oneAPI).
    env = no_loader_env(ze, LD_LIBRARY_PATH=str(ze.lib.parent))
    code = "import ctypes.util; print(ctypes.util.find_library('ze_loader'))"
    probe = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=60).stdout.strip()
    if probe == "None":
        pytest.skip("ctypes.util.find_library cannot search LD_LIBRARY_PATH here (no ld/gcc)")
    d = sysman_discovery(env)
    assert d["available"], d["reason"]
    assert d["details"]["loader"] == "libze_loader.so.1"


def test_missing_loader_says_what_to_install(ze):
    d = sysman_discovery(no_loader_env(ze))
    assert not d["available"]
    assert "libze_loader.so.1 not found" in d["reason"] and "MEMSAVER_ZE_LOADER" in d["reason"]


def test_bad_loader_variable_is_named(ze, tmp_path):
    d = sysman_discovery(ze.env(MEMSAVER_ZE_LOADER=str(tmp_path / "nope.so")))
    assert not d["available"] and f"MEMSAVER_ZE_LOADER={tmp_path / 'nope.so'} cannot be loaded" in d["reason"]


def test_loader_too_old_for_zesinit(ze):
    old = fz.build("no_zesinit")
    d = sysman_discovery(ze.env(MEMSAVER_ZE_LOADER=str(old)))
    assert not d["available"]
    assert "has no zesInit" in d["reason"] and "too old" in d["reason"]


def test_pyzes_not_installed(ze):
    prelude = ("import sys; sys.modules['pyzes'] = None; "  # what an absent package looks like
               "from collectors.cli import main; "
               "sys.exit(main(['devices', '--json', '--sources', 'sysman']))")
    d = sysman_discovery(ze.env(), prelude)
    assert not d["available"] and "pyzes is not installed" in d["reason"]


def test_import_collectors_never_imports_pyzes(ze):
    code = "import sys, collectors, collectors.sources.sysman; print('pyzes' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ze.env(), capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_record_sees_free_change_mid_recording(ze, tmp_path):
    cfg = FakeZe([FakeDevice(modules=[FakeModule(48 * GiB, 40 * GiB)],
                             processes=[FakeProcess(321, 8 * GiB)])])
    ze.write(cfg)
    out = tmp_path / "rec.sqlite"
    child = subprocess.Popen(
        [sys.executable, "-m", "collectors", "record", "--out", str(out), "--sources", "sysman,host",
         "--interval", "sysman=50ms", "--heartbeat", "200ms"],
        cwd=ROOT, env=ze.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def stored_values() -> list[int]:
            if not out.exists():
                return []
            try:
                with Store.open(out) as s:
                    df = s.samples(sources=["sysman"], metrics=["used_bytes"], devices=["xpu:0"])
            except Exception:  # the file is being created
                return []
            return df["value"].dropna().astype("int64").tolist()

        deadline = time.monotonic() + 120
        while 8 * GiB not in stored_values():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "recorder never stored the first reading"
            time.sleep(0.1)
        cfg.devices[0].modules[0].free = 46 * GiB  # something released 6 GiB
        cfg.devices[0].processes[0].mem = 2 * GiB
        ze.write(cfg)
        while 2 * GiB not in stored_values():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "recorder never stored the release"
            time.sleep(0.1)
    finally:
        child.send_signal(2)  # Ctrl-C: the recorder flushes and prints its stats
        stdout, stderr = child.communicate(timeout=120)
    assert child.returncode == 0, stderr
    assert "sysman" in stdout and "read p50" in stdout
    with Store.open(out) as s:
        used = s.samples(sources=["sysman"], metrics=["used_bytes"], devices=["xpu:0"])
        vals = used["value"].astype("int64")
        first_low = vals.tolist().index(2 * GiB)
        assert set(vals[:first_low]) == {8 * GiB} and set(vals[first_low:]) == {2 * GiB}
        procs = s.samples(sources=["sysman"], metrics=["process_used_bytes"])
        assert set(procs["pid"].dropna()) == {321} and procs["value"].iloc[-1] == 2 * GiB
        assert s.devices().query("source == 'sysman'")["device"].tolist() == ["xpu:0"]
        stats = s.meta()["stats"]
        assert stats["sysman"]["ticks"] > 0 and stats["sysman"]["read_latency_p50_s"] is not None
        assert stats["host"]["ticks"] > 0


def test_record_with_unavailable_sysman_fails_cleanly_when_asked_for(ze, tmp_path):
    env = no_loader_env(ze)
    proc = memsaver("record", "--out", str(tmp_path / "x.sqlite"), "--sources", "sysman", "--duration", "1s",
                    env=env)
    assert proc.returncode == 1
    assert "source sysman is unavailable" in proc.stderr and "libze_loader.so.1 not found" in proc.stderr
    assert proc.stderr.count("\n") == 1  # one line, no traceback
    assert not (tmp_path / "x.sqlite").exists()



def test_check_xpu_example_runs_over_the_fake_loader(ze):
    ze.write(FakeZe([FakeDevice(modules=[FakeModule(16 * GiB, 16 * GiB)], processes=[FakeProcess(12, GiB)])]))
    proc = subprocess.run([sys.executable, "examples/check_xpu.py", "--reads", "3"], cwd=ROOT,
                          env=ze.env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "sysman available: True" in proc.stdout and "read latency over 3 reads" in proc.stdout
    assert "needs root or CAP_PERFMON on i915" in proc.stdout
