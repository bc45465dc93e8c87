"""`python -m benchmarks`: the same as `goqueue bench` from a checkout."""

import argparse
import sys

from benchmarks.bench import add_bench_command


def main() -> int:
    """Parse `bench` options and run it."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    commands = parser.add_subparsers(dest="command")
    add_bench_command(commands)
    args = parser.parse_args(["bench", *sys.argv[1:]])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
