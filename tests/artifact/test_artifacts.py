"""The synthesized Lambda functions, run from their asset directories, with their template's
environment, against local servers: what ``cdk deploy`` would ship, not what the repo imports.

For every Lambda function of every template: its asset must import in a clean interpreter that
has only the asset and the Lambda runtime's boto3; it is driven with the event shapes its
trigger sends (a REST proxy event for the router, every WebSocket route key of the template for
the handler, a REQUEST authorizer event with and without a valid token, a scheduled event for
the canary against a local gateway); and the variables its code reads must be the ones its
template sets. A failure names the function by its construct path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import re
import uuid

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from streamfleet import model
from streamfleet_auction import names as auction_names
from streamfleet_dev.emulator.ecs import HANDLER as TASK_EVENTS_ENTRY
from streamfleet_dev.emulator.ecs import local_cluster_arn, rule_target
from streamfleet_dev.emulator.lambda_runner import (
    LambdaFunctionError,
    LambdaSpec,
    kept_by_log_filter,
    rest_proxy_event,
    scheduled_event,
    wrong_target,
)
from tests.assembly_support import (
    AUTHORIZER_ENTRY,
    CANARY_ENTRY,
    FLEET_STACKS,
    HANDLER_ENTRY,
    ROUTER_ENTRY,
    WS_STACKS,
    SigningKey,
    artifact_assembly,
    build_world,
    client,
    environment_findings,
    eventually,
    function_with_handler,
    origin_findings,
    user_token,
    websocket_region,
)

pytestmark = pytest.mark.slow
ROLES = ("primary", "secondary")
# Each handler of the templates -> the test that runs it from its asset ("module::function"
# when the test lives elsewhere; checked to exist below, so this list cannot go stale).
DRIVEN_HANDLERS = {
    ROUTER_ENTRY: "test_router_from_its_asset",
    HANDLER_ENTRY: "test_websocket_routes_and_authorizer_from_their_assets",
    AUTHORIZER_ENTRY: "test_websocket_routes_and_authorizer_from_their_assets",
    CANARY_ENTRY: "test_canary_from_its_asset",
    "streamfleet.task_events.handler": (
        "tests.artifact.test_task_events::test_a_stopped_event_ends_the_dead_tasks_sessions_and_announces_each_stream"
    ),
    "streamfleet.wsapi.fanout.handler": (
        "tests.artifact.test_fanout_assets::test_the_fanout_from_its_asset_delivers_the_stream_live"
    ),
    "streamfleet.wsapi.stream_lookup.handler": (
        "tests.artifact.test_fanout_assets::test_the_stream_lookup_from_its_asset_answers_cloudformation"
    ),
}
# CDK's own custom-resource providers (Node.js code that ships inside aws-cdk-lib and runs at
# deploy time, never the project's code): their construct path names the provider.
CDK_PROVIDER_PATH = re.compile(r"/Custom::[A-Za-z0-9]+CustomResourceProvider/Handler$")


@pytest.fixture(scope="module")
def world(servers, tmp_path_factory):
    yield from build_world(servers, tmp_path_factory.mktemp("artifacts"))


def test_every_lambda_function_of_every_template_is_driven():
    undriven = []
    for function in artifact_assembly().functions():
        if function.is_python:
            if function.handler not in DRIVEN_HANDLERS:
                undriven.append(f"{function.label} ({function.handler})")
        elif not CDK_PROVIDER_PATH.search(function.path):
            undriven.append(f"{function.label} ({function.runtime}, not CDK's own provider)")
    assert not undriven, f"functions no test here runs from their asset: {undriven}"
    for test in set(DRIVEN_HANDLERS.values()):
        module, _, name = test.rpartition("::")
        assert callable(getattr(importlib.import_module(module or __name__), name, None)), test
    stacks = {f.stack for f in artifact_assembly().functions() if f.is_python}
    assert stacks == {*FLEET_STACKS.values(), *WS_STACKS.values()}


def test_compiled_code_in_each_asset_fits_its_function_runtime():
    problems = []
    for function in artifact_assembly().functions():
        if function.is_python:
            spec = LambdaSpec(
                name=function.label,
                asset_dir=function.asset_dir,
                handler=function.handler,
                runtime=function.runtime,
                architecture=function.architecture,
            )
            problems += [f"{function.label}: {problem}" for problem in wrong_target(spec)]
    assert not problems, problems


def _path_parameters(resource: str, value: str) -> dict[str, str]:
    return {name: value for name in re.findall(r"\{([^}+]+)\}", resource)}


@pytest.mark.parametrize("role", ROLES)
def test_router_from_its_asset(world, role):
    region = world.regions[role]
    stack = region.fleet.stack
    function = function_with_handler(stack, ROUTER_ENTRY)
    router = world.start_function(region.fleet, function, access_key=f"router-{role}")
    methods = {
        (m.http_method, m.resource_path)
        for m in stack.rest_methods()
        if m.function == function.logical_id
    }
    assert ("POST", "/events") in methods and ("GET", "/connections/{connection_id}") in methods
    connection_id = f"artifact-{role}-{uuid.uuid4().hex[:6]}"
    ws_url = "ws://127.0.0.1:8765/streams/a"

    def call(method: str, resource: str, body: dict | None = None, ident: str = connection_id):
        event = rest_proxy_event(
            method,
            resource,
            path_parameters=_path_parameters(resource, ident),
            body=json.dumps(body) if body is not None else None,
        )
        answer = router.invoke(event)
        return answer["statusCode"], json.loads(answer["body"])

    start = {"event_type": "START", "connection_id": connection_id, "ws_url": ws_url}
    assert call("POST", "/events", start)[0] == 201
    assert call("POST", "/events", start)[0] == 200  # idempotent
    status, body = call("GET", "/connections/{connection_id}")
    assert status == 200 and body["state"][model.DESIRED_STATE] == "STARTED", body
    status, body = call(
        "POST", "/events", {**start, "connection_id": "x2", "ws_url": "wss://evil.example.org/"}
    )
    assert status == 400 and body["field"] == "ws_url", body
    stop = {"event_type": "STOP", "connection_id": connection_id}
    assert call("POST", "/events", stop)[0] == 200
    assert call("GET", "/connections/{connection_id}", ident="never-started")[0] == 404
    # What the router wrote is where the template's references point: the lease table and
    # the intake queue, created from the same templates.
    lease_table = region.fleet.environment({"t": function.environment["TABLE_NAME"]})["t"]
    item = client("dynamodb", world.dynalite, region.name).get_item(
        TableName=lease_table, Key={model.PK: {"S": model.connection_pk(connection_id)}}
    )["Item"]
    assert item[model.DESIRED_STATE]["S"] == "STOPPED"
    queue_url = region.fleet.environment({"q": function.environment["QUEUE_URL"]})["q"]
    sqs = client("sqs", world.moto, region.name)
    bodies = [
        m["Body"]
        for m in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])
    ]
    assert model.notification_body(model.connection_pk(connection_id)) in bodies
    findings = environment_findings(function, router) + origin_findings(function, router)
    assert not findings, findings


ROUTE_MESSAGES = {
    model.WS_ROUTE_HEARTBEAT: {"action": model.WS_ROUTE_HEARTBEAT, "requestId": "r-heartbeat"},
    model.WS_ROUTE_GET_STATE: {
        "action": model.WS_ROUTE_GET_STATE,
        "requestId": "r-state",
        "auction": "a1",
    },
    # The demo auction's route, which the default app adds.
    auction_names.WS_ROUTE_BID: {
        "action": auction_names.WS_ROUTE_BID,
        "requestId": "r-bid",
        "auction": "a1",
        "amount": 10,
    },
    # A stream nobody STARTed: refused (default deny), after the route read the lease table.
    model.WS_ROUTE_SUBSCRIBE: {
        "action": model.WS_ROUTE_SUBSCRIBE,
        "requestId": "r-subscribe",
        "stream": "never-started",
        "after": None,
    },
    model.WS_ROUTE_UNSUBSCRIBE: {
        "action": model.WS_ROUTE_UNSUBSCRIBE,
        "requestId": "r-unsubscribe",
        "stream": "never-started",
    },
    "$default": {"action": "no-such-route", "requestId": "r-default"},
}
EXPECTED_REPLY = {
    "r-heartbeat": model.WS_PONG_FRAME,
    "r-state": model.WS_REPLY_STATE,
    "r-bid": auction_names.WS_REPLY_BID,
    "r-subscribe": f"{model.WS_REPLY_ERROR}:forbidden",  # default deny, not an internal error
    "r-unsubscribe": model.WS_REPLY_UNSUBSCRIBED,
    "r-default": f"{model.WS_REPLY_ERROR}:bad_request",
}


async def _replies(socket, expected: set[str]) -> dict[str, str]:
    """Reply type by requestId, ``error:<code>`` for errors (a bare ``pong`` text frame answers
    the heartbeat)."""
    found: dict[str, str] = {}
    while set(found) < expected:
        message = await asyncio.wait_for(socket.recv(), 10)
        if message == model.WS_PONG_FRAME:
            found["r-heartbeat"] = model.WS_PONG_FRAME
            continue
        payload = json.loads(message)
        request_id = payload.get("requestId") or (
            "r-heartbeat" if payload.get("type") == model.WS_PONG_FRAME else None
        )
        if request_id:
            kind = payload.get("type")
            found[request_id] = f"{kind}:{payload.get('error')}" if "error" in payload else kind
    return found


@pytest.mark.parametrize("role", ROLES)
async def test_websocket_routes_and_authorizer_from_their_assets(world, role):
    async with websocket_region(world, role) as api:
        issuer = api.authorizer_function.environment["JWT_ISSUER"]
        audience = api.authorizer_function.environment["JWT_AUDIENCE"]
        offered = [model.WS_APP_SUBPROTOCOL]
        with pytest.raises(InvalidStatus) as missing:
            async with connect(api.url, subprotocols=offered, open_timeout=10):
                pass
        assert missing.value.response.status_code == 401
        forged = user_token(SigningKey.generate("forged"), issuer=issuer, audience=audience)
        with pytest.raises(InvalidStatus) as denied:
            async with connect(
                api.url, subprotocols=[*offered, f"bearer.{forged}"], open_timeout=10
            ):
                pass
        assert denied.value.response.status_code == 403
        # Lambda counts the 401 (raised) as an error of the authorizer: its own count of
        # connects without a token, as the template's errors alarm reads it, leaves exactly
        # that one out (not the 403, which is an answer).
        expected = _expected_errors_metric(
            api.region.websocket.stack, api.authorizer_function, api.authorizer.spec.function_name
        )
        assert _emf_counts(api.authorizer.emf_documents(), expected) == 1
        token = user_token(world.idp_key, issuer=issuer, audience=audience)
        async with connect(
            api.url, subprotocols=[*offered, f"bearer.{token}"], open_timeout=10
        ) as socket:
            assert socket.subprotocol == model.WS_APP_SUBPROTOCOL
            (connection_id,) = api.gateway.connection_ids
            routes = [key for key in api.route_keys if key not in ("$connect", "$disconnect")]
            unknown = [key for key in routes if key not in ROUTE_MESSAGES]
            assert not unknown, f"routes of the template this test cannot drive: {unknown}"
            for key in routes:
                await socket.send(json.dumps(ROUTE_MESSAGES[key]))
            wanted = {ROUTE_MESSAGES[key]["requestId"] for key in routes}
            replies = await _replies(socket, wanted)
            assert replies == {rid: EXPECTED_REPLY[rid] for rid in wanted}
        connections_table = api.region.websocket.environment(
            {"t": api.handler_function.environment[model.ENV_CONNECTIONS_TABLE_NAME]}
        )["t"]
        dynamodb = client("dynamodb", world.moto, api.region.name)

        def connection_record_gone() -> bool:
            return "Item" not in dynamodb.get_item(
                TableName=connections_table,
                Key={model.PK: {"S": model.ws_connection_pk(connection_id)}},
                ConsistentRead=True,
            )

        # $disconnect deletes what $connect wrote (after a throttled attempt, its retries).
        await eventually(connection_record_gone, timeout=20, what="the connection record deleted")
        invoked = set(api.gateway.stats.invocations)
        assert set(api.route_keys) <= invoked, (
            f"route keys never invoked: {set(api.route_keys) - invoked}"
        )
        findings = []
        for function, process in (
            (api.handler_function, api.handler),
            (api.authorizer_function, api.authorizer),
        ):
            findings += environment_findings(function, process) + origin_findings(function, process)
        assert not findings, findings


def _expected_errors_metric(stack, function, function_name: str) -> dict:
    """The metric the function's errors alarm subtracts from Lambda's ``Errors``, with its
    ``Ref`` dimension resolved to ``function_name`` (the name the local runner gives it)."""
    for alarm in stack.of_type("AWS::CloudWatch::Alarm").values():
        queries = {q["Id"]: q for q in alarm["Properties"].get("Metrics", [])}
        stats = {i: q["MetricStat"]["Metric"] for i, q in queries.items() if "MetricStat" in q}
        errors = stats.get("errors", {})
        if errors.get("MetricName") != "Errors" or errors.get("Dimensions") != [
            {"Name": "FunctionName", "Value": {"Ref": function.logical_id}}
        ]:
            continue
        (formula,) = [q["Expression"] for q in queries.values() if "Expression" in q]
        assert formula == "errors - FILL(expected, 0)", formula
        metric = stats["expected"]
        dimensions = {d["Name"]: d["Value"] for d in metric["Dimensions"]}
        assert dimensions == {model.METRIC_DIMENSION_FUNCTION: {"Ref": function.logical_id}}
        return {
            "namespace": metric["Namespace"],
            "name": metric["MetricName"],
            "dimensions": {model.METRIC_DIMENSION_FUNCTION: function_name},
        }
    raise AssertionError(f"{function.label}: no errors alarm subtracts anything from Errors")


def _emf_counts(documents: list[dict], metric: dict) -> float:
    """The sum of ``metric`` over EMF ``documents``, as CloudWatch would extract it."""
    total = 0.0
    for document in documents:
        for directive in document["_aws"]["CloudWatchMetrics"]:
            names = [m["Name"] for m in directive["Metrics"]]
            if directive["Namespace"] != metric["namespace"] or metric["name"] not in names:
                continue
            for dimension_set in directive["Dimensions"]:
                if {d: document.get(d) for d in dimension_set} == metric["dimensions"]:
                    total += document[metric["name"]]
    return total


def test_the_missing_token_count_reaches_cloudwatch_at_a_warn_log_level(world):
    """``lambda_log_level`` WARN (documented): Lambda then drops stdout JSON lines below WARN, and
    one without a ``level`` counts as INFO. The count must still get through, or every connect
    without a token trips the authorizer's errors alarm again."""
    region = world.regions["primary"]
    function = dataclasses.replace(
        function_with_handler(region.websocket.stack, AUTHORIZER_ENTRY), log_level="WARN"
    )
    process = world.start_function(region.websocket, function, access_key="authorizer-warn")
    event = {
        "type": "REQUEST",
        "methodArn": f"arn:aws:execute-api:{region.name}:123456789012:a/v1/$connect",
        "headers": {},
        "requestContext": {"connectionId": "c1", "apiId": "a", "routeKey": "$connect"},
    }
    with pytest.raises(LambdaFunctionError, match=r"^Unauthorized$"):
        process.invoke(event)
    expected = _expected_errors_metric(region.websocket.stack, function, process.spec.function_name)
    assert _emf_counts(process.emf_documents(), expected) == 1
    # ...while a JSON line without its level would not have (what the filter does).
    assert not kept_by_log_filter('{"_aws": {}, "n": 1}', "WARN")
    assert kept_by_log_filter('{"_aws": {}, "n": 1, "level": "WARN"}', "WARN")


