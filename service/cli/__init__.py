"""``vaeserve``: serve | decode | encode | convert | plan | settings | loadtest.

One module per job: ``serve`` (the HTTP service; its flags come from ``service.settings``),
``offline`` (decode, encode and convert files on this machine's devices), ``plan`` (will a decode
fit a TPU slice or a GPU host, compiled without one) and ``loadtest`` (an httpx load generator).
"""

from __future__ import annotations

import argparse
import sys

from . import offline, plan, serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vaeserve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    serve.add_parsers(sub)
    offline.add_parsers(sub)
    plan.add_parser(sub)
    sub.add_parser("loadtest", help="httpx load test (see vaeserve loadtest --help)", add_help=False)
    return parser


COMMANDS = {"serve": serve.serve, "settings": serve.print_settings, "decode": offline.decode,
            "encode": offline.encode, "convert": offline.convert, "plan": plan.run}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "loadtest":  # its own parser
        from .loadtest import main as loadtest_main

        return loadtest_main(argv[1:])
    args = build_parser().parse_args(argv)
    return COMMANDS[args.command](args)
