import pytest

from rayrollout.data.schema import Message, Task
from rayrollout.envkit import Environment, Episode, ToolError, Verification, tool


class Shop(Environment):
    name = "shop"

    @tool
    async def price(self, item: str, quantity: int = 1) -> dict:
        """Look up the price of an item.

        Args:
            item: Name of the item.
            quantity: How many to price,
                at least one.
        """
        if item == "unicorn":
            raise ToolError("no such item: unicorn")
        return {"item": item, "total": 2 * quantity}

    async def verify(self, episode: Episode) -> Verification:
        return Verification(reward=1.0)


def task() -> Task:
    return Task(task_id="t", environment="shop", prompt=[Message(role="user", content="hi")])


def test_tool_schema_comes_from_signature_and_docstring():
    [schema] = Shop.tool_schemas()
    function = schema["function"]
    assert function["name"] == "price"
    assert function["description"] == "Look up the price of an item."
    params = function["parameters"]
    assert params["required"] == ["item"]
    assert params["properties"]["item"] == {"type": "string", "description": "Name of the item."}
    assert params["properties"]["quantity"]["description"] == "How many to price, at least one."
    assert params["properties"]["quantity"]["default"] == 1
    assert params["additionalProperties"] is False


@pytest.mark.parametrize(
    ("name", "arguments", "expected", "is_error"),
    [
        ("price", '{"item": "pen", "quantity": 3}', '{"item": "pen", "total": 6}', False),
        ("price", '{"item": "unicorn"}', "Error: no such item: unicorn", True),
        ("price", '{"item": ', "not valid JSON", True),
        ("price", '["pen"]', "must be a JSON object", True),
        (
            "price",
            '{"item": "pen", "quantity": "many"}',
            "invalid arguments for 'price': quantity",
            True,
        ),
        (
            "price",
            '{"item": "pen", "colour": "red"}',
            "colour: Extra inputs are not permitted",
            True,
        ),
        ("refund", "{}", "unknown tool 'refund'. Available tools: price", True),
    ],
)
async def test_model_mistakes_come_back_as_tool_errors(name, arguments, expected, is_error):
    result = await Shop(task()).call_tool(name, arguments)
    assert expected in result.content
    assert result.is_error is is_error


def test_tools_must_be_async():
    with pytest.raises(TypeError, match="must be 'async def'"):

        class Bad(Environment):
            @tool
            def sync_tool(self, x: str) -> str:
                return x


def test_stateful_environments_are_those_with_setup_or_close():
    class Stateful(Shop):
        async def setup(self) -> None:
            self.cart = []

    assert Stateful.is_stateful() and not Shop.is_stateful()


def test_episode_helpers_find_tool_calls_and_final_answer():
    from rayrollout.data.schema import FunctionCall, ToolCall

    call = ToolCall(id="c", function=FunctionCall(name="price", arguments="{}"))
    episode = Episode(
        task=task(),
        messages=[
            Message(role="user", content="hi"),
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", tool_call_id="c", content="2"),
            Message(role="assistant", content="It costs 2."),
        ],
    )
    assert episode.tool_calls() == [call]
    assert episode.final_answer() == "It costs 2."
