"""The lease-pass lock of a host (app.host_locks) between real processes: held, waited for,
and released by the kernel when its holder is killed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from app.host_locks import HostLocks

HOLDER = """
import sys, time, uuid
from pathlib import Path
from app.host_locks import HostLocks
with HostLocks(Path(sys.argv[1])).hold(uuid.UUID(sys.argv[2])):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def _holder(directory: Path, key: uuid.UUID, seconds: float) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory), str(key),
                              str(seconds)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_another_process_waits_for_the_holder(tmp_path: Path) -> None:
    key = uuid.uuid4()
    child = _holder(tmp_path, key, 0.5)
    began = time.monotonic()
    with HostLocks(tmp_path).hold(key):
        waited = time.monotonic() - began
    assert child.wait(5) == 0
    assert waited >= 0.3, waited
    with HostLocks(tmp_path).hold(uuid.uuid4()):  # other keys are free meanwhile
        pass


def test_a_killed_holder_releases_the_lock(tmp_path: Path) -> None:
    key = uuid.uuid4()
    child = _holder(tmp_path, key, 60)
    child.kill()
    child.wait(5)
    began = time.monotonic()
    with HostLocks(tmp_path).hold(key):
        assert time.monotonic() - began < 5


def test_threads_of_one_process_exclude_each_other(tmp_path: Path) -> None:
    locks, key = HostLocks(tmp_path), uuid.uuid4()
    inside: list[int] = []
    overlaps: list[int] = []

    def work() -> None:
        for _ in range(20):
            with locks.hold(key):
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(len(inside))
                time.sleep(0.001)
                inside.pop()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert overlaps == []


def test_a_lock_that_cannot_be_opened_is_done_without(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    locks = HostLocks(blocker / "locks")
    with locks.hold(uuid.uuid4()):  # no exception: the pass runs unlocked
        pass
    assert not (blocker / "locks").exists()
