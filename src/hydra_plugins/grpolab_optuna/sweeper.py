"""``hydra/sweeper=optuna``: hydra-optuna-sweeper's sweeper with grpolab's defaults, resumable.

The same keys as the plugin's (https://hydra.cc/docs/plugins/optuna_sweeper/), other defaults::

    direction: maximize                                # src/train.py returns val_accuracy_end
    storage: sqlite:///${hydra.sweep.dir}/optuna.db    # the study beside its job folders
    study_name: ${task_name}
    n_trials: 20                                       # the study's size, not the trials of one command
    n_jobs: 1                                          # trials asked at once (jobs at once under hydra/launcher=joblib)

What differs from the plugin's sweeper (:mod:`._impl`): rerunning the same command into the same sweep folder
continues the study in the storage: it runs only the trials the study still misses (``n_trials`` in all, failed
ones counted), and a trial a Ctrl-C or a kill left running is run again first, with its overrides and in its job
folder, where ``grpolab/app/sweep_resume.py`` resumes it from ``last.ckpt`` (or takes the finished summary). Every trial
is a normal job folder, ``<trial number>_<overrides>`` (``hydra.job.num`` is the trial's number, so a rerun never
lands in an earlier trial's folder). A seeded sampler continuing a study draws with ``seed + the trials it holds``.
A job that returns no objective (None, NaN, an error) is told to the study as a failed trial, never as a score.

This config is registered as ``hydra/sweeper/optuna`` in place of the plugin's by :class:`RegisterOptunaConfig`,
once Hydra has imported every plugin (its scan runs each plugin module again, the plugin's ``config.py`` too, so a
registration at import could be overwritten). A YAML file of that name in ``conf/`` would be matched against the
plugin's schema, which Hydra refuses when the schema has a defaults list (``sampler: tpe``).
"""

from dataclasses import dataclass
from typing import Any

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.config_store import ConfigStore
from hydra.plugins.search_path_plugin import SearchPathPlugin
from hydra_plugins.hydra_optuna_sweeper.config import OptunaSweeperConf
from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper as _PluginOptunaSweeper
from omegaconf import DictConfig


@dataclass
class GrpolabOptunaSweeperConf(OptunaSweeperConf):
    _target_: str = "hydra_plugins.grpolab_optuna.sweeper.OptunaSweeper"
    direction: Any = "maximize"
    storage: Any = "sqlite:///${hydra.sweep.dir}/optuna.db"
    study_name: Any = "${task_name}"
    n_trials: int = 20
    n_jobs: int = 1


class RegisterOptunaConfig(SearchPathPlugin):
    """Registers :class:`GrpolabOptunaSweeperConf` as ``hydra/sweeper/optuna``. Hydra calls every search-path plugin
    after its plugin scan and before it composes a config (``hydra.main`` and ``compose`` alike); the search path is
    left as it is."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        ConfigStore.instance().store(group="hydra/sweeper", name="optuna", node=GrpolabOptunaSweeperConf,
                                     provider="grpolab")


class OptunaSweeper(_PluginOptunaSweeper):
    """The plugin's sweeper whose search is :class:`._impl.ResumableOptunaSweeperImpl` (same arguments)."""

    def __init__(self, sampler: Any, direction: Any, storage: Any, study_name: str | None, n_trials: int,
                 n_jobs: int, max_failure_rate: float, search_space: DictConfig | None,
                 custom_search_space: str | None, params: DictConfig | None) -> None:
        from ._impl import ResumableOptunaSweeperImpl  # Optuna (and SQLAlchemy) only when a sweep starts

        self.sweeper = ResumableOptunaSweeperImpl(sampler, direction, storage, study_name, n_trials, n_jobs,
                                                  max_failure_rate, search_space, custom_search_space, params)
