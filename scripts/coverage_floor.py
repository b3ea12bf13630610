"""Hold every module of the package to the line coverage measured for it: exit 1, naming each module
below its floor, when one falls (`make test` runs this after the pytest tiers).

    python scripts/coverage_floor.py            # check .coverage (written by pytest --cov)
    python scripts/coverage_floor.py --update   # write the floors from the last run, after a change
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import coverage

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ROOT / "tests" / "coverage_floors.json"
# Points below the measurement a floor sits: a few lines are reached only when timing allows (a client
# hanging up in the middle of a write), and must not fail a run that covers them a little less.
SLACK_POINTS = 2
# The floor of a module that has none yet (a new one): add it with --update once it has its tests.
NEW_MODULE_FLOOR = 85


def measured() -> dict[str, float]:
    """{module path: percent of its lines run} from the last `pytest --cov` run."""
    cov = coverage.Coverage(data_file=str(ROOT / ".coverage"))
    cov.load()
    found = {}
    for path in cov.get_data().measured_files():
        relative = Path(path).resolve().relative_to(ROOT).as_posix()
        _, statements, _, missing, _ = cov.analysis2(path)
        found[relative] = 100.0 * (len(statements) - len(missing)) / len(statements) if statements else 100.0
    return found


def main(argv: list[str]) -> int:
    now = measured()
    if "--update" in argv:
        floors = {module: max(0, math.floor(pct) - SLACK_POINTS) for module, pct in sorted(now.items())}
        FLOORS.write_text(json.dumps(floors, indent=2) + "\n")
        print(f"coverage floors written for {len(floors)} modules to {FLOORS.relative_to(ROOT)}")
        return 0
    floors = json.loads(FLOORS.read_text())
    fallen = [
        f"{module}: {percent:.1f}% < {floors.get(module, NEW_MODULE_FLOOR)}%"
        for module, percent in sorted(now.items())
        if percent < floors.get(module, NEW_MODULE_FLOOR)
    ]
    total = sum(now.values()) / max(len(now), 1)
    if fallen:
        print("coverage: modules below their floor (tests/coverage_floors.json):\n  " + "\n  ".join(fallen))
        return 1
    print(f"coverage: {len(now)} modules at or above their floors (mean {total:.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
