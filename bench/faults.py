"""The fault harness (issue 22): inject one kind of fault into a stack of its own, run load
through it, and count from the providers' side what must be zero.

    .venv/bin/python bench/faults.py --fault NAME [the fault's options]
    .venv/bin/python bench/faults.py --list

Each fault is a module ``bench/faults_<name>.py`` with a docstring (its options and what it
counts) and ``main(argv) -> int`` (exit status 1 when a count that must be 0 is not). Figures
and their commands go to docs/reliability.md.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def faults() -> list[str]:
    return sorted(p.stem.removeprefix("faults_") for p in HERE.glob("faults_*.py"))


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print(__doc__)
        print("faults:", ", ".join(faults()) or "(none)")
        return 0 if argv else 2
    if argv[0] != "--fault" or len(argv) < 2 or argv[1] not in faults():
        print(f"usage: faults.py --fault {{{'|'.join(faults())}}} [options]", file=sys.stderr)
        return 2
    sys.path.insert(0, str(HERE.parent))
    module = importlib.import_module(f"bench.faults_{argv[1]}")
    return int(module.main(argv[2:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
