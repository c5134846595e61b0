"""Run in verl's own venv (``.venv-trainers-verl``): verl 0.9.1's trainer path for one
rollout step, with ``RayrolloutAgentLoopManager`` as its ``agent_loop_manager_class``,
against a running rollout service.

What runs is verl's own code, as ``RayPPOTrainer.fit`` runs it: its hydra ``ppo_trainer``
config, its ``collate_fn`` over dataset rows, ``DataProto.from_single_dict``, a ``uid`` per
prompt, ``_get_gen_batch``, ``repeat(n, interleave=True)``, the manager class loaded by
``load_class_from_fqn`` and built by ``create``, ``generate_sequences``, then ``repeat`` and
``union`` with the batch, ``extract_reward`` and GRPO's ``compute_advantage`` and
``compute_data_metrics``. Usage: ``python verl_driver.py URL TOKEN OUT.json``. Writes each
sample's unpadded ids, mask and logprobs (cut out of verl's padded tensors by its attention
mask) for the test to compare with the engine's rows.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import numpy as np
import torch
import verl
from hydra import compose, initialize_config_dir
from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import AdvantageEstimator
from verl.trainer.ppo.metric_utils import compute_data_metrics
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage
from verl.trainer.ppo.reward import extract_reward
from verl.utils.dataset.rl_dataset import collate_fn
from verl.utils.import_utils import load_class_from_fqn

from rayrollout.integrations.sequences import flatten
from rayrollout.integrations.verl import TooManyFailuresError

CITIES = ["Paris", "Tokyo", "Oslo", "Lima", "Cairo", "Quito", "Rome", "Seoul"]
PROMPTS = 16  # x N samples: 64 episodes
N = 4
MANAGER = "rayrollout.integrations.verl.RayrolloutAgentLoopManager"


def config(url: str, token: str):  # noqa: ANN201 - an OmegaConf DictConfig
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            "ppo_trainer",
            overrides=[
                "trainer.use_v1=false",  # RayPPOTrainer: the DataProto seam
                "algorithm.adv_estimator=grpo",
                f"actor_rollout_ref.rollout.n={N}",
                "actor_rollout_ref.rollout.prompt_length=256",
                "actor_rollout_ref.rollout.response_length=512",
                f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER}",
                f"+rayrollout.url={url}",
                f"+rayrollout.token={token}",
                "+rayrollout.environments={weather: weather}",
                "+rayrollout.write=true",
            ],
        )


def dataset_rows() -> list[dict]:
    """Rows as verl's RLHFDataset returns them (raw_prompt, data_source, extra_info, ...)."""
    rows = []
    for i in range(PROMPTS):
        city = CITIES[i % len(CITIES)]
        rows.append(
            {
                "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
                "raw_prompt": [
                    {"role": "user", "content": f"What's the weather like in {city}? ({i})"}
                ],
                "data_source": "weather",
                "reward_model": {"style": "rule", "ground_truth": city},
                "extra_info": {"index": i, "rayrollout": {"city": city}},
                "index": i,
                "tools_kwargs": {},
                "interaction_kwargs": {},
            }
        )
    return rows


def main(url: str, token: str, out: str) -> None:
    cfg = config(url, token)
    # RayPPOTrainer.fit, up to the advantage.
    batch = DataProto.from_single_dict(collate_fn(dataset_rows()))
    batch.non_tensor_batch["uid"] = np.array(
        [str(uuid.uuid4()) for _ in range(len(batch))], dtype=object
    )
    gen_batch = RayPPOTrainer._get_gen_batch(None, batch)  # type: ignore[arg-type]
    gen_batch.meta_info["global_steps"] = 1
    gen_batch = gen_batch.repeat(repeat_times=N, interleave=True)
    fqn = cfg.actor_rollout_ref.rollout.get("agent", {}).get("agent_loop_manager_class")
    manager_class = load_class_from_fqn(fqn, "AgentLoopManager")
    manager = manager_class.create(
        config=cfg, llm_client=None, teacher_client=None, reward_loop_worker_handles=None
    )
    output = manager.generate_sequences(gen_batch)
    timing = output.meta_info.pop("timing")
    batch = batch.repeat(repeat_times=N, interleave=True).union(output)
    reward, _ = extract_reward(batch)
    batch.batch["token_level_scores"] = reward
    batch.batch["token_level_rewards"] = reward
    batch = compute_advantage(batch, adv_estimator=AdvantageEstimator.GRPO, num_repeat=N)
    metrics = compute_data_metrics(batch, use_critic=False)

    tensors = batch.batch
    plen = tensors["prompts"].shape[1]
    samples = []
    for i in range(len(batch)):
        attention = tensors["attention_mask"][i]
        prompt_keep = attention[:plen].bool()
        response_keep = attention[plen:].bool()
        response_mask = tensors["response_mask"][i]
        samples.append(
            {
                "task_id": str(batch.non_tensor_batch["rayrollout_task_id"][i]),
                "sample_index": int(batch.non_tensor_batch["rayrollout_sample_index"][i]),
                "uid": str(batch.non_tensor_batch["uid"][i]),
                "prompt_ids": tensors["prompts"][i][prompt_keep].tolist(),
                "response_ids": tensors["responses"][i][response_keep].tolist(),
                "mask": response_mask[response_keep].tolist(),
                "logprobs": tensors["rollout_log_probs"][i][response_keep].tolist(),
                "token_versions": tensors["rayrollout_token_versions"][i][response_keep].tolist(),
                "input_ids_match": tensors["input_ids"][i].tolist()
                == tensors["prompts"][i].tolist() + tensors["responses"][i].tolist(),
                "positions": tensors["position_ids"][i][attention.bool()].tolist(),
                "mask_outside": int(response_mask[~response_keep].abs().sum()),
                "reward": float(tensors["rm_scores"][i].sum()),
                "reward_at_last": float(tensors["rm_scores"][i][int(response_keep.sum()) - 1]),
                "advantage": float(tensors["advantages"][i][response_mask.bool()].mean())
                if response_mask.any()
                else 0.0,
                "status": str(batch.non_tensor_batch["rayrollout_status"][i]),
                "num_turns": int(batch.non_tensor_batch["__num_turns__"][i]),
            }
        )
    # A failed episode keeps its place: mask all 0, its status in rayrollout_status; more
    # failures than max_failed_fraction raise.
    rows = [s.row for s in manager.last_sequences[:N] if s.row is not None]
    broken = rows[0].model_copy(update={"status": "error", "error": "the tool crashed"})
    group = [flatten(broken)] + [flatten(row) for row in rows[1:]]
    failed = manager.to_data_proto(group, gen_batch.slice(0, N))
    manager.max_failed_fraction = 0.0
    too_many = None
    try:
        manager.check_failures(group)
    except TooManyFailuresError as exc:
        too_many = str(exc)
    record = {
        "failed": {
            "status": failed.non_tensor_batch["rayrollout_status"].tolist(),
            "error": failed.non_tensor_batch["rayrollout_error"].tolist(),
            "mask_sums": failed.batch["response_mask"].sum(dim=1).tolist(),
            "responses_kept": failed.batch["responses"][0].tolist()
            == output.batch["responses"][0].tolist(),
            "count": failed.meta_info["timing"]["rayrollout/failed_episodes"],
            "too_many": too_many,
        },
        "samples": samples,
        "shapes": {k: list(v.shape) for k, v in tensors.items()},
        "timing": timing,
        "score_mean": float(metrics["critic/score/mean"]),
    }
    with open(out, "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
