#!/usr/bin/env python3
"""Local Apache Cassandra 5.0 nodes for development, tests and benchmarks.

Standard library only: it runs before the project's virtualenv exists.

Nodes:
  dev        one node on 127.0.0.1:9042 (storage 7000, JMX 7199), heap 3 GiB
  c1, c2, c3 a 3-node cluster on 127.0.0.1/.2/.3, CQL port 9043, storage 7010,
             JMX 7201/7202/7203, heap 512 MiB each (ccm's layout: a folder per node)
  solo       one node on 127.0.0.1:9044 (storage 7020, JMX 7210), heap 512 MiB: the tests
             that stop a node stop this one, never the dev node a user's stack runs on

Everything lives under var/: jars in var/cassandra/lib (fetched by Maven from Maven Central,
see devstack/pom.xml), per-node config, data and pid under var/cassandra/<node>, logs under
var/log/<node>/system.log.

Usage: cassandra.py fetch | start [NODE...] | stop [NODE...] | kill NODE | status [NODE]
                    | wait NODE | nodetool NODE ARGS... | version
NODE defaults to dev; "cluster" means c1 c2 c3.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEVSTACK = ROOT / "devstack"
VAR = Path(os.environ.get("DUETIME_VAR_DIR", ROOT / "var"))
LIB = VAR / "cassandra" / "lib"
READY_TIMEOUT_S = 180.0


@dataclasses.dataclass(frozen=True)
class Node:
    """One local Cassandra process: its addresses, ports and sizing."""

    name: str
    ip: str
    native_port: int
    storage_port: int
    jmx_port: int
    heap_mb: int
    cluster_name: str
    seeds: str
    num_tokens: int
    initial_token: str | None = None
    # batch: a write is acknowledged once its commit log is on disk, so a kill -9 loses no
    # acknowledged write. periodic (every 10 s): faster, but a single node killed loses what
    # it acknowledged since its last sync (a cluster keeps it on the other replicas).
    commitlog_sync: str = "periodic"

    @property
    def home(self) -> Path:
        return VAR / "cassandra" / self.name

    @property
    def logdir(self) -> Path:
        return VAR / "log" / self.name

    @property
    def pidfile(self) -> Path:
        return self.home / "cassandra.pid"


def _cluster_token(index: int, count: int = 3) -> str:
    """Evenly spaced Murmur3 tokens, so three single-token nodes own a third each."""
    return str(-(2**63) + index * (2**64 // count))


NODES: dict[str, Node] = {
    "dev": Node("dev", "127.0.0.1", 9042, 7000, 7199, 3072, "duetime-dev", "127.0.0.1:7000", 4),
    **{
        f"c{i}": Node(
            f"c{i}", f"127.0.0.{i}", 9043, 7010, 7200 + i, 512, "duetime-cluster",
            "127.0.0.1:7010", 1, _cluster_token(i - 1),
        )
        for i in (1, 2, 3)
    },
    "solo": Node("solo", "127.0.0.1", 9044, 7020, 7210, 512, "duetime-solo", "127.0.0.1:7020",
                 4, commitlog_sync="batch"),  # the fault suite kills it with -9
}

# Cassandra 5.0's conf/jvm-server.options and conf/jvm17-server.options (GC, JPMS, Netty),
# less AlwaysPreTouch, which only slows start-up of a small dev heap.
JVM17_FLAGS = [
    "-ea", "-da:net.openhft...", "-XX:+UseThreadPriorities", "-XX:+HeapDumpOnOutOfMemoryError",
    "-XX:+ExitOnOutOfMemoryError",
    "-Xss256k", "-XX:+UseTLAB", "-XX:+ResizeTLAB", "-XX:+PerfDisableSharedMem",
    "-Djava.net.preferIPv4Stack=true",
    "-XX:+UseG1GC", "-XX:+ParallelRefProcEnabled", "-XX:MaxTenuringThreshold=1",
    "-XX:G1HeapRegionSize=16m", "-XX:G1RSetUpdatingPauseTimePercent=5",
    "-XX:MaxGCPauseMillis=300", "-XX:InitiatingHeapOccupancyPercent=70",
    "-Djdk.attach.allowAttachSelf=true",
    "--add-exports", "java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports", "java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED",
    "--add-exports", "java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports", "java.rmi/sun.rmi.server=ALL-UNNAMED",
    "--add-exports", "java.sql/java.sql=ALL-UNNAMED",
    "--add-exports", "java.base/java.lang.ref=ALL-UNNAMED",
    "--add-exports", "jdk.unsupported/sun.misc=ALL-UNNAMED",
    "--add-exports", "jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED",
    "--add-exports", "jdk.attach/sun.tools.attach=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang.module=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.loader=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.reflect=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.math=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.module=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.util.jar=ALL-UNNAMED",
    "--add-opens", "jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens", "java.base/java.io=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens", "jdk.compiler/com.sun.tools.javac=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang=ALL-UNNAMED",
    "--add-opens", "java.base/java.util=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.useCacheForAllThreads=true", "-Dio.netty.allocator.maxOrder=11",
]


def cassandra_version() -> str:
    """The pinned Cassandra version, read from devstack/pom.xml (its one source)."""
    text = (DEVSTACK / "pom.xml").read_text()
    start = text.index("<cassandra.version>") + len("<cassandra.version>")
    return text[start:text.index("</cassandra.version>")]


def fetch() -> None:
    """Download cassandra-all and its runtime jars into var/cassandra/lib, once per version."""
    marker = LIB / f".fetched-{cassandra_version()}"
    if marker.exists():
        return
    LIB.mkdir(parents=True, exist_ok=True)
    for old in LIB.glob("*.jar"):
        old.unlink()
    print(f"fetching Apache Cassandra {cassandra_version()} from Maven Central ...", flush=True)
    subprocess.run(
        ["mvn", "-B", "-q", "-f", str(DEVSTACK / "pom.xml"), "dependency:copy-dependencies",
         "-DincludeScope=runtime", f"-DoutputDirectory={LIB}"],
        check=True,
    )
    marker.touch()


def _render_config(node: Node) -> Path:
    conf = node.home / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    template = (DEVSTACK / "conf" / "cassandra.yaml.tmpl").read_text()
    token_line = f"initial_token: {node.initial_token}" if node.initial_token else ""
    (conf / "cassandra.yaml").write_text(template.format(
        name=node.name, cluster_name=node.cluster_name, num_tokens=node.num_tokens,
        initial_token_line=token_line, seeds=node.seeds, ip=node.ip,
        commitlog_sync=("commitlog_sync: periodic\ncommitlog_sync_period: 10000ms"
                        if node.commitlog_sync == "periodic" else "commitlog_sync: batch"),
        storage_port=node.storage_port, native_port=node.native_port,
        # a quarter of the heap (Cassandra's default): small memtables flushed tiny SSTables
        # whose compaction took a third of the dev node's CPU under load
        memtable_mb=max(64, node.heap_mb // 4),
    ))
    (conf / "logback.xml").write_text((DEVSTACK / "conf" / "logback.xml").read_text())
    return conf


def _java_command(node: Node, conf: Path) -> list[str]:
    jamm = next(LIB.glob("jamm-*.jar"))
    classpath = os.pathsep.join([str(conf), *sorted(str(p) for p in LIB.glob("*.jar"))])
    return [
        "java", f"-Xms{node.heap_mb}m", f"-Xmx{node.heap_mb}m", *JVM17_FLAGS,
        f"-javaagent:{jamm}",
        f"-Dcassandra.config=file://{conf / 'cassandra.yaml'}",
        f"-Dlogback.configurationFile=file://{conf / 'logback.xml'}",
        f"-Dcassandra.logdir={node.logdir}",
        f"-Dcassandra.storagedir={node.home / 'data'}",
        f"-Dcassandra.jmx.local.port={node.jmx_port}",
        "-Dcassandra.skip_wait_for_gossip_to_settle=0",
        "-Dcassandra.ring_delay_ms=2000",
        "-Dcassandra.available_processors=2",
        # the node's approximate clock (request timeouts, expiry of queued messages) is
        # sampled every 2 ms by default: 500 wake-ups a second, two thirds of an idle node's
        # CPU. 20 ms is far finer than any timeout it serves (seconds).
        "-Dcassandra.approximate_time_precision_ms=20",
        "-Dcassandra-foreground=yes",
        "-cp", classpath, "org.apache.cassandra.service.CassandraDaemon",
    ]


def _pid(node: Node) -> int | None:
    try:
        pid = int(node.pidfile.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        return None


def cql_answers(ip: str, port: int, timeout: float = 1.0) -> bool:
    """True when a CQL native-protocol server answers an OPTIONS frame at ip:port."""
    try:
        with socket.create_connection((ip, port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">BBhBi", 0x04, 0, 0, 0x05, 0))  # v4 OPTIONS, no body
            header = sock.recv(9)
            return len(header) == 9 and header[4] == 0x06  # SUPPORTED
    except OSError:
        return False


def start(node: Node) -> None:
    """Start a node unless it already runs; returns once it is launched (see wait)."""
    if _pid(node) or cql_answers(node.ip, node.native_port):
        print(f"cassandra {node.name}: already running on {node.ip}:{node.native_port}")
        return
    fetch()
    conf = _render_config(node)
    node.logdir.mkdir(parents=True, exist_ok=True)
    with open(node.logdir / "stdout.log", "ab") as out:
        proc = subprocess.Popen(
            _java_command(node, conf), stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, cwd=node.home,
        )
    node.pidfile.write_text(str(proc.pid))
    print(f"cassandra {node.name}: started pid {proc.pid}, log {node.logdir / 'system.log'}")


def wait(node: Node, timeout: float = READY_TIMEOUT_S) -> None:
    """Block until the node answers CQL; exits non-zero with its log tail if it dies or stalls."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if cql_answers(node.ip, node.native_port):
            print(f"cassandra {node.name}: CQL ready on {node.ip}:{node.native_port} "
                  f"after {time.monotonic() - began:.1f}s")
            return
        if _pid(node) is None and node.pidfile.exists():
            break
        time.sleep(0.5)
    log = node.logdir / "stdout.log"
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    sys.exit(f"cassandra {node.name}: not ready after {time.monotonic() - began:.0f}s\n{tail}")