@pytest.mark.parametrize("role", ROLES)
async def test_canary_from_its_asset(world, role):
    region = world.regions[role]
    stack = region.websocket.stack
    function = function_with_handler(stack, CANARY_ENTRY)
    async with websocket_region(world, role) as api:
        canary = await asyncio.to_thread(api.start_canary, world, function, f"canary-{role}")
        rules = [
            logical_id
            for logical_id, rule in stack.of_type("AWS::Events::Rule").items()
            if f'"{function.logical_id}"' in json.dumps(rule["Properties"].get("Targets"))
        ]
        assert rules, f"{function.label}: no schedule rule targets it"
        event = scheduled_event(
            region.name,
            stack.account,
            f"arn:aws:events:{region.name}:{stack.account}:rule/{rules[0]}",
        )
        result = await asyncio.to_thread(canary.invoke, event)
        assert result["healthy"] is True, (result, canary.log_text()[-2000:])
        metrics = client("cloudwatch", world.moto, region.name).list_metrics(
            Namespace=model.HEALTH_METRIC_NAMESPACE,
            MetricName=model.HEALTH_METRIC_NAME,
            Dimensions=[{"Name": model.HEALTH_METRIC_DIMENSION_API_ID, "Value": region.api_id}],
        )["Metrics"]
        assert metrics, "the canary published no health datapoint for this API"
        findings = environment_findings(function, canary) + origin_findings(function, canary)
        assert not findings, findings


