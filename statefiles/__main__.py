"""`python -m computegroups.statefiles [DIR]`: print the current state of a state directory as JSON.

The state is a snapshot plus the journal of changes after it, so no single
file holds it: this replays them as cgd does, without taking the lock or
writing anything, and prints the document (`| jq` reads it). Without DIR it
reads the directory cgd would use (`--state-dir`, `$CG_STATE_DIR`, the
mode's default). Exit 1 with the reason when the state does not load.
What loading notices on the way (a fallback to the backup, an incomplete
last journal entry left out) goes to stderr, since a person reads this.
"""

from __future__ import annotations

import argparse
import logging
import sys

import msgspec

from computegroups.statefiles.errors import StateError
from computegroups.statefiles.paths import resolve_state_dir
from computegroups.statefiles.store import StateStore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m computegroups.statefiles",
                                     description="Print the current state of a state directory as JSON.")
    parser.add_argument("directory", nargs="?",
                        help="the state directory (default: $CG_STATE_DIR, else the default of your mode, "
                             "as cgd without --state-dir)")
    parser.add_argument("--generation", action="store_true", help="print only the generation")
    args = parser.parse_args(argv)
    notes = logging.StreamHandler(sys.stderr)
    notes.setFormatter(logging.Formatter(f"{parser.prog}: %(message)s"))
    logger = logging.getLogger("computegroups.statefiles")
    logger.addHandler(notes)
    logger.setLevel(logging.INFO)
    store = StateStore(resolve_state_dir(args.directory))
    if args.directory is None:  # a cgd started with --state-dir keeps its state elsewhere: say which one this is
        logger.info("the state in %s", store.directory)
    if not store.directory.is_dir():
        print(f"python -m computegroups.statefiles: no state directory at {store.directory}", file=sys.stderr)
        return 1
    try:
        doc = store.load()
    except StateError as exc:
        print(f"python -m computegroups.statefiles: {exc}", file=sys.stderr)
        return 1
    if args.generation:
        print(doc.generation)
        return 0
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
