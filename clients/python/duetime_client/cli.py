"""The `duetime` command. Its commands (duetime_client.commands) talk to a running API and
import nothing of the server, so they start at once. The operator's commands (schema, keys,
openapi, releaser, spark) are the server's `duetime-admin`; asked for one, this says so.

Exit codes: 0 done, 1 an error answer, 2 a usage error, 3 no answer from the API, 130
interrupted (Ctrl-C), 141 output closed early (`duetime topics | head`)."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from duetime_client import __version__, commands

OPERATOR_COMMANDS = {
    "schema": "apply or inspect CQL migrations",
    "keys": "create, list or revoke API keys",
    "openapi": "write the OpenAPI document generated from code",
    "releaser": "run a releaser (until SIGTERM)",
    "spark": "bulk import, export and reports with Spark",
}
EPILOG = ("operator commands are the server's `duetime-admin` (installed with the server, "
          "not with this client):\n" + "\n".join(
              f"  duetime-admin {name:10} {text}" for name, text in OPERATOR_COMMANDS.items()))
INTERRUPTED, PIPE_CLOSED = 130, 141


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="duetime", description=commands.__doc__, epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"duetime {__version__}")
    commands.add_parsers(parser.add_subparsers(dest="command", required=True,
                                               parser_class=Parser))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run `duetime ARGS`; the exit code (see the module)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in OPERATOR_COMMANDS:
        print(f"`{args[0]}` is an operator command of the server: run `duetime-admin "
              f"{args[0]}`, installed with the server package (duetime), not the client",
              file=sys.stderr)
        return 2
    try:
        code = commands.run(build_parser().parse_args(args))
        sys.stdout.flush()  # here, where a closed pipe can still be answered quietly
        return code
    except commands.UsageError as exc:
        print(f"duetime: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return INTERRUPTED
    except BrokenPipeError:
        quiet_stdout()
        return PIPE_CLOSED


def quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit does not fail again on
    the closed pipe (and print that it did)."""
    # a stdout with no file descriptor (captured in a test) has nothing to flush at exit
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