def stop(node: Node, sig: int = signal.SIGTERM, grace_s: float = 60.0) -> None:
    """Stop a node (SIGTERM, then SIGKILL after grace_s); a stopped node is left as it is."""
    pid = _pid(node)
    if pid is None:
        print(f"cassandra {node.name}: not running")
        return
    os.kill(pid, sig)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _pid(node):
        time.sleep(0.2)
    if _pid(node):
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    node.pidfile.unlink(missing_ok=True)
    print(f"cassandra {node.name}: stopped ({signal.Signals(sig).name})")


def nodetool(node: Node, args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run Cassandra's nodetool against a node's JMX port."""
    classpath = os.pathsep.join(sorted(str(p) for p in LIB.glob("*.jar")))
    return subprocess.run(
        ["java", "-Xmx128m", *[f for f in JVM17_FLAGS if not f.startswith("-XX:")],
         "-cp", classpath,
         "-Dcassandra.logdir=" + str(node.logdir), "org.apache.cassandra.tools.NodeTool",
         "-h", "127.0.0.1", "-p", str(node.jmx_port), *args],
        capture_output=True, text=True,
    )


def _nodes(names: list[str]) -> list[Node]:
    picked: list[Node] = []
    for name in names or ["dev"]:
        picked.extend(NODES[n] for n in (["c1", "c2", "c3"] if name == "cluster" else [name]))
    return picked


def _start_all(nodes: list[Node]) -> None:
    for node in nodes:  # one at a time: concurrent first starts race on schema
        start(node)
        wait(node)


def _status(nodes: list[Node]) -> None:
    for node in nodes:
        up = "up" if cql_answers(node.ip, node.native_port) else "down"
        print(f"{node.name} {node.ip}:{node.native_port} pid={_pid(node)} cql={up}")


def _each(action: Callable[[Node], object]) -> Callable[[list[Node]], None]:
    def run(nodes: list[Node]) -> None:
        for node in nodes:
            action(node)
    return run


COMMANDS: dict[str, Callable[[list[Node]], None]] = {
    "start": _start_all,
    "stop": _each(stop),
    "kill": _each(lambda n: stop(n, signal.SIGKILL, grace_s=5.0)),
    "wait": _each(wait),
    "status": _status,
}


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if command == "fetch":
        fetch()
    elif command == "version":
        print(cassandra_version())
    elif command == "nodetool":
        result = nodetool(NODES[rest[0]], rest[1:])
        print(result.stdout, result.stderr, sep="", end="")
        return result.returncode
    elif command in COMMANDS:
        COMMANDS[command](_nodes(rest))
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
