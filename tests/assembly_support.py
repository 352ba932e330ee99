"""What the assembly-driven tests share: the synthesized app, its resources on local servers, its
Lambda functions running from their assets, tokens the authorizer accepts, and the checks.

The tests here never import the runtime from the repository to run it: every function runs from its
asset directory in a clean interpreter (:mod:`streamfleet_dev.emulator.lambda_runner`), every worker
from the task definition's command and environment (:mod:`streamfleet_dev.emulator.container`),
against tables and queues created from the templates (:mod:`streamfleet_dev.local.resources`),
through the recording proxy (:mod:`streamfleet_dev.emulator.aws_proxy`) with one access key id per
component.

The app is synthesized once per session with the context a real deployment of the canary needs
(a signing-key secret) and short lease timings (the worker is driven through crash recovery in
seconds; the timings are passed to the app as context, so the task definition carries them).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import sysconfig
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from streamfleet_auction import names as auction_names
from streamfleet_dev.assembly import (
    LOCAL_ACCOUNT,
    CloudAssembly,
    FunctionSpec,
    Stack,
    load,
    synthesize,
)
from streamfleet_dev.emulator.aws_proxy import (
    DEFAULT_INDEX_LAG_SECONDS,
    DEFAULT_THROTTLE_RATE,
    AwsProxy,
)
from streamfleet_dev.emulator.lambda_runner import (
    RUNTIME_VARIABLES,
    LambdaProcess,
    LambdaSpec,
    host_twin,
    lambda_sdk_dir,
    native_mismatches,
    reads_by,
)
from streamfleet_dev.local.resources import LocalStack, create_local_stack
from streamfleet_dev.tables import create_table

SECRET_NAME = "streamfleet/canary-signing-key"


def _canary_key() -> ec.EllipticCurvePrivateKey:
    # Derived from a constant, so the public key in the context (and the cached synth) is the
    # same in every session; a test key, never used anywhere else.
    seed = int.from_bytes(hashlib.sha256(b"streamfleet test canary").digest(), "big")
    return ec.derive_private_key(seed % (2**255), ec.SECP256R1())


def _ec_jwk(key: ec.EllipticCurvePrivateKey, kid: str) -> dict[str, str]:
    numbers = key.public_key().public_numbers()
    return {
        "kty": "EC",
        "crv": "P-256",
        "alg": "ES256",
        "use": "sig",
        "kid": kid,
        "x": _b64(numbers.x.to_bytes(32, "big")),
        "y": _b64(numbers.y.to_bytes(32, "big")),
    }


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


CANARY_KEY = _canary_key()
CANARY_KEY_PEM = CANARY_KEY.private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
).decode()
DOMAIN = "ws.streamfleet-test.example.org"
ZONE_ID = "Z0STREAMFLEETTEST"
CERTIFICATES = {
    region: f"arn:aws:acm:{region}:123456789012:certificate/00000000-0000-4000-8000-00000000000{n}"
    for n, region in enumerate(("us-east-1", "us-west-2"), start=1)
}
# A deployment with everything the templates can name: a custom domain with failover records
# and the canary's signing key (the preflight checks read those from the assembly).
ARTIFACT_CONTEXT = {
    "ws_domain_name": DOMAIN,
    "hosted_zone_id": ZONE_ID,
    "hosted_zone_name": DOMAIN.split(".", 1)[1],
    "ws_certificate_arn_primary": CERTIFICATES["us-east-1"],
    "ws_certificate_arn_secondary": CERTIFICATES["us-west-2"],
    "canary_signing_key_secret_name": SECRET_NAME,
    "canary_public_keys": json.dumps({"keys": [_ec_jwk(CANARY_KEY, "canary-test")]}),
    "lease_seconds": 2,
    "heartbeat_seconds": 0.5,
    "reconcile_seconds": 1,
    "allowed_upstreams": ["ws://127.0.0.1"],
}
FLEET_STACKS = {"primary": "StreamFleet-Primary", "secondary": "StreamFleet-Secondary"}
WS_STACKS = {
    "primary": "StreamFleet-WebSocket-Primary",
    "secondary": "StreamFleet-WebSocket-Secondary",
}

# Variables a function may read although its template does not set them: each is optional
# with a default, or an alternative to one the template does set. A read of any other unset
# variable by the function's own code fails the artifact test, naming the function.
OPTIONAL_UNSET = {
    "streamfleet.event_router": {"MAX_BODY_BYTES": "optional bound on the body (4096)"},
    "streamfleet.wsapi.handlers": {
        "CONNECTION_TTL_SECONDS": "optional; defaults to the 2-hour connection limit + margin",
    },
    "streamfleet_auction.handler": {
        "CONNECTION_TTL_SECONDS": "optional; defaults to the 2-hour connection limit + margin",
    },
    "streamfleet.wsapi.authorizer": {
        "JWT_KEYS": "alternative to JWT_JWKS_URL (static keys, local use)",
        "JWT_LEEWAY_SECONDS": "optional (30 s)",
        "JWT_JWKS_CACHE_SECONDS": "optional (300 s)",
        "JWT_JWKS_MIN_REFRESH_SECONDS": "optional (30 s)",
        "JWT_JWKS_STALE_SECONDS": "optional (600 s)",
        "JWT_JWKS_TIMEOUT_SECONDS": "optional (2 s)",
        "JWT_ALGORITHMS": "optional (the runtime's allow-list)",
        "JWT_MAX_LIFETIME_SECONDS": "optional (1 day)",
        "JWT_TOKEN_USE": "optional (unset: a token that says what it is must be an access token)",
        "JWT_TYP": "optional (unset: as JWT_TOKEN_USE)",
        "JWT_AUTHORIZED_PARTIES": "optional (no azp restriction)",
        "JWT_CANARY_KEYS": "set only when the canary has a signing key",
        "JWT_READER_CLAIMS": "set only with the jwt_reader_claims context key (no reader tags)",
    },
    "streamfleet.wsapi.canary": {
        "CANARY_TOKEN": "alternative to the signing-key secret (a static token, local use)",
        "CANARY_SIGNING_KEY": "alternative to the signing-key secret (a key in the environment)",
        "CANARY_SUBJECT": "optional (canary)",
        "CANARY_DISCONNECT_WHEN_UNHEALTHY": "optional (true)",
        "JWT_CANARY_KEYS": "set only with canary_public_keys (unset: a refusal is a failed probe)",
    },
}
# Set by the local run although no template does: what a local stand-in needs, by name.
LOCAL_OVERRIDES = {
    "APIGW_MANAGEMENT_ENDPOINT": "the local gateway's Management API is on its own port",
    "CANARY_MANAGEMENT_ENDPOINT": "the same, for the canary's closes of client connections",
    "AWS_ENDPOINT_URL": "local servers, through the recording proxy",
}


@functools.cache
def artifact_assembly() -> CloudAssembly:
    """The real app, synthesized once (cached across sessions by a hash of its inputs)."""
    return load(synthesize(ARTIFACT_CONTEXT))


# --- Tokens -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SigningKey:
    """An RSA key: its PEM (what the canary's secret holds), its JWK, and RS256 tokens."""

    kid: str
    key: rsa.RSAPrivateKey

    @classmethod
    def generate(cls, kid: str) -> SigningKey:
        return cls(kid, rsa.generate_private_key(public_exponent=65537, key_size=2048))

    @property
    def pem(self) -> str:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()

    @property
    def public_pem(self) -> str:
        return (
            self.key.public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            .decode()
        )

    def jwk(self) -> dict[str, str]:
        numbers = self.key.public_key().public_numbers()

        def encode(value: int) -> str:
            return _b64(value.to_bytes((value.bit_length() + 7) // 8, "big"))

        return {
            "kty": "RSA",
            "kid": self.kid,
            "alg": "RS256",
            "use": "sig",
            "n": encode(numbers.n),
            "e": encode(numbers.e),
        }

    def token(self, claims: Mapping[str, Any]) -> str:
        header = {"alg": "RS256", "typ": "JWT", "kid": self.kid}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64(signature)}"


def user_token(key: SigningKey, *, issuer: str, audience: str, sub: str = "user-1") -> str:
    """An access token an identity provider would issue for ``sub``."""
    now = int(time.time())
    return key.token(
        {
            "iss": issuer,
            "aud": audience,
            "sub": sub,
            "iat": now,
            "nbf": now,
            "exp": now + 300,
            "token_use": "access",
            "client_id": audience,
        }
    )


class JwksServer:
    """The identity provider's JWKS URL, on loopback."""

    def __init__(self, keys: list[SigningKey]):
        document = json.dumps({"keys": [k.jwk() for k in keys]}).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(document)))
                self.end_headers()
                self.wfile.write(document)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/.well-known/jwks.json"

    def __enter__(self) -> JwksServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()


