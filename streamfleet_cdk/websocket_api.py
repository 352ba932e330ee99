"""The client-facing WebSocket API of one Region: API Gateway, its Lambdas and its tables.

Clients connect to ``wss://<domain>/`` (the failover name, :mod:`streamfleet_cdk.failover_dns`) or
to the stage's regional URL. ``$connect`` runs the REQUEST authorizer
(:mod:`streamfleet.wsapi.authorizer`); every route, ``$connect`` included, runs one handler
(:mod:`streamfleet.wsapi.handlers`), which keeps the user's state in the *state table* (a global
table, keyed by the verified ``sub``, so a client that reconnects in the other Region finds it
there) and the connection ids in the Region's own *connections table*.

Route keys, the route-selection field, table specs and environment names are read from
:mod:`streamfleet.model` and from the runtime modules that serve them, never retyped.

A deployment adds routes of its own through :class:`HandlerExtension` (the handler's entry
module that installs them, the packages it lives in, its route keys, environment and
permissions); the demo auction is one (``examples/auction``, ``streamfleet_auction_cdk``).

Bundles (no Docker at synth), both for the app's one Lambda target
(:data:`~streamfleet_cdk.assets.LAMBDA_TARGET`, Python 3.14 on arm64):

* the handler needs only the ``streamfleet`` package (boto3 comes from the Lambda runtime);
* the authorizer verifies RS256/ES256 signatures with ``PyJWT`` over ``cryptography``, a compiled
  package (and cffi's ``_cffi_backend``): :func:`~streamfleet_cdk.assets.lambda_code` checks
  every wheel against the target and fetches the same version built for it (cp314, manylinux
  aarch64) where the synth interpreter's wheel does not fit.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import jsii
from aws_cdk import Duration, Names, RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigateway
from aws_cdk import aws_apigatewayv2 as apigwv2
from aws_cdk import aws_apigatewayv2_authorizers as authorizers
from aws_cdk import aws_apigatewayv2_integrations as integrations
from aws_cdk import aws_certificatemanager as acm
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from streamfleet import model
from streamfleet.env import ConfigError
from streamfleet.wsapi import authorizer as authorizer_runtime
from streamfleet.wsapi import handlers as handlers_runtime
from streamfleet.wsapi import jwt as jwt_runtime
from streamfleet_cdk import at_rest
from streamfleet_cdk.functions import (
    ALARM_PERIOD,
    DEFAULT_LOG_LEVEL,
    INVOKED_SYNCHRONOUSLY,
    check_log_level,
    check_reserved_concurrency,
    function_alarms,
    python_function,
)
from streamfleet_cdk.live_delivery import LiveDeliveryTables
from streamfleet_cdk.nag import acknowledge, nag_text
from streamfleet_cdk.tables import TABLE_READ_ACTIONS

HANDLER_ENTRY = f"{handlers_runtime.handler.__module__}.{handlers_runtime.handler.__name__}"
# PyJWT verifies; its RS256/ES256 algorithms need cryptography (PyJWT's "crypto" extra, which
# the bundler does not follow, hence named here).
AUTHORIZER_DISTRIBUTIONS = ("PyJWT", "cryptography")
AUTHORIZER_ENTRY = f"{authorizer_runtime.handler.__module__}.{authorizer_runtime.handler.__name__}"

CONNECT = handlers_runtime.CONNECT
DISCONNECT = handlers_runtime.DISCONNECT
DEFAULT = handlers_runtime.DEFAULT
AUTHORIZER_ID = "Authorizer"
API_NAME_MAX_CHARS = 128
ROUTE_SELECTION_EXPRESSION = f"$request.body.{model.WS_ROUTE_SELECTION_FIELD}"

MAX_INTEGRATION_TIMEOUT_SECONDS = model.WS_INTEGRATION_TIMEOUT_SECONDS

# Exactly the calls streamfleet.wsapi.handlers makes (post_to_connection is a POST on
# @connections; nothing reads or deletes connections through the Management API). The state
# table's items are versioned by UpdateItem; an extension grants what its own routes call.
HANDLER_ACTIONS = {
    "state_table": ("dynamodb:GetItem", "dynamodb:UpdateItem"),
    "connections_table": ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:DeleteItem"),
    "connections": ("execute-api:ManageConnections",),
    "log_group": ("logs:CreateLogStream", "logs:PutLogEvents"),
}
# The authorizer calls no AWS API (a JWKS URL is fetched over plain HTTPS).
AUTHORIZER_ACTIONS = {"log_group": ("logs:CreateLogStream", "logs:PutLogEvents")}
MANAGEMENT_METHOD = "POST"

# Access log fields; WebSocket context variables only. No query string: it may hold a token.
ACCESS_LOG_FIELDS = {
    "requestId": "$context.requestId",
    "extendedRequestId": "$context.extendedRequestId",
    "requestTime": "$context.requestTime",
    "ip": "$context.identity.sourceIp",
    "userAgent": "$context.identity.userAgent",
    "eventType": "$context.eventType",
    "routeKey": "$context.routeKey",
    "status": "$context.status",
    "connectionId": "$context.connectionId",
    "messageId": "$context.messageId",
    "principalId": "$context.authorizer.principalId",
    "authorizerError": "$context.authorizer.error",
    "error": "$context.error.message",
    "integrationError": "$context.integration.error",
    "integrationStatus": "$context.integration.status",
    "integrationLatency": "$context.integration.latency",
}


@dataclass(frozen=True, kw_only=True)
class JwtSettings:
    """Which tokens the authorizer accepts (its ``JWT_*`` environment).

    Validated with the authorizer's own configuration class, so settings the authorizer would
    refuse at its first invocation fail the synth instead.

    Attributes:
        issuer: the exact ``iss`` to accept.
        audience: the ``aud`` to accept.
        jwks_url: the issuer's JWKS document (https); its keys are cached by the authorizer.
        keys: or the public keys themselves (a JWKS document, one JWK or a PEM public key;
            never a shared secret).
        leeway_seconds: clock skew allowed on ``exp``/``nbf`` (``None``: the runtime default).
        canary_keys: the canary's public key(s) (``JWT_CANARY_KEYS``: a JWKS document, one JWK
            or a PEM public key), the only keys that verify a canary token, which the handlers
            confine to ``heartbeat``. Public keys only: the environment is readable by whoever
            can read the stack. ``None``: the authorizer accepts no canary token.
        reader_claims: claims whose values the authorizer passes on as reader tags
            (``JWT_READER_CLAIMS``; ``groups`` makes ``groups:ops`` a reader a START may name).
    """

    issuer: str
    audience: str
    jwks_url: str | None = None
    keys: str | None = None
    leeway_seconds: float | None = None
    canary_keys: str | None = None
    reader_claims: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.reader_claims, str):
            raise ValueError("jwt: reader_claims: expected a tuple of claim names, got a string")
        try:
            authorizer_runtime.AuthorizerConfig.from_env(self.environment())
        except ConfigError as exc:
            raise ValueError(f"jwt: {exc}") from None
        if self.jwks_url is not None and urlsplit(self.jwks_url).scheme != "https":
            raise ValueError("jwt: JWT_JWKS_URL: must be an https URL in a deployment")
        # Public keys only, in JWT_KEYS too (the authorizer also takes a shared secret there,
        # for local use): the environment is readable by whoever can read the stack.
        if self.keys is not None:
            check_public_keys(f"jwt: {model.ENV_JWT_KEYS}", self.keys)
        if self.canary_keys is not None:
            check_public_keys(f"jwt: {model.ENV_JWT_CANARY_KEYS}", self.canary_keys)

    def environment(self) -> dict[str, str]:
        """The authorizer's environment (what ``AuthorizerConfig.from_env`` reads)."""
        env = {"JWT_ISSUER": self.issuer, "JWT_AUDIENCE": self.audience}
        if self.jwks_url is not None:
            env["JWT_JWKS_URL"] = self.jwks_url
        if self.keys is not None:
            env["JWT_KEYS"] = self.keys
        if self.leeway_seconds is not None:
            env["JWT_LEEWAY_SECONDS"] = f"{self.leeway_seconds:g}"
        if self.canary_keys is not None:
            env[model.ENV_JWT_CANARY_KEYS] = self.canary_keys
        if self.reader_claims:
            env[model.ENV_JWT_READER_CLAIMS] = ",".join(self.reader_claims)
        return env


