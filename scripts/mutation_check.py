#!/usr/bin/env python3
"""The mutation check (docs/DESIGN.md, "Tests of the maths"): apply realistic one-line bugs in the
techniques' maths (a sign, a scale, an off-by-one, a wrong axis, a dropped term), each alone, to
a scratch copy of this checkout, run the fast tests that must catch it, and print the table. Run
it before a release; it is not part of ``make test`` (about five minutes on one core).

    python scripts/mutation_check.py                 # every mutation; writes docs/MUTATIONS.md
    python scripts/mutation_check.py --only rope-sign --only lora-scaling-dropped
    python scripts/mutation_check.py --list

Exit status 1 when a mutation is missed (its tests pass with the bug) or in error (its text is
no longer in the file, or its tests did not run). The working tree is never changed. The list
and the machinery are slim_fairseq_lab.mutation.
"""
import argparse
import os
import sys

from slim_fairseq_lab import command, mutation
from slim_fairseq_lab.paths import REPO_ROOT

DEFAULT_OUT = os.path.join("docs", "MUTATIONS.md")
HEADER = """# Mutation check

Realistic one-line bugs in the techniques' maths, in an option's way to its module and in the
export, each applied alone to a scratch copy of the repository, and the tests that must fail on
it ([DESIGN.md](DESIGN.md#tests-of-the-maths); `slim_fairseq_lab/mutation.py` lists them).
"caught: T": T, a test named for the mutation, failed on it.

"""


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="run this mutation only (repeatable; --list shows the names)")
    p.add_argument("--list", action="store_true", help="list the mutations and exit")
    p.add_argument("--out", default=None,
                   help=f"write the table here (default: {DEFAULT_OUT} when every mutation runs)")
    p.add_argument("--keep", action="store_true", help="keep the scratch copy (its path is printed)")
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    names = {m.name: m for m in mutation.MUTATIONS}
    if args.list:
        for m in mutation.MUTATIONS:
            print(f"{m.name:30} {m.technique:18} {m.kind:30} {m.path}")
        return 0
    unknown = [name for name in args.only if name not in names]
    if unknown:
        raise SystemExit(f"mutation_check.py: error: --only={unknown[0]}: not a mutation; "
                         "allowed: a name --list shows")
    chosen = [names[name] for name in args.only] or list(mutation.MUTATIONS)
    results = mutation.check(REPO_ROOT, chosen, log=lambda line: print(line, flush=True),
                             keep=args.keep)
    command = " ".join(["python scripts/mutation_check.py", *(argv if argv is not None else sys.argv[1:])])
    table = mutation.markdown(results, command)
    print(table)
    out = args.out or (DEFAULT_OUT if not args.only else None)
    if out:
        path = out if os.path.isabs(out) else os.path.join(REPO_ROOT, out)
        with open(path, "w", encoding="utf-8") as f:
            f.write(HEADER + table + "\n")
    return 0 if all(r.status == "caught" for r in results) else 1


if __name__ == "__main__":
    sys.exit(command.run(main))
