"""Fixtures shared by test files of the default tier (Ray and Serve: the root conftest.py)."""

import pytest

from rayrollout.data.run_folder import RunFolder


@pytest.fixture(scope="session")
def real_run(tmp_path_factory, serve_session):
    """A real collect that every export kind's tests read (``test_export_*``): NeMo Gym weather
    rows and math rows, 2 samples each, scripted policy. Returns the output folder."""
    from exports import collect_run, real_task_lines  # here, not at the top: few files need it

    return collect_run(tmp_path_factory.mktemp("export-run"), real_task_lines(), serve_session)


@pytest.fixture
def engine_lock(tmp_path):
    """The folder's lock, held by this process as the engine holds it."""
    folder = RunFolder(tmp_path)
    folder.take_lock()
    yield folder
    folder.release_lock()
