"""The `duetime spark import` command: a file of sends (spark.import_job) or, with --restore,
an export of `duetime spark export` (spark.restore_job). Prints the job's JSON summary as its
last line; exit 1 when a campaign refuses the import (nothing written), 2 for bad flags."""

from __future__ import annotations

import argparse
import json
import sys

from app.errors import DuetimeError
from spark import if_exists, import_job, restore_job


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="duetime spark import")
    p.add_argument("file")
    p.add_argument("--topic", required=True)
    p.add_argument("--tenant", default="dev")
    p.add_argument("--campaign", default=None)
    p.add_argument("--rejects", default=None, help="folder for the rejects CSV "
                   "(default: FILE.rejects)")
    p.add_argument("--if-exists", choices=if_exists.MODES, default=None,
                   help="a row whose id the topic has, with other content: reject (default; "
                   "listed in the rejects file), replace (while the message is scheduled) or "
                   "keep (the message as it is)")
    p.add_argument("--restore", action="store_true", help="FILE is an export of "
                   "`duetime spark export`: bring its messages back in their states")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    args.rejects = args.rejects or args.file.rstrip("/") + ".rejects"
    if args.restore and args.campaign:
        print("--campaign does not apply to --restore: messages keep their own",
              file=sys.stderr)
        return 2
    if args.restore and args.if_exists:
        print("--if-exists does not apply to --restore: messages present are kept",
              file=sys.stderr)
        return 2
    args.if_exists = args.if_exists or "reject"
    try:
        summary = restore_job.run(args) if args.restore else import_job.run(args)
    except DuetimeError as exc:  # a campaign refuses the import: nothing was written
        print(f"import refused: {exc.detail}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
