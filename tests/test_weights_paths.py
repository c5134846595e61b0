"""A checkpoint path given to ``update_weights`` is checked before anything pauses: absolute,
under the run's ``training.weights_roots`` once resolved, existing and readable.

The engine's ``WeightSync`` with a recording backend in place of the policy's (what the
backend is asked, in order, is what these tests read); the service's answers for the same
paths are in ``test_service_fuzz.py``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from rayrollout import RunConfig
from rayrollout.engine.weights import WeightsPathError, WeightSync, weights_roots


class RecordingBackend:
    """The policy's side of a weight update, recorded."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def pause(self, mode: str) -> None:
        self.calls.append("pause")

    async def resume(self) -> None:
        self.calls.append("resume")

    async def load(self, path: str) -> dict[str, Any]:
        self.calls.append(f"load {path}")
        return {}


def sync_of(tmp_path: Path, **training: Any) -> tuple[WeightSync, RecordingBackend]:
    config = RunConfig.model_validate(
        {"output": {"dir": str(tmp_path / "out")}, "training": training}
    )
    sync = WeightSync(config, "http://127.0.0.1:1/v1", [], None)
    backend = RecordingBackend()
    sync.backend = backend
    return sync, backend


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/etc/passwd", "'/etc/passwd' is outside the folders this run loads checkpoints from"),
        ("/nonexistent/../../etc/shadow", "(resolved: '/etc/shadow') is outside the folders"),
        ("ckpt/step-1", "must be absolute"),
    ],
)
async def test_a_path_outside_the_roots_is_refused_by_name_before_the_policy_pauses(
    tmp_path, path, named
):
    sync, backend = sync_of(tmp_path)
    with pytest.raises(WeightsPathError) as refused:
        await sync.update_weights(path)
    assert named in str(refused.value)
    assert backend.calls == [] and (sync.version, sync.paused) == (0, False)


async def test_a_symlink_out_of_the_roots_is_refused_by_where_it_leads(tmp_path):
    sync, backend = sync_of(tmp_path)
    link = tmp_path / "ckpt"
    link.symlink_to("/etc")
    with pytest.raises(WeightsPathError, match="resolved: '/etc'"):
        await sync.update_weights(str(link))
    assert backend.calls == []


async def test_a_missing_or_unreadable_checkpoint_under_the_roots_is_refused(tmp_path):
    sync, backend = sync_of(tmp_path)
    with pytest.raises(WeightsPathError, match="does not exist on the engine's node"):
        await sync.update_weights(str(tmp_path / "step-9"))
    if os.getuid() != 0:  # root reads everything: the permission check is moot there
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o000)
        try:
            with pytest.raises(WeightsPathError, match="not readable"):
                await sync.update_weights(str(locked))
        finally:
            locked.chmod(0o700)
    assert backend.calls == []


async def test_a_checkpoint_under_the_roots_is_loaded_between_pause_and_resume(tmp_path):
    sync, backend = sync_of(tmp_path)
    checkpoint = tmp_path / "step-1"
    checkpoint.mkdir()
    answer = await sync.update_weights(str(checkpoint))
    assert answer["version"] == 1
    assert backend.calls == ["pause", f"load {os.path.realpath(checkpoint)}", "resume"]


async def test_the_configured_roots_replace_the_defaults(tmp_path):
    shared = tmp_path / "shared"
    (shared / "step-1").mkdir(parents=True)
    sync, backend = sync_of(tmp_path, weights_roots=[str(shared)])
    assert weights_roots(sync.config) == [Path(os.path.realpath(shared))]
    await sync.update_weights(str(shared / "step-1"))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with pytest.raises(WeightsPathError, match="add its folder to the config's training"):
        await sync.update_weights(str(outside))
    assert backend.calls[-1] == "resume"


def test_by_default_the_output_folder_and_the_temp_folder_are_the_roots(tmp_path):
    config = RunConfig.model_validate({"output": {"dir": str(tmp_path / "out")}})
    assert weights_roots(config) == [
        Path(os.path.realpath(tmp_path / "out")),
        Path(os.path.realpath(tempfile.gettempdir())),
    ]


def test_a_relative_root_is_a_config_error():
    with pytest.raises(ValueError, match="weights_roots must be absolute folders.*'ckpt'"):
        RunConfig.model_validate({"training": {"weights_roots": ["ckpt"]}})