@pytest.mark.parametrize("server", ["moto", "dynalite"])
def test_local_tables_are_the_synthesized_ones(servers, server):
    """create_tables (local mode, the tests) builds what the template declares, and says what a
    server could not apply."""
    from streamfleet_dev.assembly import default_assembly
    from streamfleet_dev.tables import create_tables

    dynamodb = client("dynamodb", servers[server].endpoint, "us-east-1")
    suffix = uuid.uuid4().hex[:8]
    created = create_tables(dynamodb, lease_table=f"t-l-{suffix}", messages_table=f"t-m-{suffix}")
    try:
        for table in created:
            declared = default_assembly().table(table.definition.table_name)
            described = dynamodb.describe_table(TableName=table.name)["Table"]
            assert described["KeySchema"] == list(declared.key_schema)
            indexes = {
                index["IndexName"]: (index["KeySchema"], index["Projection"])
                for index in described.get("GlobalSecondaryIndexes", ())
            }
            assert indexes == {
                index.name: (list(index.key_schema), dict(index.projection))
                for index in declared.indexes
            }
            if server == "moto":
                assert not table.not_applied
                ttl = dynamodb.describe_time_to_live(TableName=table.name)["TimeToLiveDescription"]
                expected = declared.ttl_attribute
                assert ttl.get("AttributeName") == expected if expected else True
                stream = (described.get("StreamSpecification") or {}).get("StreamViewType")
                assert stream == declared.stream_view_type
            elif declared.ttl_attribute:  # dynalite has no TTL: said, not hidden
                assert f"TTL on {declared.ttl_attribute}" in table.not_applied
    finally:
        for table in created:
            dynamodb.delete_table(TableName=table.name)


