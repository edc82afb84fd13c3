"""The application on top of the library: the entry points' wiring (:mod:`.run` builds and fits a run, :mod:`.cli`
and :mod:`.console` the command line and the terminal, :mod:`.preflight` the checks before a run,
:mod:`.plan_from_config` a config's memory plan), Hydra multiruns (:mod:`.sweep_jobs`, :mod:`.sweep_resume`,
:mod:`.sweep_signals`, :mod:`.slurm`, :mod:`.hydra_names`), a run folder's files and identity (:mod:`.run_files`,
:mod:`.run_identity`) and the process's allocator (:mod:`.malloc`). Nothing outside ``grpolab.app`` imports it
(tests/test_layers.py, with the exceptions it lists).
"""
