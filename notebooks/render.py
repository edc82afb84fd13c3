"""Execute notebooks/onpolicy_vs_offpolicy.ipynb on a sweep folder and keep the executed copy with its figures.

    python notebooks/render.py multirun/onoff_small/<time>          # figures in <sweep>/figures/
    python notebooks/render.py multirun/onoff_small/<time> --figures /tmp/figs
    python notebooks/render.py                                      # the newest sweep folder under multirun/

Uses nbclient (installed by requirements.txt; no Jupyter server, no nbconvert). A relative path is read from the
current folder, else from the repository root; with none, the newest sweep folder (a folder of job folders) under
``multirun/`` is read. The executed notebook is written to ``<figures>/onpolicy_vs_offpolicy.ipynb``.
Jobs that failed, were interrupted or stopped short of ``trainer.max_steps`` are left out, each with a warning on
stderr: the job filter of ``sweeps/report.py``, which gives the statistics (paired differences, tests).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

NOTEBOOK = Path(__file__).resolve().parent / "onpolicy_vs_offpolicy.ipynb"
SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"


def render(sweep_dir: Path | None, figures: Path | None = None, timeout: int = 600) -> Path:
    """Run the notebook against ``sweep_dir`` (None: the newest sweep folder under ``multirun/``); return the
    figures folder.

    Raises:
        FileNotFoundError: if ``sweep_dir`` holds no ``summary.json``, or with none, no sweep folder was found.
        nbclient.exceptions.CellExecutionError: if a cell fails (the message shows the cell and the error).
    """
    import nbformat
    from nbclient import NotebookClient

    sys.path.insert(0, str(SWEEPS))
    import sweep_folders
    from report import read_sweep

    sweep_dir = sweep_folders.sweep_dir(sweep_dir)
    if not any(sweep_dir.rglob("summary.json")):
        raise FileNotFoundError(f"no summary.json under {sweep_dir}: is it a sweep folder (multirun/<name>/<time>)?")

    for warning in read_sweep(sweep_dir)[1]:  # the notebook leaves the same jobs out
        print(f"render.py: warning: {warning}", file=sys.stderr)
    figures = (figures or sweep_dir / "figures").resolve()
    saved = {k: os.environ.get(k) for k in ("GRPOLAB_SWEEP_DIR", "GRPOLAB_FIG_DIR", "MPLBACKEND")}
    os.environ.update(GRPOLAB_SWEEP_DIR=str(sweep_dir), GRPOLAB_FIG_DIR=str(figures), MPLBACKEND="Agg")
    try:
        nb = nbformat.read(NOTEBOOK, as_version=4)
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    figures.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, figures / NOTEBOOK.name)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, nargs="?", default=None,
                        help="a sweep folder, e.g. multirun/onoff_small/<time> (default: the newest under multirun/)")
    parser.add_argument("--figures", type=Path, default=None, help="where to write the PNGs (default <sweep>/figures)")
    args = parser.parse_args(argv)
    try:
        figures = render(args.sweep_dir, args.figures)
    except FileNotFoundError as err:  # no sweep there: one line, not a traceback
        print(f"render.py: error: {err}", file=sys.stderr)
        return 2
    print("\n".join(str(p) for p in sorted(figures.glob("*.png"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
