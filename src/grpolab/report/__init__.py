"""What the sweep reports compute from finished runs (``sweeps/report.py``, ``stale_rerun.py``, ``replication.py``,
``sweep_status.py``): the statistics (:mod:`.stats`) and the result rows, keyed and refused when duplicated
(:mod:`.result_rows`). Nothing here imports the training code.
"""
