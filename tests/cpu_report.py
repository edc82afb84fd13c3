"""CPU and wall seconds per test file from a ``GRPOLAB_TEST_CPU`` log (tests/conftest.py), largest first.

    GRPOLAB_TEST_CPU=/tmp/cpu.jsonl python -m pytest -q -n auto && python tests/cpu_report.py /tmp/cpu.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str, top: int = 25) -> None:
    cpu: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    for line in open(path):
        row = json.loads(line)
        name = row["test"].split("::")[0]
        cpu[name] += row["cpu_s"]
        wall[name] += row["wall_s"]
    print(f"total: {sum(cpu.values()):.0f} CPU s, {sum(wall.values()):.0f} test wall s, {len(cpu)} files")
    for name in sorted(cpu, key=cpu.get, reverse=True)[:top]:
        print(f"{cpu[name]:8.1f} CPU s {wall[name]:8.1f} wall s  {name}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