def check_public_keys(field: str, text: object) -> str:
    """Asymmetric public keys the authorizer can parse; ``ValueError`` naming ``field``."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{field}: expected a JWKS document, a JWK or a PEM public key")
    try:
        jwt_runtime.parse_key_material(text, allow_symmetric=False)
    except jwt_runtime.KeyMaterialError as exc:
        raise ValueError(
            f"{field}: {exc} (public keys only: a shared secret in the stack's environment "
            "would be readable by anyone who can read the stack)"
        ) from None
    return text


@dataclass(frozen=True, kw_only=True)
class CustomDomain:
    """An API Gateway custom domain for the API, in this Region.

    Attributes:
        domain_name: the client-facing name (the same in every Region: the failover name).
        certificate: an ACM certificate for it *in this Region* (regional endpoints use the
            Region's own certificate).
    """

    domain_name: str
    certificate: acm.ICertificate

    def __post_init__(self) -> None:
        if not isinstance(self.domain_name, str) or not self.domain_name.strip("."):
            raise ValueError(f"domain_name: expected a DNS name, got {self.domain_name!r}")
        if getattr(self.certificate, "certificate_arn", None) is None:
            raise ValueError(
                "certificate: expected an ACM certificate in this Region "
                f"(acm.Certificate.from_certificate_arn(...)), got {self.certificate!r}"
            )


@dataclass(frozen=True, kw_only=True)
class HandlerExtension:
    """Routes a deployment adds to the WebSocket handler (their runtime side is a
    :class:`~streamfleet.wsapi.handlers.extensions.RouteExtension`, installed by the entry
    module).

    Attributes:
        entry: the handler's Lambda entry point, ``module.function``: a module that builds the
            handler with :func:`streamfleet.wsapi.handlers.make_handler` and the extension.
        packages: the top-level packages besides ``streamfleet`` that the entry module is in
            or imports, by name -> directory; the handler's asset carries, of each, the
            modules the entry imports (:func:`~streamfleet_cdk.assets.bundle_files`).
        routes: the route keys it adds (API Gateway routes to the handler, as for the core's).
        environment: variables it adds to the handler's environment.
        grant: called once with the :class:`WebSocketApi`, after the core's permissions and
            before live delivery's: adds the statements its routes need to
            :attr:`WebSocketApi.handler_role` (``None``: none).
    """

    entry: str
    packages: Mapping[str, Path] = field(default_factory=dict)
    routes: tuple[str, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)
    grant: Callable[[WebSocketApi], None] | None = None

    def __post_init__(self) -> None:
        module, _, function = self.entry.rpartition(".")
        if not module or not function.isidentifier():
            raise ValueError(
                f"handler_extension: entry: expected module.function, got {self.entry!r}"
            )
        if isinstance(self.routes, str):
            raise ValueError("handler_extension: routes: expected a tuple of route keys")
        taken = (*model.WS_ROUTES, CONNECT, DISCONNECT, DEFAULT)
        for route in self.routes:
            if route in taken or route.startswith("$") or not route:
                raise ValueError(f"handler_extension: routes: {route!r} is a core route")
        if len(set(self.routes)) != len(self.routes):
            raise ValueError("handler_extension: routes: a route appears twice")
        core = set(model.HANDLERS_ENV) | {"AWS_REGION"}
        for name in self.environment:
            if name in core:
                raise ValueError(f"handler_extension: environment: {name} is the core's")


@dataclass(frozen=True, kw_only=True)
class WebSocketApiProps:
    """How :class:`WebSocketApi` is built.

    Attributes:
        state_table: the user state (global table, or its local replica): ``SUBS#`` items,
            and those of the routes an extension adds.
        connections_table: this Region's connection records (``WSCONN#``), with a TTL.
        jwt: the tokens the ``$connect`` authorizer accepts.
        custom_domain: a custom domain mapped to the stage (``None``: the regional URL only).
        stage_name: the stage, the first path segment of the regional URL; ``v1`` by default.
        throttling_rate_limit: stage-wide steady-state messages (and connects) per second; 500
            by default.
        throttling_burst_limit: stage-wide burst; 1000 by default.
        identity_source: identity sources API Gateway requires before it invokes the
            authorizer. Empty by default, on purpose: the authorizer reads the token from the
            ``token`` query parameter *or* a ``bearer.<jwt>`` entry of ``Sec-WebSocket-
            Protocol``, and API Gateway requires *every* listed source, so naming one would
            refuse clients that use the other. The authorizer answers 401 itself when there is
            no token. A deployment whose clients all use one transport may name it here
            (``route.request.querystring.token`` or ``route.request.header.Sec-WebSocket-
            Protocol``) to refuse token-less handshakes without an invocation.
        connection_ttl_seconds: TTL of a connection record (``None``: the handler's default,
            API Gateway's two-hour limit plus a margin).
        handler_memory_mib: the handler's memory; 256 MiB by default.
        handler_timeout: the handler's timeout; at most 29 s (API Gateway's limit), 10 s by
            default.
        reserved_concurrency: concurrency reserved for (and the cap of) the handler
            (``None``: unreserved).
        authorizer_reserved_concurrency: concurrency reserved for (and the cap of) the
            authorizer, which runs on every ``$connect``, token or not: a connection flood is
            refused at this cap instead of taking the account's concurrency from every other
            function (``None``: unreserved).
        log_level: application log level of both functions (JSON logs); ``INFO`` by default.
        log_retention: retention of the Lambdas' logs and the access logs; one month by
            default.
        log_removal_policy: what happens to those three log groups when they leave the stack
            or the stack is deleted; ``RemovalPolicy.RETAIN`` by default (CloudWatch Logs keeps
            them, for ``log_retention``).
        live: where ``subscribe`` reads and writes (live delivery of the fleet's streams,
            :class:`~streamfleet_cdk.live_delivery.LiveDeliveryTables`); ``None``: subscribe
            answers ``not_supported``.
        handler_extension: routes the deployment adds to the handler
            (:class:`HandlerExtension`); ``None``: the core routes only.
    """

    state_table: dynamodb.ITableV2
    connections_table: dynamodb.ITableV2
    jwt: JwtSettings
    custom_domain: CustomDomain | None = None
    stage_name: str = "v1"
    throttling_rate_limit: float = 500.0
    throttling_burst_limit: int = 1000
    identity_source: tuple[str, ...] = ()
    connection_ttl_seconds: int | None = None
    handler_memory_mib: int = 256
    handler_timeout: Duration = field(
        default_factory=lambda: Duration.seconds(model.WS_HANDLER_TIMEOUT_SECONDS)
    )
    reserved_concurrency: int | None = None
    authorizer_reserved_concurrency: int | None = None
    log_level: str = DEFAULT_LOG_LEVEL
    log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH
    log_removal_policy: RemovalPolicy = RemovalPolicy.RETAIN
    live: LiveDeliveryTables | None = None
    handler_extension: HandlerExtension | None = None

    def __post_init__(self) -> None:
        if not self.stage_name or not self.stage_name.replace("_", "").isalnum():
            raise ValueError(f"stage_name: letters, digits and _ only, got {self.stage_name!r}")
        if not self.throttling_rate_limit > 0:
            raise ValueError("throttling_rate_limit: must be greater than zero")
        _check_whole("throttling_burst_limit", self.throttling_burst_limit, minimum=1)
        if isinstance(self.identity_source, str):
            raise ValueError("identity_source: expected a tuple of strings, got a string")
        for source in self.identity_source:
            if not source.startswith(("route.request.", "stageVariables.", "context.")):
                raise ValueError(f"identity_source: {source!r} is not a WebSocket identity source")
        if self.connection_ttl_seconds is not None:
            _check_whole("connection_ttl_seconds", self.connection_ttl_seconds, minimum=1)
        _check_whole("handler_memory_mib", self.handler_memory_mib, minimum=128, maximum=10240)
        timeout = self.handler_timeout.to_seconds()
        if not 1 <= timeout <= MAX_INTEGRATION_TIMEOUT_SECONDS:
            raise ValueError(
                f"handler_timeout: {timeout} s is outside 1-{MAX_INTEGRATION_TIMEOUT_SECONDS} s "
                "(API Gateway stops waiting after 29 s)"
            )
        check_reserved_concurrency("reserved_concurrency", self.reserved_concurrency)
        check_reserved_concurrency(
            "authorizer_reserved_concurrency", self.authorizer_reserved_concurrency
        )
        check_log_level("log_level", self.log_level)
        at_rest.check_removal_policy("log_removal_policy", self.log_removal_policy)


def _check_whole(name: str, value: object, *, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected a whole number, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f"at least {minimum}" if maximum is None else f"{minimum}-{maximum}"
        raise ValueError(f"{name}: expected {bounds}, got {value}")


# --- Tables ---


@dataclass(frozen=True, kw_only=True)
class WebSocketTablesProps:
    """How :class:`WebSocketTables` declares (or references) the API's two tables.

    Attributes:
        declare_state_table: declare the state table here, as a global table with replicas in
            ``replica_regions`` (the primary Region's stack; the default); ``False`` references
            the local replica by name instead (every other Region).
        replica_regions: Regions that get a replica of the state table; none by default.
        deletion_protection: DynamoDB deletion protection on the state table and its replicas;
            on by default.
        state_table_name: physical name of the state table, shared by every Region; ``None``
            lets CloudFormation generate one, so two sets in one account never claim the same
            table. Required where ``declare_state_table`` is off: the other Regions find the
            replica by name (CloudFormation has no cross-Region reference).
        connections_table_name: physical name of each Region's connections table; ``None``:
            generated.
        subscriptions_table_name: physical name of each Region's subscriptions table (which
            connection of this Region receives which ingested stream); ``None``: generated.
        removal_policy: what happens to the declared state table (and its replicas) when it
            leaves the stack or the stack is deleted; ``RemovalPolicy.RETAIN`` (the default)
            keeps the users' state. The connections and subscriptions tables are always
            removed with the stack: reconnecting clients rebuild their items.
    """

    declare_state_table: bool = True
    replica_regions: tuple[str, ...] = ()
    deletion_protection: bool = True
    state_table_name: str | None = None
    connections_table_name: str | None = None
    subscriptions_table_name: str | None = None
    removal_policy: RemovalPolicy = RemovalPolicy.RETAIN

    def __post_init__(self) -> None:
        if isinstance(self.replica_regions, str):
            raise ValueError("replica_regions: expected a tuple of Region names, got a string")
        at_rest.check_removal_policy("removal_policy", self.removal_policy)
        if self.replica_regions and not self.declare_state_table:
            raise ValueError("replica_regions: only the stack that declares the table has them")
        if not self.declare_state_table and not self.state_table_name:
            raise ValueError(
                "state_table_name: required where the state table is referenced, not declared"
            )
        named = self.state_table_name, self.connections_table_name
        if self.connections_table_name is not None and named[0] == named[1]:
            raise ValueError("connections_table_name: must differ from state_table_name")
        if self.subscriptions_table_name is not None and self.subscriptions_table_name in named:
            raise ValueError("subscriptions_table_name: must differ from the other two tables")


class WebSocketTables(Construct):
    """The state table (global) and this Region's connections table, from the data model.

    * The **state table** (:data:`streamfleet.model.WSAPI_STATE_TABLE`) is what survives a
      failover: a global table declared once, in the primary Region's stack, replicated to the
      others, retained, with point-in-time recovery. Other Regions reference their replica by
      name (declaring it again would make CloudFormation create a second table of that name).
    * The **connections table** (:data:`streamfleet.model.WSAPI_CONNECTIONS_TABLE`) is per
      Region and never replicated: a connection id means nothing to another Region's API
      Gateway. Every Region declares its own, with the model's TTL attribute. Its items are
      rebuilt by reconnecting clients (and the canary's streaks within minutes), so it is
      removed with the stack and not deletion-protected.
    * The **subscriptions table** (:data:`streamfleet.model.WSAPI_SUBSCRIPTIONS_TABLE`) is per
      Region too, for the same reason: ``STREAM#<stream>`` / ``<connection id>``, one item per
      connection that receives a stream live, read by the fan-out with a consistent query on
      the base table (no index: an index could lag and miss a subscriber), with a TTL. Its
      items are rebuilt by every reconnecting client.

    Attributes:
        state_table: the state table (declared here, or the local replica).
        connections_table: this Region's connections table.
        subscriptions_table: this Region's subscriptions table.
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: WebSocketTablesProps) -> None:
        super().__init__(scope, construct_id)
        self._props = props
        self.state_table: dynamodb.ITableV2 = self._build_state_table()
        self.connections_table: dynamodb.TableV2 = self._build_connections_table()
        self.subscriptions_table: dynamodb.TableV2 = self._build_subscriptions_table()

    def grant_read(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` read the three tables (``GetItem``, ``BatchGetItem``, ``Query``,
        ``Scan``): an operator's or an analytics job's view of users' state, connections and
        subscriptions. No write."""
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=list(TABLE_READ_ACTIONS),
            resource_arns=[
                table.table_arn
                for table in (self.state_table, self.connections_table, self.subscriptions_table)
            ],
        )

    @staticmethod
    def _partition_key(spec: model.TableSpec) -> dynamodb.Attribute:
        if spec.sort_key or spec.indexes:
            raise ValueError(f"{spec.default_name}: the model now has a sort key or indexes")
        return dynamodb.Attribute(name=spec.partition_key, type=dynamodb.AttributeType.STRING)

    def _build_state_table(self) -> dynamodb.ITableV2:
        props = self._props
        spec = model.WSAPI_STATE_TABLE
        if not props.declare_state_table:
            return dynamodb.TableV2.from_table_name(
                self,
                "StateTable",
                props.state_table_name,  # type: ignore[arg-type]
            )
        return dynamodb.TableV2(
            self,
            "StateTable",
            table_name=props.state_table_name,
            partition_key=self._partition_key(spec),
            billing=dynamodb.Billing.on_demand(),
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            deletion_protection=props.deletion_protection,
            replicas=[dynamodb.ReplicaTableProps(region=r) for r in props.replica_regions],
            removal_policy=props.removal_policy,
        )

    def _build_connections_table(self) -> dynamodb.TableV2:
        spec = model.WSAPI_CONNECTIONS_TABLE
        return dynamodb.TableV2(
            self,
            "ConnectionsTable",
            table_name=self._props.connections_table_name,
            partition_key=self._partition_key(spec),
            billing=dynamodb.Billing.on_demand(),
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute=spec.ttl_attribute,
            deletion_protection=False,
            removal_policy=RemovalPolicy.DESTROY,
        )

    def _build_subscriptions_table(self) -> dynamodb.TableV2:
        spec = model.WSAPI_SUBSCRIPTIONS_TABLE
        if spec.indexes or spec.sort_key is None or spec.sort_key_type != "S":
            raise ValueError(f"{spec.default_name}: the model's key schema changed")
        return dynamodb.TableV2(
            self,
            "SubscriptionsTable",
            table_name=self._props.subscriptions_table_name,
            partition_key=dynamodb.Attribute(
                name=spec.partition_key, type=dynamodb.AttributeType.STRING
            ),
            sort_key=dynamodb.Attribute(name=spec.sort_key, type=dynamodb.AttributeType.STRING),
            billing=dynamodb.Billing.on_demand(),
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute=spec.ttl_attribute,
            deletion_protection=False,
            removal_policy=RemovalPolicy.DESTROY,
        )


# --- API ---


@jsii.implements(apigwv2.IAccessLogSettings)
class _AccessLogSettings:
    """The stage's access-log destination and JSON format (CDK takes an interface here)."""

    def __init__(self, log_group: logs.ILogGroup) -> None:
        self._destination = apigwv2.LogGroupLogDestination(log_group)
        self._format = apigateway.AccessLogFormat.custom(
            json.dumps(ACCESS_LOG_FIELDS, separators=(",", ":"))
        )

    @property
    def destination(self) -> apigwv2.IAccessLogDestination:
        return self._destination

    @property
    def format(self) -> apigateway.AccessLogFormat:
        return self._format


class WebSocketApi(Construct):
    """One Region's WebSocket API: routes, stage, handler, authorizer, optional custom domain.

    Least privilege is written out: the handler's role may ``GetItem``/``UpdateItem`` the state
    table, ``GetItem``/``PutItem``/``DeleteItem`` the connections table (no index, no ``Scan``,
    no ``Query``), ``execute-api:ManageConnections`` on this API's own stage
    (``POST @connections/*``: replies only) and write its log group, plus what a
    :class:`HandlerExtension` grants for its own routes. The authorizer's role may only write
    its log group.

    Access logs, like the REST API's, are delivered through the Region's API Gateway
    CloudWatch role (:class:`~streamfleet_cdk.api_gateway_account.ApiGatewayAccount`, declared
    by the fleet stack of the same Region, or by the account's baseline).

    Attributes:
        api: the WebSocket API (route selection ``$request.body.action``).
        stage: the auto-deployed, throttled and access-logged stage.
        routes: every route by key (``$connect``, ``$disconnect``, ``$default``,
            :data:`streamfleet.model.WS_ROUTES` and the extension's).
        authorizer: the ``$connect`` REQUEST authorizer.
        handler: the Lambda serving every route.
        handler_role: its execution role.
        state_table: the state table it reads and writes (:attr:`WebSocketApiProps.state_table`).
        handler_log_group: its log group.
        authorizer_function: the authorizer Lambda.
        authorizer_role: its execution role.
        authorizer_log_group: its log group.
        alarms: the functions' errors and throttles alarms (the authorizer's errors alarm does
            not count a connect without a token: see :meth:`metric_missing_token`).
        access_log_group: the stage's access logs.
        domain_name: the custom domain (``None`` without one).
        api_mapping: the custom domain's mapping to the stage (``None`` without one).
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: WebSocketApiProps) -> None:
        super().__init__(scope, construct_id)
        self._props = props
        self.state_table = props.state_table
        self.handler_log_group = self._build_log_group("HandlerLogs")
        self.authorizer_log_group = self._build_log_group("AuthorizerLogs")
        self.access_log_group = self._build_log_group("AccessLogs")
        self.handler_role = self._build_role(
            "HandlerRole", "StreamFleet WebSocket API: routes, user state and replies"
        )
        self.authorizer_role = self._build_role(
            "AuthorizerRole", "StreamFleet WebSocket API: $connect token verification"
        )
        self.handler = self._build_handler()
        self.authorizer_function = self._build_authorizer_function()
        self.authorizer = authorizers.WebSocketLambdaAuthorizer(
            AUTHORIZER_ID,
            self.authorizer_function,
            identity_source=list(props.identity_source),
        )
        self.api = self._build_api()
        self.routes = self._build_routes()
        self.stage = self._build_stage()
        self._grant_handler()
        self._grant_authorizer()
        self.domain_name, self.api_mapping = self._build_custom_domain()
        self.alarms = (
            *function_alarms(self, self.handler, what="the WebSocket handler"),
            *function_alarms(
                self,
                self.authorizer_function,
                what="the WebSocket authorizer",
                expected_errors=self.metric_missing_token(),
            ),
        )
        self._acknowledge_findings()

    def metric_missing_token(self, *, period: Duration = ALARM_PERIOD) -> cloudwatch.Metric:
        """Connects refused with 401 because they carried no token (the authorizer's own EMF
        count; Lambda counts each one as an error of the authorizer, too)."""
        return cloudwatch.Metric(
            namespace=model.METRIC_NAMESPACE,
            metric_name=model.METRIC_AUTHORIZER_MISSING_TOKEN,
            dimensions_map={
                model.METRIC_DIMENSION_FUNCTION: self.authorizer_function.function_name
            },
            statistic="Sum",
            period=period,
        )

    def grant_post_to_connections(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` (a team's own backend) post to this stage's clients: the Management
        API's ``POST @connections/*`` on this API and stage only, nothing else of it."""
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=list(HANDLER_ACTIONS["connections"]),
            resource_arns=[self.management_connections_arn],
        )

    @property
    def management_connections_arn(self) -> str:
        """``execute-api`` ARN of this stage's ``POST @connections/*`` (the replies)."""
        return Stack.of(self).format_arn(
            service="execute-api",
            resource=self.api.api_id,
            resource_name=f"{self.stage.stage_name}/{MANAGEMENT_METHOD}/@connections/*",
        )

    # --- Lambdas ---

    def _build_log_group(self, construct_id: str) -> logs.LogGroup:
        return at_rest.log_group(
            self,
            construct_id,
            retention=self._props.log_retention,
            removal_policy=self._props.log_removal_policy,
        )

    def _build_role(self, construct_id: str, description: str) -> iam.Role:
        return iam.Role(
            self,
            construct_id,
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=description,
        )

    def _build_handler(self) -> lambda_.Function:
        props = self._props
        environment = {
            model.ENV_STATE_TABLE_NAME: props.state_table.table_name,
            model.ENV_CONNECTIONS_TABLE_NAME: props.connections_table.table_name,
        }
        if props.connection_ttl_seconds is not None:
            environment["CONNECTION_TTL_SECONDS"] = str(props.connection_ttl_seconds)
        if props.live is not None:
            environment.update(props.live.environment())
        extension = props.handler_extension
        if extension is not None:
            environment.update(extension.environment)
        return python_function(
            self,
            "Handler",
            description="StreamFleet WebSocket API: $connect, $disconnect, messages",
            handler=HANDLER_ENTRY if extension is None else extension.entry,
            packages=None if extension is None else extension.packages,
            role=self.handler_role,
            log_group=self.handler_log_group,
            memory_size=props.handler_memory_mib,
            timeout=props.handler_timeout,
            reserved_concurrency=props.reserved_concurrency,
            log_level=props.log_level,
            environment=environment,
            no_dead_letter_queue=INVOKED_SYNCHRONOUSLY,
        )

    def _build_authorizer_function(self) -> lambda_.Function:
        props = self._props
        return python_function(
            self,
            "AuthorizerFunction",
            description="StreamFleet WebSocket API: $connect JWT authorizer",
            handler=AUTHORIZER_ENTRY,
            distributions=AUTHORIZER_DISTRIBUTIONS,
            role=self.authorizer_role,
            log_group=self.authorizer_log_group,
            timeout=Duration.seconds(model.WS_AUTHORIZER_TIMEOUT_SECONDS),
            reserved_concurrency=props.authorizer_reserved_concurrency,
            log_level=props.log_level,
            environment=props.jwt.environment(),
            no_dead_letter_queue=INVOKED_SYNCHRONOUSLY,
        )

    # --- API ---

    def _api_name(self) -> str:
        """The stack's name and this construct's path in it: readable, and unique in the app
        (two APIs of one stack, under different parents, share an id but not a path)."""
        stack = Stack.of(self)
        scopes = self.node.scopes
        below = [scope.node.id for scope in scopes[scopes.index(stack) + 1 :]]
        name = "-".join((stack.stack_name, *below))
        if len(name) > API_NAME_MAX_CHARS:
            return Names.unique_resource_name(self, max_length=API_NAME_MAX_CHARS, separator="-")
        return name

    def _build_api(self) -> apigwv2.WebSocketApi:
        self._integration = integrations.WebSocketLambdaIntegration("Handler", self.handler)
        return apigwv2.WebSocketApi(
            self,
            "Api",
            api_name=self._api_name(),
            description="StreamFleet: client-facing WebSocket API",
            route_selection_expression=ROUTE_SELECTION_EXPRESSION,
            connect_route_options=apigwv2.WebSocketRouteOptions(
                integration=self._integration, authorizer=self.authorizer
            ),
            disconnect_route_options=apigwv2.WebSocketRouteOptions(integration=self._integration),
            default_route_options=apigwv2.WebSocketRouteOptions(integration=self._integration),
        )

    def _build_routes(self) -> dict[str, apigwv2.WebSocketRoute]:
        routes: dict[str, apigwv2.WebSocketRoute] = {}
        for key in (CONNECT, DISCONNECT, DEFAULT):
            routes[key] = self.api.node.find_child(f"{key}-Route")
        extension = self._props.handler_extension
        for key in (*model.WS_ROUTES, *(extension.routes if extension else ())):
            routes[key] = self.api.add_route(key, integration=self._integration)
        self._omit_empty_identity_source()
        return routes

    def _omit_empty_identity_source(self) -> None:
        """No identity source is the property left out; CDK would render an empty list."""
        if not self._props.identity_source:
            # The authorizer's resource is created under the API, with the authorizer's id.
            authorizer = self.api.node.find_child(AUTHORIZER_ID)
            authorizer.node.default_child.add_property_deletion_override("IdentitySource")

    def _build_stage(self) -> apigwv2.WebSocketStage:
        props = self._props
        return apigwv2.WebSocketStage(
            self,
            "Stage",
            web_socket_api=self.api,
            stage_name=props.stage_name,
            auto_deploy=True,
            description="StreamFleet WebSocket API stage",
            throttle=apigwv2.ThrottleSettings(
                rate_limit=props.throttling_rate_limit,
                burst_limit=props.throttling_burst_limit,
            ),
            access_log_settings=_AccessLogSettings(self.access_log_group),
        )

    def _build_custom_domain(self) -> tuple[apigwv2.DomainName | None, apigwv2.ApiMapping | None]:
        custom = self._props.custom_domain
        if custom is None:
            return None, None
        domain = apigwv2.DomainName(
            self,
            "DomainName",
            domain_name=custom.domain_name,
            certificate=custom.certificate,
            endpoint_type=apigwv2.EndpointType.REGIONAL,
            security_policy=apigwv2.SecurityPolicy.TLS_1_2,
        )
        mapping = apigwv2.ApiMapping(
            self, "ApiMapping", api=self.api, domain_name=domain, stage=self.stage
        )
        return domain, mapping

    # --- Permissions ---

    def _grant_handler(self) -> None:
        """Exactly :data:`HANDLER_ACTIONS` (no managed policy, no grant helper), then what the
        extension's routes need, then live delivery's."""
        props = self._props
        resources = {
            "state_table": props.state_table.table_arn,
            "connections_table": props.connections_table.table_arn,
            "connections": self.management_connections_arn,
            "log_group": self.handler_log_group.log_group_arn,
        }
        for name, actions in HANDLER_ACTIONS.items():
            self.handler_role.add_to_policy(
                iam.PolicyStatement(actions=list(actions), resources=[resources[name]])
            )
        extension = props.handler_extension
        if extension is not None and extension.grant is not None:
            extension.grant(self)
        if props.live is not None:
            props.live.grant_subscribe(self.handler_role)

    def _grant_authorizer(self) -> None:
        resources = {"log_group": self.authorizer_log_group.log_group_arn}
        for name, actions in AUTHORIZER_ACTIONS.items():
            self.authorizer_role.add_to_policy(
                iam.PolicyStatement(actions=list(actions), resources=[resources[name]])
            )

    # --- cdk-nag ---

    def _acknowledge_findings(self) -> None:
        """Each acknowledgment says why the finding does not apply to this API."""
        for key, route in self.routes.items():
            if key != CONNECT:
                acknowledge(
                    route,
                    "APIG4",
                    "WebSocket APIs authorize once, on $connect (API Gateway accepts an "
                    "authorizer on no other route); every later message travels on that "
                    "authorized connection, and the handler reads the verified user from the "
                    "authorizer context.",
                )
        acknowledge(
            self.handler_role,
            f"IAM5[Resource::{nag_text(Stack.of(self), self.management_connections_arn)}]",
            "execute-api:ManageConnections is scoped to this API's stage and to POST "
            "@connections/* (replies); connection ids are created per client at run time, so "
            "they cannot be listed in the policy.",
        )
