"""Run a job of spark/ with spark-submit: local[*] by default, any Spark master when given.

For a cluster master the code of app/ and spark/ travels as a zip (--py-files); executors need
duetime's Python dependencies installed (pip install duetime). Imports no pyspark itself, so
the CLI can build the command cheaply.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JARS_DIR = ROOT / "var" / "spark" / "jars"
JOBS = {"import": "import_command.py", "report": "report_job.py", "export": "export_job.py"}


def _code_zip() -> Path:
    target = ROOT / "var" / "spark" / "duetime-code.zip"
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in ("app", "spark"):
            for path in (ROOT / package).rglob("*.py"):
                archive.write(path, path.relative_to(ROOT))
    return target


def command(job: str, args: list[str], master: str | None) -> list[str]:
    """The spark-submit command line of a job."""
    jars = sorted(str(p) for p in JARS_DIR.glob("*.jar"))
    if not jars:
        raise SystemExit(f"no connector jars in {JARS_DIR}; run `make setup` first")
    master = master or "local[*]"
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", master,
           "--jars", ",".join(jars), "--driver-memory", "2g",
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
