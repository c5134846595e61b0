"""rayrollout environments over NeMo Gym's HTTP protocol, driven by a plain HTTP client.

Requests go through Serve's HTTP proxy on the session's port, as a NeMo Gym agent's would:
a cookie from /seed_session, one POST per tool call, /verify with a Responses object. They
bear the app's token (``rayrollout.auth``); the last tests show what comes of those that
do not.
"""

import json
import time
from pathlib import Path

import pytest
import requests
from openai.types.responses import Response
from ray import serve

from rayrollout.auth import RouteAuth, bearer_header, new_token, write_token_file
from rayrollout.data.config import EnvironmentConfig
from rayrollout.data.schema import Message
from rayrollout.data.tasks import parse_task_row
from rayrollout.environments.booking.env import BookingEnv
from rayrollout.envkit import Episode
from rayrollout.envkit.nemo_gym.client import NemoGymConnections, episode_response
from rayrollout.envkit.server import environment_app

WEATHER_ROWS = (
    Path(__file__).resolve().parents[1] / "rayrollout/environments/weather/tasks_nemo_gym.jsonl"
)
TOKEN = new_token()
AUTH = RouteAuth.bearer(TOKEN)


def bearer_client(token: str = TOKEN) -> requests.Session:
    """An HTTP client bearing ``token``, as every caller of a rayrollout route must."""
    session = requests.Session()
    session.headers.update(bearer_header(token))
    return session


ROW = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "Book a suite for 2 nights."}],
    },
    "goal": [{"room": "suite", "nights": 2}],
}


@pytest.fixture(scope="module")
def booking_url(serve_session):
    serve.run(
        environment_app(
            "rayrollout.environments.booking.env:BookingEnv", num_replicas=2, auth=AUTH
        ),
        name="http-booking",
        route_prefix="/http-booking",
    )
    yield f"http://127.0.0.1:{serve_session}/http-booking"
    serve.delete("http-booking")


def verify_body(row, output):
    return {"responses_create_params": row["responses_create_params"], "response": output}


def response_object(messages):
    task = parse_task_row(ROW, default_environment="booking")
    return episode_response(task, [*task.prompt, *messages])


def test_a_booking_episode_runs_over_http_with_state_kept_per_session(booking_url):
    guest, other = bearer_client(), bearer_client()
    seeded = guest.post(f"{booking_url}/seed_session", json=ROW)
    assert seeded.status_code == 200, seeded.text
    assert other.post(f"{booking_url}/seed_session", json=ROW).status_code == 200
    assert guest.cookies.get("rayrollout_session") != other.cookies.get("rayrollout_session")

    booked = guest.post(f"{booking_url}/book", json={"request": "a suite for 2 nights"})
    assert booked.status_code == 200
    assert booked.text == "Booked a suite for 2 night(s): booking B1, total 600 EUR."
    # The other session has its own database: its suite is still free, then sold out.
    assert other.post(f"{booking_url}/book", json={"request": "suite, 3 nights"}).ok
    sold_out = other.post(f"{booking_url}/book", json={"request": "suite, 2 nights"})
    assert sold_out.status_code == 400
    assert sold_out.text.startswith("Error: no suite is free")
    listed = guest.post(f"{booking_url}/list_bookings", json={})
    assert listed.headers["content-type"].startswith("application/json")
    assert listed.json() == [{"id": "B1", "type": "suite", "nights": 2, "status": "active"}]

    call = {"id": "c1", "type": "function"}
    messages = [
        Message(
            role="assistant", tool_calls=[{**call, "function": {"name": "book", "arguments": "{}"}}]
        ),
        Message(role="tool", tool_call_id="c1", content=booked.text),
        Message(role="assistant", content="Your suite is booked: B1."),
    ]
    body = verify_body(ROW, response_object(messages))
    Response.model_validate(body["response"])
    verified = guest.post(f"{booking_url}/verify", json=body)
    assert verified.status_code == 200
    answer = verified.json()
    assert answer["reward"] == 1.0
    assert answer["matched"] == 1 and answer["confirmed"] is True
    assert answer["responses_create_params"] == ROW["responses_create_params"]
    other_answer = other.post(f"{booking_url}/verify", json=body).json()
    assert other_answer["reward"] == 0.0  # it booked 3 nights, not 2

    # /verify ended both sessions; /close_session after it is a harmless no-op.
    assert guest.post(f"{booking_url}/close_session", json={}).status_code == 200
    gone = guest.post(f"{booking_url}/list_bookings", json={})
    assert gone.status_code == 404 and "seed_session again" in gone.json()["detail"]