def test_worker_launch_is_the_task_definitions_container():
    """What fleet processes run locally: the image's command in the image's code, with the
    image's ENV and the container's environment, ``python`` being the image's requirements."""
    from streamfleet_dev.assembly import local_environment, reference_of
    from streamfleet_dev.emulator.container import container_launch

    stack = artifact_assembly().stack(FLEET_STACKS["primary"])
    container = stack.container()
    refs = {
        reference_of(v): f"local-{k}" for k, v in container.environment.items() if reference_of(v)
    }
    environment = local_environment(
        container.environment, stack, refs=refs, overrides={"HEALTH_PORT": "0"}
    )
    with pytest.raises(Exception, match="not in the template"):
        local_environment(container.environment, stack, overrides={"NO_SUCH_VARIABLE": "1"})
    launch = container_launch(container, environment, image_bin=container.image_dir / "bin")
    assert launch.argv == ("python", "-m", "streamfleet.worker")  # the image's ENTRYPOINT
    assert launch.cwd == container.image_dir and (launch.cwd / "streamfleet" / "worker").is_dir()
    assert launch.env["PATH"].split(":")[0] == str(container.image_dir / "bin")
    for name, value in container.image.env.items():  # image paths mapped to the build context
        local = launch.env[name].replace(str(container.image_dir), container.image.workdir)
        assert local == (value if name != "HEALTH_PORT" else "0"), name
    assert launch.env["TABLE_NAME"] == refs[reference_of(container.environment["TABLE_NAME"])]
    assert set(container.environment) <= set(launch.env)


