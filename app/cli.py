"""`duetime-admin`, the server distribution's operator commands: schema migrations, API keys,
the OpenAPI file, a releaser, Spark jobs.

  duetime-admin schema apply | status
  duetime-admin keys create --tenant NAME [--name LABEL]   (prints the new key as its last line)
  duetime-admin keys list [--tenant NAME]                  (key ids, never keys)
  duetime-admin keys revoke --key-id ID                    (an id from list, or the key itself)
  duetime-admin openapi [--output PATH]
  duetime-admin releaser [--member NAME]   (runs until SIGTERM/SIGINT, then stops gracefully)
  duetime-admin spark import FILE --topic T [--tenant T] [--campaign C] [--rejects DIR]
                                [--master URL]
  duetime-admin spark import EXPORT --topic T --restore [--tenant T] [--master URL]
  duetime-admin spark export --topic T --out DIR [--tenant T] [--master URL]
  duetime-admin spark report --topic T [--tenant T] [--campaign C] [--out DIR] [--master URL]

The user commands (topics, enqueue, get, ...) are the `duetime` command of the client
distribution (clients/python), which imports nothing of the server.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from app.config import ConfigError, load_config
from app.core.ids import NAME
from app.core.timeparse import format_ms
from app.errors import StoreUnavailable
from app.ops import logs
from app.services import Services
from app.store import migrations
from app.store.keys import KEY_ID_CHARS, KeyNotFound, hash_key


def _schema(services: Services, args: argparse.Namespace) -> int:
    if args.action == "apply":
        done = migrations.apply(services.db)
        for m in done:
            print(f"applied {m.version:03d}_{m.name}")
        print(f"schema current in keyspace {services.db.keyspace} ({len(done)} applied now)")
        return 0
    todo = migrations.pending(services.db)
    for m in todo:
        print(f"pending {m.version:03d}_{m.name}")
    print("schema current" if not todo else f"{len(todo)} pending")
    return 0 if not todo else 1


def _keys(services: Services, args: argparse.Namespace) -> int:
    if args.action == "list":
        print(f"{'key id':16}  {'tenant':20}  {'created':24}  name")
        for k in services.keys.all(args.tenant):
            print(f"{k.key_id:16}  {k.tenant:20}  {format_ms(k.created_at_ms):24}  {k.name}")
        return 0
    if args.action == "revoke":
        try:
            gone = services.keys.revoke(args.key_id or "")
        except KeyNotFound as exc:
            print(f"not revoked: {exc}", file=sys.stderr)
            return 1
        print(f"revoked key {gone.key_id} of tenant {gone.tenant}; processes that used it stop "
              f"accepting it within {services.config.key_cache_s:g} s")
        return 0
    if not args.tenant or not NAME.match(args.tenant):
        print(f"--tenant must match {NAME.pattern}", file=sys.stderr)
        return 2
    key = services.keys.create(args.tenant, args.name or "")
    print(f"created key {hash_key(key)[:KEY_ID_CHARS]} for tenant {args.tenant}; "
          "it is shown only once:")
    print(key)
    return 0


def _openapi(args: argparse.Namespace) -> int:
    from app import create_app
    from app.api.openapi_file import spec_yaml

    app = create_app(load_config())
    text = spec_yaml(app.extensions["flask-smorest"]["apis"][""]["ext_obj"])
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="duetime-admin", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    schema = sub.add_parser("schema", help="apply or inspect CQL migrations")
    schema.add_argument("action", choices=["apply", "status"])
    keys = sub.add_parser("keys", help="manage API keys")
    keys.add_argument("action", choices=["create", "list", "revoke"])
    keys.add_argument("--tenant", default=None, help="create: required; list: only its keys")
    keys.add_argument("--name", default="")
    keys.add_argument("--key-id", default=None, help="revoke: a key id from list, or the key")
    openapi = sub.add_parser("openapi", help="write the OpenAPI document generated from code")
    openapi.add_argument("--output", default="openapi.yaml")
    releaser = sub.add_parser("releaser", help="release due messages of the owned shards")
    releaser.add_argument("--member", default=None,
                          help="this releaser's name (default: host name and a random suffix)")
    spark = sub.add_parser("spark", help="bulk import and reports with Spark (spark-submit)",
                           add_help=False)  # -h shows the job's own flags (spark.usage)
    spark.add_argument("job", choices=["import", "export", "report"])
    spark.add_argument("--master", default=None, help="Spark master URL (default local[*])")
    return parser


def _spark(args: argparse.Namespace, rest: list[str]) -> int:
    from spark.submit import submit
    from spark.usage import PARSERS

    if {"-h", "--help"} & set(rest):
        PARSERS[args.job]().print_help()
        return 0
    return submit(args.job, rest, args.master)


def _releaser(services: Services, args: argparse.Namespace) -> int:
    from workers.releaser import run_forever

    logs.configure()
    run_forever(services, args.member)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args, rest = build_parser().parse_known_args(argv)
    if rest and args.command != "spark":
        build_parser().parse_args(argv)  # reports the unknown arguments and exits
    try:
        if args.command == "openapi":
            return _openapi(args)
        if args.command == "spark":
            return _spark(args, rest)
        services = Services(load_config())
        try:
            commands = {"schema": _schema, "keys": _keys, "releaser": _releaser}
            return commands[args.command](services, args)
        finally:
            services.close()
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    except StoreUnavailable as exc:
        print(f"{exc.detail} (is Cassandra running? `make up` starts one)", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `duetime-admin keys list | head`: the reader has enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
