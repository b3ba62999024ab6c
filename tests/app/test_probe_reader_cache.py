"""The CPU probe's cache (cache/hardware_probe.json) replaced by something hostile: a link to /dev/zero, a FIFO,
a 1 GB file, a folder, JSON nested 200,000 deep, invalid UTF-8, fields of the wrong kind. Every reader of it
(``probe_cpu``, which doctor, the dashboard and the window's fit all go through, measuring or not) treats it as
no cache, with a log line: never a hang, a traceback or gigabytes read. A measuring read then replaces it
atomically with a real probe.

Each read runs in a child process capped with RLIMIT_AS and a timeout, so the test process is never at risk.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from app.ceiling.cpu import PROBE_CACHE_FILE, PROBE_SCHEMA, cpu_model_name, machine_fingerprint

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 3 << 30  # numpy, its BLAS threads and the 128 MB probe buffer fit many times over
TIMEOUT_S = 60  # a probe takes a few seconds; a FIFO read would wait for ever

PROBE = """
import json, logging, sys
from pathlib import Path
logging.basicConfig(level=logging.WARNING, format="LOG %(message)s", stream=sys.stdout)
from app.ceiling.cpu import probe_cpu
info = probe_cpu(cache_path=Path(sys.argv[1]), measure=sys.argv[2] == "measure")
print("RESULT " + json.dumps({"cached": info.cached, "bandwidth": info.bandwidth, "peak": info.peak_flops,
                              "source": info.bandwidth_source}))
"""


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def probe_in_child(path: Path, measure: bool) -> tuple[dict[str, object], list[str]]:
    """probe_cpu on ``path`` in a capped child: (its result, its log lines)."""
    proc = subprocess.run([sys.executable, "-c", PROBE, str(path), "measure" if measure else "read"], cwd=ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT_S, preexec_fn=_cap)
    assert proc.returncode == 0, f"rc {proc.returncode}: {proc.stderr[-1500:]}"
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stdout.splitlines()
    result = json.loads(next(ln for ln in lines if ln.startswith("RESULT "))[len("RESULT "):])
    return result, [ln for ln in lines if ln.startswith("LOG ")]


def this_machine() -> str:
    import psutil

    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    return machine_fingerprint(cpu_model_name(), physical, logical, int(psutil.virtual_memory().total))


def good_probe(**fields: object) -> dict[str, object]:
    return {"schema": PROBE_SCHEMA, "machine": this_machine(), "bandwidth": 20e9, "peak_flops": 300e9,
            "quiet": True, "runs": 1, **fields}


def make_hostile(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "huge":
        with path.open("wb") as fh:  # sparse: 1 GB on paper, nothing on disk
            fh.truncate(1 << 30)
    elif kind == "folder":
        path.mkdir()
    elif kind == "nested":
        path.write_bytes(b"[" * 200_000 + b"]" * 200_000)
    elif kind == "nested_object":
        path.write_bytes(b'{"schema": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    elif kind == "bad_utf8":
        path.write_bytes(b'{"schema": "\xff\xfe"}')
    elif kind == "not_an_object":
        path.write_text("[1, 2, 3]")
    elif kind == "infinite_rate":
        path.write_text(json.dumps(good_probe(bandwidth=float("inf")), allow_nan=True))
    elif kind == "nan_rate":
        path.write_text(json.dumps(good_probe(peak_flops=float("nan")), allow_nan=True))
    elif kind == "rate_as_text":
        path.write_text(json.dumps(good_probe(bandwidth="fast")))
    elif kind == "runs_as_text":
        path.write_text(json.dumps(good_probe(runs="many", quiet=False)))
    elif kind == "huge_runs":
        path.write_text(f'{{"schema": {PROBE_SCHEMA}, "machine": {json.dumps(this_machine())}, "bandwidth": 2e10, '
                        '"peak_flops": 3e11, "quiet": false, "runs": 1e400}')
    else:
        raise AssertionError(kind)


UNREADABLE = ("dev_zero", "fifo", "huge", "folder", "nested", "nested_object", "bad_utf8")
DAMAGED = ("not_an_object", "infinite_rate", "nan_rate", "rate_as_text", "runs_as_text", "huge_runs")


@pytest.mark.parametrize("kind", UNREADABLE + DAMAGED)
def test_a_hostile_cache_reads_as_no_cache_with_a_log_line(tmp_path: Path, kind: str) -> None:
    """The read the window's fit makes (measure=False): no rates, nothing measured, one log line."""
    path = tmp_path / "cache" / PROBE_CACHE_FILE
    make_hostile(path, kind)
    result, logged = probe_in_child(path, measure=False)
    assert result == {"cached": True, "bandwidth": 0.0, "peak": 0.0, "source": "not measured"}
    assert len(logged) == 1, logged
    assert PROBE_CACHE_FILE in logged[0]
    assert "measured again" in logged[0]


@pytest.mark.parametrize("kind", ["dev_zero", "fifo", "huge", "nested", "infinite_rate", "runs_as_text", "huge_runs"])
def test_a_measuring_read_probes_again_and_replaces_the_cache(tmp_path: Path, kind: str) -> None:
    """doctor's read: the CPU is measured again and the cache replaced, atomically, by a real probe."""
    path = tmp_path / "cache" / PROBE_CACHE_FILE
    make_hostile(path, kind)
    result, logged = probe_in_child(path, measure=True)
    assert result["cached"] is False
    assert isinstance(result["bandwidth"], float)
    assert result["bandwidth"] > 0
    assert len(logged) == 1, logged
    assert path.is_file()
    assert not path.is_symlink()
    saved = json.loads(path.read_text())
    assert saved["bandwidth"] == result["bandwidth"]
    assert saved["runs"] == 1
    assert [p.name for p in path.parent.iterdir()] == [PROBE_CACHE_FILE]  # no temp file left behind
    again, logged = probe_in_child(path, measure=False)
    assert again["cached"] is True
    assert again["bandwidth"] == result["bandwidth"]
    assert logged == []


def test_a_good_cache_is_read_without_a_word(tmp_path: Path) -> None:
    path = tmp_path / PROBE_CACHE_FILE
    path.write_text(json.dumps(good_probe()))
    result, logged = probe_in_child(path, measure=True)
    assert result == {"cached": True, "bandwidth": 20e9, "peak": 300e9, "source": "measured"}
    assert logged == []


def test_another_machines_probe_is_measured_again_without_a_complaint(tmp_path: Path) -> None:
    path = tmp_path / PROBE_CACHE_FILE
    path.write_text(json.dumps(good_probe(machine="another machine")))
    result, logged = probe_in_child(path, measure=False)
    assert result["bandwidth"] == 0.0
    assert logged == []