def test_the_environment_check_names_both_kinds_of_mismatch(world):
    """A template variable no code reads, and a variable the code reads that the template does
    not set (here: the router's own TABLE_NAME, taken out of its template)."""
    import dataclasses

    region = world.regions["primary"]
    function = function_with_handler(region.fleet.stack, ROUTER_ENTRY)
    variables = {k: v for k, v in function.environment.items() if k != "TABLE_NAME"}
    altered = dataclasses.replace(function, environment={**variables, "NOBODY_READS_THIS": "1"})
    router = world.start_function(region.fleet, altered, access_key="router-altered")
    event = rest_proxy_event("POST", "/events", body=json.dumps({"event_type": "STOP"}))
    assert router.invoke(event)["statusCode"] == 500  # TABLE_NAME: required but not set
    findings = environment_findings(altered, router)
    label = function.label
    assert f"{label}: the template sets NOBODY_READS_THIS but its code never reads it" in findings
    assert any(f.startswith(f"{label}: its code reads TABLE_NAME") for f in findings), findings


# One variable of each function's template made bad: the first its configuration checks, so the
# rest of the environment need not be valid. The stream lookup's template sets none (it reads
# its table from the custom resource's properties), so it has no configuration to get wrong.
BAD_VARIABLE: dict[str, tuple[str, str] | None] = {
    ROUTER_ENTRY: (model.ENV_TABLE_NAME, "not a table"),
    TASK_EVENTS_ENTRY: (model.ENV_TABLE_NAME, "not a table"),
    HANDLER_ENTRY: (model.ENV_STATE_TABLE_NAME, ""),
    AUTHORIZER_ENTRY: (model.ENV_JWT_ISSUER, ""),
    CANARY_ENTRY: (model.ENV_CANARY_ENDPOINT_URL, "https://not-a-websocket.example.com"),
    "streamfleet.wsapi.fanout.handler": (model.ENV_APIGW_MANAGEMENT_ENDPOINT, "ftp://nowhere"),
    "streamfleet.wsapi.stream_lookup.handler": None,
}
# What each function is invoked with: its trigger's event, as far as a bad configuration lets
# it get (the router routes before it reads its configuration).
CONFIG_EVENTS: dict[str, dict] = {
    ROUTER_ENTRY: rest_proxy_event(
        "POST", "/events", body=json.dumps({"event_type": "STOP", "connection_id": "c1"})
    ),
    TASK_EVENTS_ENTRY: {"source": "aws.ecs", "detail": {}},
    HANDLER_ENTRY: {"requestContext": {"routeKey": "$default", "connectionId": "c1"}},
    AUTHORIZER_ENTRY: {"type": "REQUEST", "methodArn": "arn:aws:execute-api:*", "headers": {}},
    CANARY_ENTRY: scheduled_event("us-east-1", "123456789012", "arn:aws:events:::rule/canary"),
    "streamfleet.wsapi.fanout.handler": {"Records": []},
}


