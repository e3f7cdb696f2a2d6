"""The installed `duetime` command against a served API, as a person meets it: input errors
and usage errors in one line (exit 2), the API's field errors printed, Ctrl-C and a closed
pipe ending quietly, schedules, webhook topics and signing secrets from flags, tables with
`-` for nulls, and the dev key used for an API on this machine only."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import duetime_client

DUETIME = shutil.which("duetime") or "duetime"


def duetime(*args: str, url: str | None = None, key: str | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`duetime ARGS [--url URL] [--key KEY]`, with no DUETIME_* of the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_")}
    extra = [*(["--url", url] if url else []), *(["--key", key] if key else [])]
    return subprocess.run([DUETIME, *args, *extra], capture_output=True, text=True,
                          timeout=60, cwd=cwd, env=env)


def test_input_errors_are_one_line_and_exit_2(url: str, key: str, topic: str) -> None:
    for args in (("enqueue", topic, "not json"),  # payload
                 ("campaigns", topic, "--pause"),  # an action with no campaign
                 ("campaigns", topic, "--rate", "5"),
                 ("schedules", topic, "--delete"),
                 ("topics", "--rotate-secret"),
                 ("enqueue", topic),  # argparse's own: a missing argument
                 ("stats", topic, "--window", "year")):
        done = duetime(*args, url=url, key=key)
        assert done.returncode == 2, (args, done.stderr)
        assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr, (
            args, done.stderr)
        assert done.stdout == ""


def test_the_apis_field_errors_are_printed(url: str, key: str, topic: str) -> None:
    assert duetime("enqueue", topic, "{}", "--id", "m1", "--delay-ms", "600000",
                   "--campaign", "spring", url=url, key=key).returncode == 0
    done = duetime("campaigns", topic, "spring", "--shift-ms", "99999999999999",
                   url=url, key=key)
    assert done.returncode == 1
    first, *fields = done.stderr.splitlines()
    assert first.startswith("error 400")
    assert any(line.strip().startswith("shift_ms: ") for line in fields), done.stderr


def test_version() -> None:
    done = duetime("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"duetime {duetime_client.__version__}"


def test_ctrl_c_in_tail_exits_130_quietly(url: str, key: str, topic: str) -> None:
    # as from a terminal: a run started in the background (`make test &`) has SIGINT ignored,
    # which the child would inherit, and Python then installs no KeyboardInterrupt for it
    tail = subprocess.Popen([DUETIME, "tail", topic, "--url", url, "--key", key],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(1.5)  # in its long poll
    tail.send_signal(signal.SIGINT)
    out, err = tail.communicate(timeout=30)
    assert tail.returncode == 130 and err == "" and out == ""


def test_a_closed_pipe_ends_quietly(url: str, key: str, topic: str) -> None:
    lister = subprocess.Popen([DUETIME, "topics", "--url", url, "--key", key],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert lister.stdout is not None and lister.stderr is not None
    lister.stdout.close()  # the reader has gone (as `| head` does) before anything came
    err = lister.stderr.read().decode()
    assert lister.wait(30) == 141 and err == ""


def test_schedules_are_created_and_deleted(url: str, key: str, topic: str) -> None:
    made = duetime("schedules", topic, "daily", "--cron", "30 9 * * *", "--payload",
                   '{"digest": true}', "--timezone", "Europe/Bucharest", "--json",
                   url=url, key=key)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["timezone"] == "Europe/Bucharest"
    listed = duetime("schedules", topic, url=url, key=key)
    assert listed.returncode == 0 and "daily" in listed.stdout
    gone = duetime("schedules", topic, "daily", "--delete", url=url, key=key)
    assert gone.returncode == 0, gone.stderr
    assert duetime("schedules", topic, "daily", url=url, key=key).returncode == 1


def test_a_webhook_topic_from_flags_and_its_secret_rotated(url: str, key: str,
                                                          topic: str) -> None:
    hook = f"{topic}-hook"
    made = duetime("topics", hook, "--webhook-url", "http://127.0.0.1:9/hook",
                   "--timeout-seconds", "5", "--max-attempts", "3", "--json", url=url, key=key)
    assert made.returncode == 0, made.stderr
    settings = json.loads(made.stdout)
    assert settings["delivery"]["mode"] == "webhook" and settings["max_attempts"] == 3
    assert settings["delivery"]["url"] == "http://127.0.0.1:9/hook"
    assert settings["delivery"]["timeout_seconds"] == 5
    rotated = duetime("topics", hook, "--rotate-secret", "--overlap-seconds", "0", "--json",
                      url=url, key=key)
    assert rotated.returncode == 0, rotated.stderr
    assert json.loads(rotated.stdout)["signing_secret"] != settings["signing_secret"]
    assert duetime("topics", hook, "--delete", url=url, key=key).returncode == 0


def test_tables_print_a_dash_for_nulls_and_stats_its_load_ahead(url: str, key: str,
                                                                topic: str) -> None:
    assert duetime("enqueue", topic, "{}", "--id", "later", "--delay-ms", "600000",
                   url=url, key=key).returncode == 0
    shown = duetime("get", topic, "later", url=url, key=key)
    fields = dict(line.split(None, 1) for line in shown.stdout.splitlines() if " " in line)
    assert fields["last_error"].strip() == "-" and "None" not in shown.stdout
    stats = duetime("stats", topic, url=url, key=key)
    assert stats.returncode == 0, stats.stderr
    lines = stats.stdout.splitlines()
    header = lines.index("upcoming")
    assert lines[header + 1].split() == ["from", "to", "count"]
    assert lines[header + 2].split()[-1] == "1"


def test_the_dev_key_is_used_for_a_local_api_only(url: str, key: str, topic: str,
                                                  tmp_path: Path) -> None:
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "dev-key").write_text(key + "\n")
    local = duetime("topics", topic, url=url, cwd=tmp_path)
    assert local.returncode == 0, local.stderr
    remote = duetime("topics", url="http://192.0.2.1:9", cwd=tmp_path)  # TEST-NET: not here
    assert remote.returncode == 2 and "no API key" in remote.stderr


def test_what_counts_as_this_machine() -> None:
    from duetime_client.commands import is_local

    for url in ("http://localhost:8080", "http://127.0.0.1:8080", "http://127.8.0.1",
                "https://[::1]:8443/prefix"):
        assert is_local(url), url
    for url in ("http://api.example.com", "http://10.0.0.5:8080", "http://localhost.evil.io",
                "http://[2001:db8::1]:8080", "http://128.0.0.1"):
        assert not is_local(url), url
