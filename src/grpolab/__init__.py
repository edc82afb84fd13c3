"""grpolab: on-policy and off-policy GRPO as a Hydra + PyTorch Lightning framework."""

from grpolab.app import hydra_names  # noqa: F401  (registers the run-folder name resolver conf/hydra uses)
