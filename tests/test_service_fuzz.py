"""The rollout service under inputs nobody should send: every route fuzzed from the OpenAPI
description the service itself serves, and the known hostile inputs, one test each.

Schemathesis builds requests for every route from the service's OpenAPI description (the
document ``GET /openapi.json`` serves, which a test compares): valid ones and ones that
break the schema. They go to a real service (`rayrollout up`'s, beside a detached engine on
the session's Ray; the scripted policy plays), with and without the run's bearer token.
Without it every answer is 401. With it no answer is a server error (>= 500) and no body
holds a traceback; the one 500 a route documents, NeMo Gym's answer for an episode that
failed on ``/run``, is counted apart. Each route's batch routes are fuzzed once more against
a finished batch, so cursors and acknowledgements meet real rows. The number of requests
sent per route is printed at the end of the module (and recorded as each test's ``requests``
property).
"""

from __future__ import annotations

import http.client
import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import content_type_conformance, response_schema_conformance

from rayrollout import RunConfig
from rayrollout.api.cluster import down, service_url, start_detached
from rayrollout.api.service.openapi import openapi
from rayrollout.auth import read_token_file
from rayrollout.client import BatchConflictError, RolloutClient
from rayrollout.engine.secret_env import route_token_path

NAMESPACE = "service-fuzz"
EXAMPLES = 20  # per route, token and generation mode: the whole module runs in about a minute
TRACEBACK = "Traceback (most recent call last)"
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
SENT: Counter[str] = Counter()  # requests per route, printed at the end of the module
STATUSES: Counter[tuple[str, int]] = Counter()
NEMO_GYM_FAILURES: Counter[str] = Counter()
SCHEMA = schemathesis.openapi.from_dict(openapi())  # the routes, to parametrize over
OPERATIONS = {op.label: op for op in (result.ok() for result in SCHEMA.get_all_operations())}
ON_A_BATCH = [label for label in OPERATIONS if "{batch_id}" in label and "DELETE" not in label]


@pytest.fixture(scope="module")
def service(tmp_path_factory, serve_session, request) -> Iterator[dict[str, Any]]:
    """A detached engine and its HTTP service, small limits, one finished batch to fuzz."""
    out = tmp_path_factory.mktemp("service-fuzz")
    config = RunConfig.model_validate(
        {
            "namespace": NAMESPACE,
            "environments": {"echo": {"path": "fixture_envs:EchoEnv"}},
            "environment": "echo",
            "workers": {"num_workers": 1},
            "concurrency": 8,
            "output": {"dir": str(out / "out")},
            "ray": {"serve_port": serve_session},
            "service": {
                "port": 0,
                "max_buffered_rows": 16,
                "max_open_batches": 6,
                "max_tasks_per_submit": 4,
                "max_samples_per_task": 2,
                "max_body_mb": 1,
            },
        }
    )
    start_detached(config)
    try:
        url = service_url(NAMESPACE)
        token = read_token_file(route_token_path(NAMESPACE))
        client = RolloutClient(url, token, retries=3, backoff_s=0.1)
        finished = client.submit(tasks("fuzzed", 3), n=2, batch_id="fuzzed")
        deadline = time.monotonic() + 120
        while not client.batch(finished.batch_id).done and time.monotonic() < deadline:
            time.sleep(0.2)
        yield {"url": url, "token": token, "client": client, "batch": finished.batch_id}
    finally:
        down(NAMESPACE)
        _report(request)


def _report(request: pytest.FixtureRequest) -> None:
    """The requests sent per route and the statuses they got, on the terminal (past capture)."""
    lines = [f"service fuzzing: requests per route ({sum(SENT.values())} in all), by status:"]
    for route, count in sorted(SENT.items()):
        statuses = ", ".join(f"{s}: {n}" for (r, s), n in sorted(STATUSES.items()) if r == route)
        lines.append(f"  {count:5d}  {route}  ({statuses})")
    if NEMO_GYM_FAILURES:
        lines.append(f"  NeMo Gym failure answers of /run: {dict(NEMO_GYM_FAILURES)}")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    reporter = request.config.pluginmanager.getplugin("terminalreporter")
    if capture is None or reporter is None:
        print("\n".join(lines))
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        for line in lines:
            reporter.write_line(line)


def tasks(prefix: str, count: int) -> list[dict[str, Any]]:
    return [{"task_id": f"{prefix}-{i}", "prompt": f"say {prefix} {i}"} for i in range(count)]


