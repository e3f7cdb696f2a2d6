"""The `duetime-admin spark import` command: a file of sends (spark.import_job) or, with --restore,
an export of `duetime-admin spark export` (spark.restore_job). Prints the job's JSON summary as its
last line; a failure prints one line and exits with its code (spark.usage.EXIT_CODES)."""

from __future__ import annotations

import sys

from app.errors import DuetimeError, StoreUnavailable
from spark import failures, import_job, restore_job, usage
from spark.failures import JobFailure


def main(argv: list[str]) -> int:
    args = usage.import_parser().parse_args(argv)
    args.rejects = args.rejects or args.file.rstrip("/") + ".rejects"
    if args.restore and args.campaign:
        print("--campaign does not apply to --restore: messages keep their own",
              file=sys.stderr)
        return usage.USAGE
    if args.restore and args.if_exists:
        print("--if-exists does not apply to --restore: messages present are kept",
              file=sys.stderr)
        return usage.USAGE
    if args.restore and args.format not in (None, "parquet"):
        print("--restore reads an export, which is Parquet", file=sys.stderr)
        return usage.USAGE
    args.format = "parquet" if args.restore else args.format or usage.format_of(args.file)
    if args.format is None:
        print(f"cannot tell the format of {args.file} from its name: give --format "
              f"({' | '.join(usage.FORMATS)})", file=sys.stderr)
        return usage.USAGE
    args.if_exists = args.if_exists or "reject"

    def run() -> dict[str, object]:
        try:
            return restore_job.run(args) if args.restore else import_job.run(args)
        except StoreUnavailable:
            raise
        except DuetimeError as exc:  # a campaign refuses the import: nothing was written
            raise JobFailure(usage.REFUSED, f"import refused: {exc.detail}") from exc

    return failures.end(run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
