"""The ``nemo_gym`` tier: rayrollout against NeMo Gym 0.7.0's own code, not a look-alike.

Tests run in rayrollout's venv and reach NeMo Gym two ways: its servers started by its own
``ng_run`` (``ngrun.NemoGymRun``), and its Python code run by its venv's interpreter
(``ng_python``). Every test here is marked ``nemo_gym``; the default tier leaves them out.
A missing NeMo Gym venv is an error, not a skip: a tier that ran nothing must not pass.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from ngrun import NG_SRC, NG_VENV

# tests/ itself: this tier's files use the default tier's helper modules (``trajectories``),
# and pytest puts only this folder on the path when the tier runs alone.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.nemo_gym)
            # ng_run plus a Ray per `rayrollout env serve`: minutes on 2 loaded cores.
            item.add_marker(pytest.mark.timeout(900))


def _require_venv() -> None:
    if not (NG_VENV / "bin" / "python").exists() or not NG_SRC.is_dir():
        pytest.fail(
            f"NeMo Gym 0.7.0 is not installed at {NG_VENV} (with the unpacked wheel in "
            f"{NG_SRC}): run `bash .ci/nemo_gym` once, or set NEMO_GYM_VENV"
        )


@pytest.fixture(scope="session")
def ng_src() -> Path:
    """The unpacked nemo-gym 0.7.0 wheel: resources_servers/, responses_api_agents/, ..."""
    _require_venv()
    return NG_SRC


@pytest.fixture(scope="session")
def ng_python() -> Path:
    """The interpreter of NeMo Gym's venv, for running its own Python code."""
    _require_venv()
    return NG_VENV / "bin" / "python"