def auth(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def fuzz(
    service: dict[str, Any],
    label: str,
    token: str | None,
    modes: list[GenerationMode],
    check: Any,
    path_parameters: dict[str, Any] | None = None,
) -> int:
    """Send ``EXAMPLES`` generated requests per mode to one route; ``check`` each answer."""
    operation = OPERATIONS[label]
    strategy = st.one_of(
        [operation.as_strategy(mode, path_parameters=path_parameters) for mode in modes]
    )
    session = requests.Session()
    sent = 0

    @settings(FUZZ, max_examples=EXAMPLES * len(modes))
    @given(case=strategy)
    def run(case: Any) -> None:
        nonlocal sent
        response = case.call(base_url=service["url"], session=session, headers=auth(token))
        sent += 1
        SENT[label] += 1
        STATUSES[(label, response.status_code)] += 1
        assert TRACEBACK not in response.text, (case.as_curl_command(), response.text[:2000])
        check(case, response)
        if label == "POST /v1/pause" and response.status_code == 200:  # the next may play
            session.post(f"{service['url']}/v1/resume", headers=auth(service["token"]))

    run()
    return sent


def _no_server_error(case: Any, response: requests.Response) -> None:
    if response.status_code >= 500:
        body = (
            response.json()
            if response.headers.get("Content-Type", "").startswith("application/json")
            else {}
        )
        if (
            case.operation.path == "/run"
            and response.status_code == 500
            and "_ng_failure_class" in body
        ):
            NEMO_GYM_FAILURES[body["_ng_failure_class"]] += 1  # NeMo Gym's own protocol
            return
        raise AssertionError(
            f"{response.status_code} from {case.as_curl_command()}: {response.text[:2000]}"
        )
    case.validate_response(response, checks=[response_schema_conformance, content_type_conformance])


# The known hostile inputs, each a 4xx naming the problem.


def raw(service: dict[str, Any], method: str, path: str, body: bytes | None = None) -> Any:
    """One request on its own connection: (status, JSON answer)."""
    host, port = service["url"].removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request(method, path, body=body, headers=auth(service["token"]))
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


def nested(depth: int) -> str:
    """JSON text of ``depth`` objects, one in another (the test's own JSON writer would
    recurse as deeply as the service must not)."""
    return '{"a":' * depth + '"deep"' + "}" * depth


@pytest.mark.parametrize("depth", [70, 1000])
def test_a_task_nested_deeply_is_refused_by_field_before_anything_recurses(service, depth):
    row = '{"task_id":"deep","prompt":"hi","hint":' + nested(depth) + "}"
    body = f'{{"batch_id":"deep-{depth}","tasks":[{row}]}}'.encode()
    status, answer = raw(service, "POST", "/v1/batches", body)
    assert status == 400, answer
    assert answer["detail"].startswith("field 'tasks[0].hint.a.a")
    assert (
        "nests deeper than 66 levels" in answer["detail"]
        and "Nothing was started" in answer["detail"]
    )
    status, _ = raw(service, "GET", f"/v1/batches/deep-{depth}")
    assert status == 404  # nothing was started
    status, answer = raw(service, "POST", "/run", nested(depth).encode())
    assert status == 400 and "nests deeper than" in answer["detail"]


@pytest.mark.parametrize("cursor", [str(10**30), "1" * 5000, "²", "-1", "1e3"])
def test_a_cursor_out_of_range_on_a_live_batch_is_a_400_naming_the_query(service, cursor):
    path = f"/v1/batches/{service['batch']}/trajectories?cursor={quote(cursor)}"
    status, answer = raw(service, "GET", path)
    assert status == 400, answer
    assert answer["detail"].startswith("query 'cursor': a non-negative integer")
    assert answer["field"] == "cursor"


def test_a_cursor_past_the_finished_rows_is_a_409(service):
    status, answer = raw(service, "GET", f"/v1/batches/{service['batch']}/trajectories?cursor=7")
    assert status == 409 and "past its 6 finished rows" in answer["detail"]


def test_an_ack_past_the_rows_streamed_is_refused_and_the_rows_stay_readable(service):
    client: RolloutClient = service["client"]
    batch = client.submit(tasks("unread", 2), n=2, write=False)
    deadline = time.monotonic() + 120
    while not client.batch(batch.batch_id).done and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.batch(batch.batch_id).finished == 4  # finished, none streamed yet
    with pytest.raises(BatchConflictError, match="past the 0 rows .* streamed so far") as refused:
        client.ack(batch.batch_id, 4)
    assert refused.value.status == 409 and "Nothing was freed" in refused.value.detail
    assert client.batch(batch.batch_id).acknowledged == 0
    rows = list(client.stream(batch.batch_id))
    assert sorted(item.trajectory.key for item in rows) == [
        (f"unread-{t}", s) for t in range(2) for s in range(2)
    ]
    assert client.batch(batch.batch_id).acknowledged == 4  # read, then acknowledged


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/etc/passwd", "outside the folders this run loads checkpoints from"),
        ("/nonexistent/../../etc/shadow", "resolved: '/etc/shadow'"),
        ("ckpt/step-1", "must be absolute"),
    ],
)
def test_a_weights_path_outside_the_roots_is_refused_by_name_and_the_version_stays(
    service, path, named
):
    client: RolloutClient = service["client"]
    before = client.stats().policy
    status, answer = raw(service, "POST", "/v1/weights", json.dumps({"path": path}).encode())
    assert status == 400, answer
    assert named in answer["detail"] and answer["detail"].startswith("WeightsPathError: ")
    after = client.stats().policy
    assert (after.version, after.paused) == (before.version, before.paused)