def test_protocol_errors_say_what_to_do(booking_url):
    client = bearer_client()
    no_session = client.post(f"{booking_url}/book", json={"request": "suite, 1 night"})
    assert no_session.status_code == 400
    assert "POST /seed_session" in no_session.json()["detail"]
    unknown = client.post(f"{booking_url}/teleport", json={})
    assert unknown.status_code == 404
    assert "Available tools: book, cancel, list_bookings, list_rooms" in unknown.text
    bad_seed = client.post(f"{booking_url}/seed_session", json={"hello": 1})
    assert bad_seed.status_code == 422 and "responses_create_params" in bad_seed.text
    client.post(f"{booking_url}/seed_session", json=ROW)
    bad_args = client.post(f"{booking_url}/book", json={"room": "suite"})
    assert bad_args.status_code == 400 and "invalid arguments for 'book'" in bad_args.text
    described = client.get(f"{booking_url}/").json()
    assert described["environment"] == "booking"
    assert [t["name"] for t in described["tools"]] == [
        "book",
        "cancel",
        "list_bookings",
        "list_rooms",
    ]


def test_verify_without_a_session_scores_in_a_fresh_one(booking_url):
    # Like NeMo Gym's, the verify body carries the row's verifier fields (here: the goal).
    body = verify_body(ROW, response_object([Message(role="assistant", content="No.")]))
    answer = (
        bearer_client().post(f"{booking_url}/verify", json={**body, "goal": ROW["goal"]}).json()
    )
    assert answer["reward"] == 0.0 and answer["bookings"] == []


async def test_rayrollouts_own_remote_client_plays_a_rayrollout_environment_over_http(
    booking_url, tmp_path
):
    task = parse_task_row(
        {
            "prompt": "Book a suite for 2 nights.",
            "goal": [{"room": "suite", "nights": 2}],
            "tools": BookingEnv.tool_schemas(),
        },
        default_environment="booking",
    )
    pool = NemoGymConnections()
    token_file = tmp_path / "booking.token"
    write_token_file(token_file, TOKEN)  # as `env serve` writes one; the config names the file
    settings = EnvironmentConfig(url=booking_url, token_file=str(token_file))
    session = pool.session("booking_http", settings, task)
    await session.setup()
    result = await session.call_tool("book", json.dumps({"request": "suite for 2 nights"}))
    messages = [
        *task.prompt,
        Message(role="assistant", content=f"Done: {result.content}"),
    ]
    verification = await session.verify(Episode(task=task, messages=messages))
    await session.close()
    await pool.close()
    assert not result.is_error
    assert verification.reward == 1.0
    assert verification.details["bookings"][0]["id"] == "B1"


def test_env_serve_puts_an_inline_environment_behind_the_protocol(serve_session, tmp_path):
    from typer.testing import CliRunner

    from rayrollout.cli.commands import app

    result = CliRunner().invoke(
        app,
        [
            "env",
            "serve",
            "weather",
            "--detach",
            "--port",
            str(serve_session),
            "--namespace",
            "http-test",
            "--route-prefix",
            "/http-test/env/weather",
            "--token-file",
            str(tmp_path / "weather.token"),
        ],
    )
    assert result.exit_code == 0, result.output
    url = result.stdout.strip().splitlines()[-1]
    assert url == f"http://127.0.0.1:{serve_session}/http-test/env/weather"
    token_file = tmp_path / "weather.token"
    assert str(token_file) in result.output  # where clients find the token, said at start
    assert token_file.stat().st_mode & 0o777 == 0o600
    try:
        unauthenticated = requests.post(f"{url}/seed_session", json={})
        assert unauthenticated.status_code == 401
        assert "Authorization: Bearer" in unauthenticated.json()["detail"]
        client = bearer_client(token_file.read_text().strip())
        row = json.loads(WEATHER_ROWS.read_text().splitlines()[0])
        assert client.post(f"{url}/seed_session", json=row).ok
        report = client.post(f"{url}/get_weather", json={"city": "Tokyo"})
        assert report.text.startswith("The weather in Tokyo is ")
        task = parse_task_row(row, default_environment="weather")
        output = episode_response(
            task,
            [
                *task.prompt,
                Message(
                    role="assistant",
                    tool_calls=[
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'},
                        }
                    ],
                ),
                Message(role="tool", tool_call_id="c1", content=report.text),
                Message(role="assistant", content=report.text),
            ],
        )
        verified = client.post(f"{url}/verify", json={**row, "response": output}).json()
        assert verified["reward"] == 1.0 and verified["tools_called"] == ["get_weather"]
    finally:
        serve.delete("http-test.env.weather")


def test_a_session_left_open_by_its_client_is_released_after_the_idle_timeout(serve_session):
    serve.run(
        environment_app(
            "rayrollout.environments.booking.env:BookingEnv",
            session_idle_timeout_s=0.5,
            auth=AUTH,
        ),
        name="http-booking-idle",
        route_prefix="/http-booking-idle",
    )
    url = f"http://127.0.0.1:{serve_session}/http-booking-idle"
    handle = serve.get_deployment_handle("EnvironmentServer", "http-booking-idle")

    # No step relies on a call landing within the timeout (on a loaded machine two calls
    # can be seconds apart): the session may be released at any moment after it opens, so
    # each count is taken as "held or released, once", and only the wait has a deadline.
    def held_or_released() -> int:
        while True:  # a sweep between the two counts would count a session twice or never
            before = handle.expired_sessions.remote().result()
            held = handle.open_sessions.remote().result()
            if handle.expired_sessions.remote().result() == before:
                return held + before

    try:
        client = bearer_client()  # seeds, then walks away: no verify, no close
        assert client.post(f"{url}/seed_session", json=ROW).ok
        assert held_or_released() == 1
        deadline = time.monotonic() + 60  # a bound on a sweep that never comes, not a margin
        while handle.open_sessions.remote().result():
            assert time.monotonic() < deadline, "the idle session was never released"
            time.sleep(0.1)
        assert handle.expired_sessions.remote().result() == 1
        late = client.post(f"{url}/list_bookings", json={})
        assert late.status_code == 404
        assert "idle past the environment's session timeout" in late.json()["detail"]
        assert client.post(f"{url}/seed_session", json=ROW).ok  # the fix it names works:
        assert held_or_released() == 2  # a new session, held (or released in its turn)
    finally:
        serve.delete("http-booking-idle")