# --- The local world ----------------------------------------------------------------------------


def client(service: str, endpoint: str, region: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id="setup",
        aws_secret_access_key="setup",
    )


@dataclass
class Region:
    """One Region's two stacks on local servers."""

    role: str  # primary / secondary
    fleet: LocalStack
    websocket: LocalStack
    api_id: str  # the WebSocket API's local id (its Ref)

    @property
    def name(self) -> str:
        return self.fleet.stack.region


@dataclass
class World:
    """Everything the assembly's artifacts run against, in both Regions."""

    assembly: CloudAssembly
    moto: str
    dynalite: str
    proxy: AwsProxy
    regions: dict[str, Region]
    idp_key: SigningKey
    jwks: JwksServer
    tmp: Path
    sdk_dir: Path
    started: list[LambdaProcess] = field(default_factory=list)

    def stack(self, name: str) -> Stack:
        return self.assembly.stack(name)

    def start_function(
        self,
        local: LocalStack,
        function: FunctionSpec,
        *,
        access_key: str,
        values: Mapping[str, str] | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> LambdaProcess:
        """``function`` from its asset, its template environment made local, through the proxy."""
        bindings = local.bindings.with_values({self.jwks_template_url(function): self.jwks.url})
        bindings = bindings.with_values(values or {})
        environment = {
            name: str(_resolve(value, bindings)) for name, value in function.environment.items()
        }
        spec = LambdaSpec.for_function(
            function, environment, region=local.stack.region, credentials=(access_key, "local")
        )
        code_dir = host_twin(function.asset_dir) if native_mismatches(spec) else None
        process = LambdaProcess(
            spec,
            sdk_dir=self.sdk_dir,
            extra_env={"AWS_ENDPOINT_URL": self.proxy.endpoint, **(extra_env or {})},
            log_path=self.tmp / f"{spec.function_name}-{access_key}-{uuid.uuid4().hex[:6]}.log",
            code_dir=code_dir,
        )
        self.started.append(process)
        return process.start()

    def jwks_template_url(self, function: FunctionSpec) -> str:
        return str(function.environment.get("JWT_JWKS_URL", "\0no-jwks-url"))


def _resolve(value: Any, bindings: Any) -> Any:
    from streamfleet_dev.assembly import resolve

    return resolve(value, bindings)


def build_world(servers: Mapping[str, Any], tmp: Path) -> Iterator[World]:
    """Both Regions' stacks on moto and dynalite, behind one recording proxy."""
    assembly = artifact_assembly()
    moto, dynalite = servers["moto"].endpoint, servers["dynalite"].endpoint
    suffix = uuid.uuid4().hex[:8]
    # Indexes lag and requests are throttled as DynamoDB's and API Gateway's may be: the
    # artifacts must cope with a stale view and a refused call.
    proxy = AwsProxy(
        default_backend=moto,
        record_path=tmp / "aws-calls.jsonl",
        index_lag_seconds=DEFAULT_INDEX_LAG_SECONDS,
        throttle_rate=DEFAULT_THROTTLE_RATE,
    ).start()
    idp_key = SigningKey.generate("idp-1")
    regions: dict[str, Region] = {}
    shared_fleet: dict[str, str] = {}
    state_replicas: dict[str, tuple[Any, str]] = {}
    # The identity provider's keys only: the canary's public key reaches the authorizer through
    # the template (canary_public_keys in the context), as in a deployment.
    with JwksServer([idp_key]) as jwks:
        for role in ("primary", "secondary"):
            fleet_stack = assembly.stack(FLEET_STACKS[role])
            ws_stack = assembly.stack(WS_STACKS[role])
            region = fleet_stack.region
            # DynamoDB: the fleet's tables on dynalite (it serialises conditional writes; one
            # table for every Region, like a global table), the WebSocket API's on moto.
            fleet = create_local_stack(
                fleet_stack,
                suffix=suffix,
                dynamodb_for=lambda _d, region=region: client("dynamodb", dynalite, region),
                sqs=client("sqs", moto, region),
                account=LOCAL_ACCOUNT,
                shared_tables=shared_fleet,
            )
            for created in fleet.tables.values():
                proxy.route_table(created.name, dynalite)
                shared_fleet[created.definition.table_name or created.name] = created.name
            ws_dynamodb = client("dynamodb", moto, region)
            # The fleet's tables, which live delivery reads by name (streams and messages).
            shared_ws = dict(shared_fleet)
            for template_name, (definition, name) in state_replicas.items():
                create_table(ws_dynamodb, definition, name)  # the replica in this Region
                shared_ws[template_name] = name
            api_id = f"local{uuid.uuid4().hex[:5]}"
            apis = {api.logical_id: api_id for api in ws_stack.websocket_apis()}
            websocket = create_local_stack(
                ws_stack,
                suffix=suffix,
                dynamodb_for=lambda _d, ws_dynamodb=ws_dynamodb: ws_dynamodb,
                sqs=client("sqs", moto, region),
                account=LOCAL_ACCOUNT,
                refs=apis,
                shared_tables=shared_ws,
            )
            for created in websocket.tables.values():
                if (
                    created.definition.replica_regions
                    and len(created.definition.replica_regions) > 1
                ):
                    state_replicas[created.definition.table_name or created.name] = (
                        created.definition,
                        created.name,
                    )
            regions[role] = Region(role, fleet, websocket, api_id)
            secrets = client("secretsmanager", moto, region)
            try:
                secrets.create_secret(Name=SECRET_NAME, SecretString=CANARY_KEY_PEM)
            except secrets.exceptions.ResourceExistsException:
                secrets.put_secret_value(SecretId=SECRET_NAME, SecretString=CANARY_KEY_PEM)
        world = World(
            assembly=assembly,
            moto=moto,
            dynalite=dynalite,
            proxy=proxy,
            regions=regions,
            idp_key=idp_key,
            jwks=jwks,
            tmp=tmp,
            sdk_dir=lambda_sdk_dir(),
        )
        try:
            yield world
        finally:
            for process in world.started:
                process.stop()
            proxy.stop()


# --- Checks -------------------------------------------------------------------------------------


def module_of(function: FunctionSpec) -> str:
    return function.handler.rpartition(".")[0]


def own_code_dirs(process: LambdaProcess, function: FunctionSpec) -> list[Path]:
    """The project's packages inside the directory the function runs from: ``streamfleet/``
    and, for an entry module of another package (the demo auction's handler), that one."""
    packages = dict.fromkeys(("streamfleet", function.handler.split(".", 1)[0]))
    return [process.code_dir / package for package in packages]


def environment_findings(function: FunctionSpec, process: LambdaProcess) -> list[str]:
    """Template variables the code never read, and unset variables the code read."""
    env_reads = process.env_reads()
    reads = [r for d in own_code_dirs(process, function) for r in reads_by(env_reads, d)]
    read_names = {r.name for r in reads}
    template_names = set(function.environment)
    optional = OPTIONAL_UNSET.get(module_of(function), {})
    findings = [
        f"{function.label}: the template sets {name} but its code never reads it"
        for name in sorted(template_names - read_names)
    ]
    for read in reads:
        if read.name in template_names or read.name in RUNTIME_VARIABLES:
            continue
        if read.name in optional or read.name in LOCAL_OVERRIDES:
            continue
        findings.append(
            f"{function.label}: its code reads {read.name}, which the template does not set"
            f" (read in {', '.join(sorted({Path(f).name for f in read.files}))})"
        )
    return findings


def origin_findings(function: FunctionSpec, process: LambdaProcess) -> list[str]:
    """Modules the function imported from anywhere but its asset, the SDK or the stdlib."""
    allowed = [str(process.code_dir.resolve()), str(Path(process.sdk_dir).resolve())]
    stdlib = [str(Path(sysconfig.get_path(key)).resolve()) for key in ("stdlib", "platstdlib")]
    findings = []
    for name, path in process.modules().items():
        resolved = str(Path(path).resolve())
        if name == "__main__" or "<frozen" in path:
            continue
        if any(resolved.startswith(root) for root in stdlib) and "-packages" not in resolved:
            continue
        if not any(resolved.startswith(root) for root in allowed):
            findings.append(f"{function.label}: imported {name} from {path}")
    return findings


async def eventually(check: Callable[[], Any], *, timeout: float, what: str) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` at the deadline."""
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(0.05)


# --- The WebSocket API of one Region, from its assets ---------------------------------------


@dataclass
class WebSocketRegion:
    """A local gateway in front of the handler and the authorizer, both from their assets."""

    region: Region
    gateway: Any
    handler: LambdaProcess
    authorizer: LambdaProcess
    handler_function: FunctionSpec
    authorizer_function: FunctionSpec
    stage: str
    route_keys: tuple[str, ...]

    management_url: str = ""

    @property
    def url(self) -> str:
        return f"{self.gateway.url}/{self.stage}"

    def start_canary(self, world: World, function: FunctionSpec, access_key: str) -> LambdaProcess:
        """The Region's canary from its asset, probing this gateway's stage."""
        return world.start_function(
            self.region.websocket,
            function,
            access_key=access_key,
            values=self.stage_url_values(),
            extra_env={"CANARY_MANAGEMENT_ENDPOINT": self.management_url},
        )

    def stage_url_values(self) -> dict[str, str]:
        """The regional stage URL the template builds (``wss://<api>.execute-api...``) ->
        this gateway; with a custom domain, its URL -> this gateway too, and its regional
        domain name (where the canary connects) -> loopback."""
        region = self.region.name
        aws_url = f"wss://{self.region.api_id}.execute-api.{region}.amazonaws.com/{self.stage}"
        values = {aws_url: self.url}
        stack = self.region.websocket.stack
        bindings = stack.template_bindings()
        for logical_id in stack.of_type("AWS::ApiGatewayV2::DomainName"):
            values[f"wss://{bindings.refs[logical_id]}"] = self.url
            values[bindings.attributes[(logical_id, "RegionalDomainName")]] = "127.0.0.1"
        return values


def function_with_handler(stack: Stack, handler: str) -> FunctionSpec:
    return stack.function_with_handler(handler)


# The WebSocket handler of the app as synthesized by default: the core's routes and the demo
# auction's (examples/auction); CORE_HANDLER_ENTRY serves the core's alone.
HANDLER_ENTRY = auction_names.HANDLER_ENTRY
CORE_HANDLER_ENTRY = "streamfleet.wsapi.handlers.handler"
AUTHORIZER_ENTRY = "streamfleet.wsapi.authorizer.handler"
ROUTER_ENTRY = "streamfleet.event_router.handler"
CANARY_ENTRY = "streamfleet.wsapi.canary.handler"


@contextlib.asynccontextmanager
async def websocket_region(world: World, role: str) -> AsyncIterator[WebSocketRegion]:
    """The Region's WebSocket API as deployed: its route keys and stage from the template, the
    handler replying through the Management API via the recording proxy."""
    from streamfleet_dev.emulator.websocket_gateway import (
        DEFAULT_MANAGEMENT_FAULT_RATES,
        GatewaySettings,
        LocalGateway,
    )

    region = world.regions[role]
    stack = region.websocket.stack
    (api,) = stack.websocket_apis()
    stage = api.stages[0]
    handler_function = function_with_handler(stack, HANDLER_ENTRY)
    authorizer_function = function_with_handler(stack, AUTHORIZER_ENTRY)
    # The Management API through the recording proxy (which forwards it to the gateway).
    management_url = f"{world.proxy.endpoint}/{stage}"
    handler = world.start_function(
        region.websocket,
        handler_function,
        access_key=f"handler-{role}",
        extra_env={"APIGW_MANAGEMENT_ENDPOINT": management_url},
    )
    authorizer = world.start_function(
        region.websocket, authorizer_function, access_key=f"authorizer-{role}"
    )
    settings = GatewaySettings(
        region=region.name,
        api_id=region.api_id,
        stage=stage,
        management_port=0,  # bound by the gateway, read back below
        routes=tuple(key for key in api.route_keys if not key.startswith("$")),
        account_id=LOCAL_ACCOUNT,
        handler_timeout_seconds=handler_function.timeout_seconds,
        authorizer_timeout_seconds=authorizer_function.timeout_seconds,
        # Throttled Management API calls, which the callers' retries must absorb; no random
        # refusals (403): a refused reply is lost by design, and the route tests assert each one.
        management_fault_rates=tuple(
            (status, rate) for status, rate in DEFAULT_MANAGEMENT_FAULT_RATES if status == 429
        ),
    )
    async with LocalGateway(settings, authorizer=authorizer, handler=handler) as gateway:
        # The proxy forwards the whole path, stage included, to the gateway's own origin.
        origin = gateway.management_endpoint.removesuffix(f"/{stage}")
        world.proxy.service_backends["execute-api"] = origin
        yield WebSocketRegion(
            region=region,
            gateway=gateway,
            handler=handler,
            authorizer=authorizer,
            handler_function=handler_function,
            authorizer_function=authorizer_function,
            stage=stage,
            route_keys=api.route_keys,
            management_url=management_url,
        )


class CloudFormationResponses:
    """The pre-signed ResponseURL: records each PUT a custom resource makes."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                outer.bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/response?signature=x"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