def test_a_weights_path_in_the_temp_folder_that_does_not_exist_is_refused(service, tmp_path):
    status, answer = raw(
        service, "POST", "/v1/weights", json.dumps({"path": str(tmp_path / "none")}).encode()
    )
    assert status == 400 and "does not exist" in answer["detail"]


def test_a_weights_path_under_the_roots_moves_the_version(service, tmp_path):
    client: RolloutClient = service["client"]
    before = client.stats().policy.version
    assert client.update_weights(str(tmp_path)).version == before + 1


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
extra_fields = st.dictionaries(
    st.text(min_size=1, max_size=8).filter(
        lambda key: key not in {"task_id", "prompt", "environment", "tools", "sampling", "agent"}
    ),
    json_values,
    max_size=3,
)


@settings(FUZZ, max_examples=8)
@given(
    prompts=st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=4),
    extras=st.lists(extra_fields, min_size=4, max_size=4),
    n=st.integers(1, 2),
)
def test_a_submit_of_any_rows_streams_each_accepted_sample_once_and_names_each_refused_row(
    service, prompts, extras, n
):
    """Rows with any prompt text and any extra fields: each row is run (every sample
    streamed exactly once) or refused by index, never lost, and no answer is a 5xx."""
    client: RolloutClient = service["client"]
    rows = [
        {**extra, "task_id": f"any-{i}", "prompt": text}
        for i, (text, extra) in enumerate(zip(prompts, extras, strict=False))
    ]
    batch = client.submit(rows, n=n, write=False, skip_invalid=True)
    refused = {error.row for error in batch.rejected}
    streamed = Counter(item.trajectory.key for item in client.stream(batch.batch_id))
    accepted = [i for i in range(len(rows)) if i not in refused]
    assert streamed == Counter((f"any-{i}", k) for i in accepted for k in range(n))
    assert all(error.message for error in batch.rejected)


def test_a_row_with_a_float_json_cannot_carry_is_refused_by_the_client_before_sending(service):
    client: RolloutClient = service["client"]
    before = client.info().open_batches
    with pytest.raises(ValueError, match="float JSON cannot carry"):
        client.submit([{"task_id": "inf", "prompt": "hi", "weight": float("inf")}], write=False)
    assert client.info().open_batches == before  # nothing reached the service


# Every route, fuzzed (after the known cases: a fuzzed version may reach the highest).


def fuzz_with_the_token(
    service: dict[str, Any], label: str, path_parameters: dict[str, Any] | None = None
) -> int:
    """Both generation modes at one route, with the token: no answer a server error."""
    modes = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
    return fuzz(service, label, service["token"], modes, _no_server_error, path_parameters)


@pytest.mark.parametrize("label", list(OPERATIONS))
def test_no_generated_request_gets_a_server_error_or_a_traceback(service, label, record_property):
    sent = fuzz_with_the_token(service, label)
    record_property("requests", sent)
    assert sent >= EXAMPLES  # at least one mode's worth (a small schema may repeat less)


@pytest.mark.parametrize("label", ON_A_BATCH)
def test_the_batch_routes_meet_a_real_batch_without_a_server_error(service, label, record_property):
    sent = fuzz_with_the_token(service, label, path_parameters={"batch_id": service["batch"]})
    record_property("requests", sent)
    assert sent >= EXAMPLES


@pytest.mark.parametrize("label", list(OPERATIONS))
def test_without_the_token_every_generated_request_is_a_401(service, label, record_property):
    def unauthorized(case: Any, response: requests.Response) -> None:
        assert response.status_code == 401, (case.as_curl_command(), response.text[:500])
        assert "bearer token" in response.json()["detail"]

    sent = fuzz(service, label, None, [GenerationMode.POSITIVE], unauthorized)
    sent += fuzz(service, label, "not-the-token", [GenerationMode.NEGATIVE], unauthorized)
    record_property("requests", sent)


def test_the_description_is_served_and_names_every_route(service):
    answer = requests.get(f"{service['url']}/openapi.json", headers=auth(service["token"]))
    assert answer.status_code == 200 and answer.json() == openapi()
    routes = {(m.upper(), p) for p, ops in answer.json()["paths"].items() for m in ops}
    assert {("POST", "/v1/batches"), ("POST", "/v1/weights"), ("POST", "/run")} <= routes
    assert len(routes) == 13
    refused = requests.get(f"{service['url']}/openapi.json")
    assert refused.status_code == 401
