"""grpolab/app/cli.py's skip_the_exit_collection: at exit the collector's walk over every imported object is skipped
(gc.freeze after every other atexit handler), and nothing else is: handlers registered after it still run first."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO_ROOT

CHILD = """
import atexit, gc, sys
sys.path.insert(0, {src!r})
atexit.register(lambda: print("frozen at the end:", gc.get_freeze_count() > 0, flush=True))  # runs last
from grpolab.app.cli import skip_the_exit_collection
skip_the_exit_collection()
atexit.register(lambda: print("frozen while a later handler runs:", gc.get_freeze_count() > 0, flush=True))
"""


def test_the_freeze_comes_after_every_handler_registered_later():
    out = subprocess.run([sys.executable, "-c", CHILD.format(src=str(REPO_ROOT / "src"))], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["frozen while a later handler runs: False", "frozen at the end: True"]


def test_both_entry_points_register_it_first():
    for script in ("src/train.py", "src/eval.py"):
        main = (REPO_ROOT / script).read_text().split('if __name__ == "__main__":', 1)[1]
        assert main.lstrip().startswith("skip_the_exit_collection()"), script
