"""`make up` brings the API up in the background and /readyz answers 200; the API stops again."""

from __future__ import annotations

import os
import subprocess
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PORT = "18080"


def test_make_up_then_readyz_200() -> None:
    env = {**os.environ, "DUETIME_HTTP_PORT": PORT}
    up = subprocess.run(["make", "up"], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        assert f"http://127.0.0.1:{PORT}/" in up.stdout
        assert "dev API key" in up.stdout
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/readyz", timeout=5) as answer:
            assert answer.status == 200
    finally:
        pidfile = ROOT / "var" / "run" / "api.pid"
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), 15)
            pidfile.unlink()