def test_a_served_environment_is_built_with_its_config_args_under_its_registered_name(
    serve_session,
):
    from rayrollout.data.schema import Task
    from rayrollout.envkit.registry import environment_spec

    # GreeterEnv's class name is "greeter"; the spec's name is the one the app answers with.
    settings = EnvironmentConfig(path="fixture_envs:GreeterEnv", args={"greeting": "ahoy"})
    app = environment_app(environment_spec("ahoy-greeter", settings), auth=AUTH)
    serve.run(app, name="http-ahoy", route_prefix="/http-ahoy")
    url = f"http://127.0.0.1:{serve_session}/http-ahoy"
    try:
        handle = serve.get_app_handle("http-ahoy")
        task = Task(
            task_id="t", environment="ahoy-greeter", prompt=[Message(role="user", content="hi")]
        )
        result = handle.call_tool.remote(None, task, "greet", '{"who": "bob"}').result()
        assert result.content == "ahoy, bob"
        assert bearer_client().get(f"{url}/").json()["environment"] == "ahoy-greeter"
        client = bearer_client()
        assert client.post(f"{url}/seed_session", json={"prompt": "hi"}).ok
        assert client.post(f"{url}/greet", json={"who": "ann"}).text == "ahoy, ann"
    finally:
        serve.delete("http-ahoy")


def test_routes_refuse_requests_without_the_token_and_take_those_with_it(booking_url):
    """Every route, tool and protocol alike: no token or a wrong one is a 401 that names the
    header to send; the app's token gets in."""
    routes = [("post", "seed_session"), ("post", "book"), ("post", "verify"), ("get", "")]
    for method, route in routes:
        for headers in ({}, bearer_header("a-guess"), {"Authorization": TOKEN}):
            answer = requests.request(method, f"{booking_url}/{route}", json=ROW, headers=headers)
            assert answer.status_code == 401, (route, headers, answer.text)
            assert answer.headers["www-authenticate"].startswith("Bearer")
    assert bearer_client().post(f"{booking_url}/seed_session", json=ROW).status_code == 200


def test_an_open_app_is_a_choice_its_caller_makes_by_name(serve_session):
    """``RouteAuth.open()`` (what `env serve --no-auth` passes) is the only way to routes
    without a token; an app built with no RouteAuth at all cannot be made."""
    with pytest.raises(TypeError):
        environment_app("rayrollout.environments.booking.env:BookingEnv")  # type: ignore[call-arg]
    serve.run(
        environment_app("rayrollout.environments.booking.env:BookingEnv", auth=RouteAuth.open()),
        name="http-booking-open",
        route_prefix="/http-booking-open",
    )
    try:
        url = f"http://127.0.0.1:{serve_session}/http-booking-open"
        assert requests.post(f"{url}/seed_session", json=ROW).status_code == 200
    finally:
        serve.delete("http-booking-open")


async def test_a_forwarded_call_no_replica_took_is_sent_again_and_one_taken_never(monkeypatch):
    """Ray 2.60's consistent-hash router now and then leaves a request unassigned for ever;
    ``_assigned`` cancels such a request (it never ran) and sends it again, but awaits one a
    replica took, however long it runs."""
    import asyncio
    import concurrent.futures

    from rayrollout.envkit.nemo_gym import routes

    monkeypatch.setattr(routes, "_ASSIGN_TIMEOUT_S", 0.05)

    class Response:  # a DeploymentResponse's shape: the assignment future, then the answer
        def __init__(self, assigned: bool, answer: str) -> None:
            self._replica_result_future = concurrent.futures.Future()
            if assigned:
                self._replica_result_future.set_result("replica")
            self.answer = answer

        def __await__(self):
            yield from asyncio.sleep(0.2).__await__()  # runs past the assignment timeout
            return self.answer

    sent = [Response(False, "lost"), Response(False, "lost"), Response(True, "done")]
    calls = iter(sent)
    assert await routes._assigned(lambda: next(calls), "verify") == "done"
    assert [r._replica_result_future.cancelled() for r in sent] == [True, True, False]

    monkeypatch.setattr(routes, "_ASSIGN_TRIES", 2)
    with pytest.raises(routes.EnvironmentRoutingError, match="verify: Ray Serve's router"):
        await routes._assigned(lambda: Response(False, "lost"), "verify")
