"""Two strategies' searches compared race by race: the same (member, seed), both reaching the target.

Reads two `bench/search_family.py --json` files (the first strategy's records of each) and prints
the geometric mean of B's speed-up over A's on the races both won, with how many B did better and
worse, and the searches each reached. A median of members moves when another member becomes the
median; this figure does not. Usage: .venv/bin/python bench/race_by_race.py A.json B.json
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path


def records(path: str) -> dict[tuple[str, int], float | None]:
    """(member, seed) -> speed-up of the file's first strategy (None: no race, greedy never moved)."""
    data = json.loads(Path(path).read_text())
    first = data["args"]["strategies"].split(",")[0]
    return {(r["member"], r["seed"]): r["speedup"] for r in data["records"] if r["strategy"] == first}


def compare(
    a: dict[tuple[str, int], float | None], b: dict[tuple[str, int], float | None]
) -> dict[str, float]:
    """Geometric mean ratio b / a over races both reached, with counts of better and worse."""
    ratios = [b[k] / a[k] for k in a if k in b and a[k] and b[k]]
    return {
        "ratio": math.exp(statistics.fmean(math.log(r) for r in ratios)) if ratios else float("nan"),
        "races": len(ratios),
        "better": sum(r > 1 + 1e-9 for r in ratios),
        "worse": sum(r < 1 - 1e-9 for r in ratios),
        "reached_a": sum(bool(v) for v in a.values()),
        "reached_b": sum(bool(v) for k, v in b.items() if k in a),
    }


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: race_by_race.py A.json B.json (bench/search_family.py --json files)")
    c = compare(records(sys.argv[1]), records(sys.argv[2]))
    print(
        f"race by race: B / A = {c['ratio']:.3f} over {c['races']} races both reached "
        f"(B better in {c['better']}, worse in {c['worse']}); reached A {c['reached_a']}, B {c['reached_b']}"
    )


if __name__ == "__main__":
    main()
