"""grpolab's Hydra sweeper plugin: hydra-optuna-sweeper's Optuna search, resumable (``hydra/sweeper=optuna``).

Hydra loads sweepers from the ``hydra_plugins`` namespace only. :mod:`.sweeper` is what Hydra imports while it scans
the plugins (cheap: Optuna is imported when a sweep starts); :mod:`._impl` is the search itself.
"""
