"""The flags, input formats and exit codes of `duetime-admin spark import | export | report`, with
no pyspark import, so `--help` answers at once (the jobs parse their arguments with these).
"""

from __future__ import annotations

import argparse
import textwrap

COMMAND = "duetime-admin spark"  # how a person runs the jobs
WIDTH = 88  # columns of --help
IF_EXISTS = ("reject", "replace", "keep")  # --if-exists, as the API's if_exists

# exit code → what it means; every failure prints one line on stderr saying what is wrong
OK, REFUSED, USAGE, CASSANDRA, NO_TOPIC, INPUT, MASTER = 0, 1, 2, 3, 4, 5, 6
EXIT_CODES = {
    OK: "done (the last line of stdout is the JSON summary)",
    REFUSED: "a campaign refuses the import (cancelled, or being cancelled or shifted): "
             "nothing written",
    USAGE: "bad flags, or the input's format cannot be told from its name (--format)",
    CASSANDRA: "Cassandra cannot be reached",
    NO_TOPIC: "the tenant has no such topic",
    INPUT: "the input cannot be read: no such file or folder, not in its format, or a URL "
           "scheme with no file system on the classpath (s3a://: `make spark-s3a`)",
    MASTER: "the Spark master cannot be reached",
}

# --format → the file name endings that imply it (after a compression suffix is dropped)
FORMATS = {"csv": (".csv",), "json": (".json", ".jsonl", ".ndjson"),
           "parquet": (".parquet",)}
COMPRESSED = (".gz", ".bz2", ".deflate", ".lz4", ".snappy")
URLS = ("a local path or file:// URL, hdfs://, or s3a:// once `make spark-s3a` has fetched "
        "hadoop-aws; a file, or a folder of files of one format")


def format_of(path: str) -> str | None:
    """The format a file or folder's name implies (csv, json or parquet), or None."""
    name = path.lower().rstrip("/")
    for suffix in COMPRESSED:
        name = name.removesuffix(suffix)
    return next((fmt for fmt, ends in FORMATS.items() if name.endswith(ends)), None)


def _epilog() -> str:
    codes = "\n".join(textwrap.fill(meaning, WIDTH, initial_indent=f"  {code}  ",
                                     subsequent_indent="     ")
                       for code, meaning in EXIT_CODES.items())
    return textwrap.fill(f"--master URL (an option of `{COMMAND}` itself, before the job's "
                         "name or after it): the Spark master, default local[*].", WIDTH) \
        + "\n\nexit codes:\n" + codes


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, description=textwrap.fill(description, WIDTH),
                                   epilog=_epilog(),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def import_parser() -> argparse.ArgumentParser:
    p = _parser(f"{COMMAND} import", "Schedule the sends of a file (CSV with a header row, "
                "JSON lines or Parquet), or restore an export (--restore).")
    p.add_argument("file", help=f"the input: {URLS}")
    p.add_argument("--topic", required=True)
    p.add_argument("--tenant", default="dev")
    p.add_argument("--campaign", default=None)
    p.add_argument("--format", choices=sorted(FORMATS), default=None,
                   help="the input's format (default: from its name: .csv, "
                   ".json/.jsonl/.ndjson, .parquet, each optionally .gz or .bz2); json is "
                   "JSON lines, one object a line")
    p.add_argument("--rejects", default=None, help="folder for the rejects CSV (default: "
                   "FILE.rejects; a run replaces the rejects of an earlier run there, and "
                   "says so)")
    p.add_argument("--if-exists", choices=IF_EXISTS, default=None,
                   help="a row whose id the topic has, with other content: reject (default; "
                   "listed in the rejects file), replace (while the message is scheduled) or "
                   "keep (the message as it is)")
    p.add_argument("--restore", action="store_true", help="FILE is an export of "
                   "`duetime-admin spark export` (Parquet): bring its messages back in their "
                   "states")
    return p


def export_parser() -> argparse.ArgumentParser:
    p = _parser(f"{COMMAND} export", "Write every message of a topic, in every state, to "
                "Parquet (`duetime-admin spark import --restore` brings it back).")
    p.add_argument("--topic", required=True)
    p.add_argument("--tenant", default="dev")
    p.add_argument("--out", required=True, help="the Parquet folder to write (replaced): "
                   f"{URLS.split('; ')[0]}")
    return p


def report_parser() -> argparse.ArgumentParser:
    p = _parser(f"{COMMAND} report", "Messages per state, overdue and upcoming load, "
                "delivery lag, attempts and the campaign funnel of a topic, as Parquet, CSV "
                "and an HTML page with charts; times in RFC 3339 (UTC).")
    p.add_argument("--topic", required=True)
    p.add_argument("--tenant", default="dev")
    p.add_argument("--campaign", default=None)
    p.add_argument("--out", default=None, help="folder for the report (default reports/TOPIC)")
    return p


PARSERS = {"import": import_parser, "export": export_parser, "report": report_parser}