def test_a_bad_variable_is_one_log_line_naming_it_in_every_function(world):
    """Every function of both templates, from its asset, with one bad variable: it writes one
    line that names the variable and no traceback, and fails as its trigger expects (the
    router with a 500 naming the variable; every other function raises ``ConfigError``: a
    retried event, a batch retried, an authorizer's or a route's HTTP 500, a canary error)."""
    local_stacks = {
        local.stack.name: local
        for region in world.regions.values()
        for local in (region.fleet, region.websocket)
    }
    functions = [f for f in artifact_assembly().functions() if f.is_python]
    assert {f.handler for f in functions} == set(BAD_VARIABLE)
    for index, function in enumerate(functions):
        bad = BAD_VARIABLE[function.handler]
        if bad is None:
            assert function.environment == {}, function.label
            continue
        variable, value = bad
        local = local_stacks[function.stack]
        if function.handler == TASK_EVENTS_ENTRY:  # its cluster and service: what its rule names
            target = rule_target(
                local.stack,
                bindings=local.bindings,
                cluster_arn=local_cluster_arn(local.stack.region),
                service_name="streamfleet-workers",
            )
            function = dataclasses.replace(function, environment=target.environment)
        assert variable in function.environment, function.label
        process = world.start_function(
            local,
            function,
            access_key=f"bad-config-{index}",
            extra_env={variable: value},
        )
        try:
            answer = process.invoke(CONFIG_EVENTS[function.handler])
        except LambdaFunctionError as failed:
            assert function.handler != ROUTER_ENTRY, function.label
            assert failed.error_type == "ConfigError", (function.label, failed.error_type)
            assert str(failed).startswith(f"{variable}: "), (function.label, str(failed))
        else:
            assert function.handler == ROUTER_ENTRY, (function.label, answer)
            assert answer["statusCode"] == 500, answer
            assert json.loads(answer["body"])["variable"] == variable, answer
        written = process.log_text()
        lines = [line for line in written.splitlines() if line.strip()]
        assert len(lines) == 1, (function.label, written)
        assert f"variable={variable} " in lines[0] + " ", (function.label, written)
        assert "Traceback" not in written, (function.label, written)
        process.stop()
