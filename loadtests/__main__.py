"""`python -m loadtests run [options] [-- extra Locust options]`."""

from __future__ import annotations

import argparse
import sys

from loadtests.runner import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser(
        "run",
        help="one load run with a leak check; options unknown here go "
        "to Locust (e.g. --disconnect-mix first-byte=1,after-chunks=1)",
    )
    add_arguments(r)
    args, extra = p.parse_known_args(argv)
    extra = [x for x in extra if x != "--"]
    return run(args, extra)


if __name__ == "__main__":
    sys.exit(main())
