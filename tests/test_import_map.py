"""The package's layers hold: no module imports a layer above its own, and no two modules import each other."""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("import_map", ROOT / "scripts" / "import_map.py")
import_map = importlib.util.module_from_spec(_spec)
sys.modules["import_map"] = import_map
_spec.loader.exec_module(import_map)


def test_src_has_no_upward_import_and_no_cycle():
    g = import_map.graph()
    assert len(g) > 50  # the map found the package
    assert import_map.upward(g) == []
    assert import_map.cycles(g) == []


@pytest.mark.parametrize("module, layer", [("grpolab.algo.losses", 1), ("grpolab.forward.theorem1", 3),
                                           ("grpolab.rollout.engines.vllm_server.engine", 4),
                                           ("grpolab.rollout.buffer", 5), ("grpolab.config_checks", 0),
                                           ("grpolab.app.run", 7)])
def test_layers_are_read_by_longest_prefix(module, layer):
    assert import_map.layer(module) == layer


def test_the_map_finds_an_upward_import_and_a_cycle():
    g = {"grpolab.algo.x": {"grpolab.rollout.buffer"}, "grpolab.rollout.buffer": {"grpolab.algo.x"}}
    assert import_map.upward(g) == [("grpolab.algo.x", "grpolab.rollout.buffer")]
    assert import_map.cycles(g) == [["grpolab.algo.x", "grpolab.rollout.buffer"]]


def test_type_checking_imports_are_not_edges(tmp_path, monkeypatch):
    pkg = tmp_path / "grpolab"
    (pkg / "algo").mkdir(parents=True)
    (pkg / "rollout").mkdir()
    for f in ("__init__.py", "algo/__init__.py", "rollout/__init__.py", "rollout/buffer.py"):
        (pkg / f).write_text("")
    (pkg / "algo" / "x.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                       "    from grpolab.rollout.buffer import B\nfrom grpolab.rollout import buffer\n")
    monkeypatch.setattr(import_map, "SRC", tmp_path)
    assert import_map.graph()["grpolab.algo.x"] == {"grpolab.rollout.buffer"}
