"""`python -m loadtests run [options] [-- extra Locust options]`, or
`python -m loadtests probe --host URL`: the disconnect probe alone, round after round."""

from __future__ import annotations

import argparse
import sys

from loadtests.runner import add_arguments, add_probe_arguments, probe, run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser(
        "run",
        help="one load run with leak and waste checks; options unknown here go "
        "to Locust (e.g. --disconnect-mix first-byte=1,after-chunks=1)",
    )
    add_arguments(r)
    pr = sub.add_parser(
        "probe", help="hang up on streams of an idle server and count the engine steps it takes"
    )
    add_probe_arguments(pr)
    args, extra = p.parse_known_args(argv)
    if args.command == "probe":
        if extra:
            p.error(f"unrecognized arguments: {' '.join(extra)}")
        return probe(args)
    extra = [x for x in extra if x != "--"]
    return run(args, extra)


if __name__ == "__main__":
    sys.exit(main())
