"""The lease-pass lock of a host (app.host_locks) between real processes: held, waited for,
and released by the kernel when its holder is killed."""

from __future__ import annotations

import os
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


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_sweep_removes_the_files_of_topics_nobody_held_for_a_day_and_only_those(
        tmp_path: Path) -> None:
    locks = HostLocks(tmp_path, stale_s=3600)
    old, recent, held = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    for key in (old, recent, held):
        with locks.hold(key):
            (tmp_path / f"{key}.taken").write_text("000000000000001\n")
    _age(tmp_path / str(old), 7200)
    _age(tmp_path / str(recent), 1800)
    with locks.hold(held):
        _age(tmp_path / str(held), 7200)  # stale by its time, but held now
        assert locks.sweep() == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [str(recent), f"{recent}.taken", str(held), f"{held}.taken"])
    _age(tmp_path / str(recent), 7200)
    with locks.hold(recent):  # a hold marks the lock used
        pass
    assert locks.sweep() == 1  # the held one, free now
    assert sorted(p.name for p in tmp_path.iterdir()) == [str(recent), f"{recent}.taken"]
    with locks.hold(old):  # a topic swept away just makes new files
        pass
    assert (tmp_path / str(old)).exists()


def test_each_process_sweeps_now_and_then_as_it_holds(tmp_path: Path) -> None:
    locks = HostLocks(tmp_path, stale_s=3600, sweep_every_s=0)
    gone = uuid.uuid4()
    with locks.hold(gone):
        pass
    _age(tmp_path / str(gone), 7200)
    with locks.hold(uuid.uuid4()):
        assert (tmp_path / str(gone)).exists()  # the sweep runs once a hold ends
    assert not (tmp_path / str(gone)).exists()
    later = HostLocks(tmp_path, stale_s=3600)  # the first sweep waits an interval
    _age(next(tmp_path.iterdir()), 7200)
    with later.hold(uuid.uuid4()):
        pass
    assert len(list(tmp_path.iterdir())) == 2
