"""Run a job of spark/ with spark-submit: local[*] by default, any Spark master when given.

For a cluster master the code of app/ and spark/ travels as a zip (--py-files); executors need
duetime's Python dependencies installed (pip install duetime). Imports no pyspark itself, so
the CLI can build the command cheaply.

The spark-cassandra-connector's jars are those in DUETIME_SPARK_JARS (a directory; default
var/spark/jars of the source tree, where `make setup` fetches them). Where that directory
holds none (an installed wheel), spark-submit fetches the connector itself from Maven
Central (--packages) into its Ivy cache, ~/.ivy2, once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JARS_DIR = ROOT / "var" / "spark" / "jars"
CONNECTOR = "com.datastax.spark:spark-cassandra-connector_2.12:3.5.1"
JOBS = {"import": "import_command.py", "report": "report_job.py", "export": "export_job.py"}


def jars_dir() -> Path:
    """Where the connector's jars are looked for: DUETIME_SPARK_JARS, else the tree's."""
    return Path(os.environ.get("DUETIME_SPARK_JARS") or DEFAULT_JARS_DIR)


def connector_args() -> list[str]:
    """spark-submit's arguments that bring the connector: the jars found, else --packages."""
    jars = sorted(str(p) for p in jars_dir().glob("*.jar"))
    return ["--jars", ",".join(jars)] if jars else ["--packages", CONNECTOR]


def _code_zip() -> Path:
    # not beside the code: an installed package's directory may not be writable
    target = Path(tempfile.mkdtemp(prefix="duetime-spark-")) / "duetime-code.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in ("app", "spark"):
            for path in (ROOT / package).rglob("*.py"):
                archive.write(path, path.relative_to(ROOT))
    return target


def command(job: str, args: list[str], master: str | None) -> list[str]:
    """The spark-submit command line of a job."""
    master = master or "local[*]"
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", master,
           *connector_args(), "--driver-memory", "2g",
           "--conf", "spark.ui.showConsoleProgress=false", "--conf", "spark.log.level=WARN"]
    if not master.startswith("local"):
        cmd += ["--py-files", str(_code_zip())]
    return [*cmd, str(ROOT / "spark" / JOBS[job]), *args]


def submit(job: str, args: list[str], master: str | None = None) -> int:
    """Run the job in the foreground; its exit status."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.call(command(job, args, master), env=env)
