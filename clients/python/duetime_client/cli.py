"""The `duetime` command. Its user commands (duetime_client.commands) talk to a running API
and import nothing of the server, so they start at once. Its operator commands (schema, keys,
openapi, releaser, spark) run in the server package (`app.cli`), which must be installed
beside this one; without it they exit 2 and say so."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from duetime_client import commands

OPERATOR_COMMANDS = {
    "schema": "apply or inspect CQL migrations",
    "keys": "create, list or revoke API keys",
    "openapi": "write the OpenAPI document generated from code",
    "releaser": "run a releaser (until SIGTERM)",
    "spark": "bulk import, export and reports with Spark",
}
EPILOG = "operator commands, with the server package installed:\n" + "\n".join(
    f"  {name:10} {text}" for name, text in OPERATOR_COMMANDS.items())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="duetime", description=commands.__doc__,
                                     epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands.add_parsers(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run `duetime ARGS`; the exit code (duetime_client.commands.run, or the server's)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in OPERATOR_COMMANDS:
        try:
            server = importlib.import_module("app.cli")
        except ImportError:
            print(f"`duetime {args[0]}` is an operator command: it needs the server package "
                  "(pip install the project's root beside this client)", file=sys.stderr)
            return 2
        code: int = server.main(args)
        return code
    return commands.run(build_parser().parse_args(args))


if __name__ == "__main__":
    sys.exit(main())
