"""API keys through the `duetime-admin keys` command on the real node: list shows ids, never keys;
a revoked key is refused (401) once the cache time of a process that used it has passed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from app import create_app
from app.config import Config
from app.store.keys import KEY_ID_CHARS, hash_key
from tests.conftest import ROOT


def keys(config: Config, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DUETIME_KEYSPACE": config.keyspace}
    return subprocess.run([sys.executable, "-m", "app.cli", "keys", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_keys_are_listed_by_id_and_a_revoked_key_stops_within_the_cache_time(
        config: Config) -> None:
    made = keys(config, "create", "--tenant", "keyholder", "--name", "ci")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip().splitlines()[-1]
    key_id = hash_key(key)[:KEY_ID_CHARS]
    assert key_id in made.stdout.splitlines()[0]
    other = keys(config, "create", "--tenant", "bystander").stdout.strip().splitlines()[-1]

    listed = keys(config, "list", "--tenant", "keyholder")
    assert listed.returncode == 0 and key_id in listed.stdout and "keyholder" in listed.stdout
    assert key not in listed.stdout and hash_key(key) not in listed.stdout
    assert "bystander" not in listed.stdout

    app = create_app(config.replace(key_cache_s=1.0))
    client = app.test_client()
    try:
        headers = {"Authorization": f"Bearer {key}"}
        assert client.get("/v1/topics", headers=headers).status_code == 200
        assert keys(config, "revoke", "--key-id", "nosuchkey").returncode == 1
        assert keys(config, "revoke", "--key-id", key_id[:4]).returncode == 1  # too short
        revoked = keys(config, "revoke", "--key-id", key_id)
        assert revoked.returncode == 0 and key_id in revoked.stdout, revoked.stderr
        time.sleep(1.2)  # the cache time of this process
        refused = client.get("/v1/topics", headers=headers)
        assert refused.status_code == 401
        assert refused.mimetype == "application/problem+json"
        assert client.get("/v1/topics", headers={
            "Authorization": f"Bearer {other}"}).status_code == 200
    finally:
        app.extensions["duetime"].close()
    assert key_id not in keys(config, "list").stdout
    assert keys(config, "revoke", "--key-id", other).returncode == 0  # the key itself works too


def test_a_list_read_by_a_pipe_that_closes_early_ends_quietly(config: Config) -> None:
    """`duetime-admin keys list | head`: the reader gone, the command ends without a
    traceback (exit 141, as a process ended by SIGPIPE)."""
    assert keys(config, "create", "--tenant", "piped").returncode == 0
    lister = subprocess.Popen(
        [str(Path(sys.executable).parent / "duetime-admin"), "keys", "list"], cwd=ROOT,
        env={**os.environ, "DUETIME_KEYSPACE": config.keyspace},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert lister.stdout is not None and lister.stderr is not None
    lister.stdout.close()
    err = lister.stderr.read().decode()
    assert lister.wait(120) == 141 and err == "", err
