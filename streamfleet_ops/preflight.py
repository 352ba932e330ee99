"""Pre-deployment checks: what ``cdk deploy`` needs that ``cdk synth`` cannot see.

Synth proves the templates are well formed; a deploy also needs things that exist only in the
target account: the CDK bootstrap stack (at the version the assembly requires) in each Region,
the account-level API Gateway CloudWatch role where no stack creates it, Docker able to build
the worker's ``linux/arm64`` image, and the hosted zone, certificates and canary secret the
templates name. :func:`target_from_assembly` reads what to check from the synthesized assembly
(``cdk.out``: plain JSON, so this needs neither the CDK nor Docker), and :func:`run_checks`
answers each question against the account with the ambient credentials, one
:class:`CheckResult` per check with the fix for what fails.

Used by ``python -m streamfleet_ops.cli preflight`` (``make preflight``).
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PASS, FAIL, WARN, SKIP = "PASS", "FAIL", "WARN", "SKIP"
PLACEHOLDER_ACCOUNT = "111111111111"  # what synth used without credentials or an account
AGNOSTIC_ACCOUNT = "unknown-account"  # an environment-agnostic stack's account in the manifest
DEFAULT_BOOTSTRAP_PARAMETER = "/cdk-bootstrap/hnb659fds/version"
CLOUDWATCH_ROLE_CONTEXT = "streamfleet:api_gateway_cloudwatch_role"
CANARY_SECRET_CONTEXT = "streamfleet:canary_signing_key_secret_name"
COMMAND_TIMEOUT_SECONDS = 30
# API Gateway stages write access logs through the account's CloudWatch role.
_LOGGING_STAGES = ("AWS::ApiGateway::Stage", "AWS::ApiGatewayV2::Stage")
_SECRET_VARIABLE = re.compile(r".*_SECRET(_ARN|_NAME|_ID)?$")


@dataclass(frozen=True)
class CheckResult:
    """One check: its status, what was found, and how to fix it when it is not a pass."""

    check: str
    status: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        """``FAIL bootstrap us-east-1: ... -> fix: ...`` (one line per check)."""
        text = f"{self.status} {self.check}: {self.detail}"
        return f"{text} -> fix: {self.fix}" if self.fix and self.status != PASS else text


@dataclass(frozen=True)
class RegionNeeds:
    """What one Region's stacks need from the account."""

    region: str
    stacks: tuple[str, ...]
    bootstrap_version: int
    bootstrap_parameter: str = DEFAULT_BOOTSTRAP_PARAMETER
    logging_stages: bool = False  # an API Gateway stage that writes logs
    creates_api_gateway_account: str | None = None  # the stack that declares it, if one does
    certificates: tuple[tuple[str, str], ...] = ()  # (domain name, certificate ARN)
    secrets: tuple[tuple[str, str], ...] = ()  # (function path, secret id)
    canaries: tuple[str, ...] = ()  # paths of the canary functions (CANARY_* environment)


@dataclass(frozen=True)
class DeployTarget:
    """Everything the checks look for, read from one assembly.

    Attributes:
        account: the account the assembly was synthesized for.
        regions: each Region's needs, primary first (the order of the manifest).
        hosted_zones: ``(zone id, record name)`` of each DNS record the templates create.
        image_platforms: platforms of the container image assets (``linux/arm64``).
    """

    account: str
    regions: tuple[RegionNeeds, ...]
    hosted_zones: tuple[tuple[str, str], ...] = ()
    image_platforms: tuple[str, ...] = ()


def _flat(value: Any) -> Iterator[Any]:
    """Every scalar inside a template value (for a literal hidden in an intrinsic)."""
    if isinstance(value, Mapping):
        for item in value.values():
            yield from _flat(item)
    elif isinstance(value, list):
        for item in value:
            yield from _flat(item)
    else:
        yield value


def _literal(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def target_from_assembly(directory: Path) -> DeployTarget:
    """Read what a deploy of the assembly in ``directory`` needs (its ``manifest.json``)."""
    manifest_path = Path(directory) / "manifest.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(
            f"{manifest_path}: no cloud assembly here (run `make synth` first, or pass --assembly)"
        )
    manifest = json.loads(manifest_path.read_text())
    accounts: set[str] = set()
    regions: dict[str, dict[str, Any]] = {}
    zones: list[tuple[str, str]] = []
    platforms: set[str] = set()
    for name, artifact in manifest.get("artifacts", {}).items():
        if artifact.get("type") != "aws:cloudformation:stack":
            continue
        match = re.fullmatch(r"aws://([^/]+)/([^/]+)", artifact.get("environment", ""))
        if not match:
            continue
        account, region = match.groups()
        accounts.add(account)
        properties = artifact.get("properties", {})
        needs = regions.setdefault(
            region,
            {
                "stacks": [],
                "version": 0,
                "parameter": DEFAULT_BOOTSTRAP_PARAMETER,
                "logging": False,
                "account_stack": None,
                "certs": [],
                "secrets": [],
                "canaries": [],
            },
        )
        needs["stacks"].append(name)
        needs["version"] = max(
            needs["version"], int(properties.get("requiresBootstrapStackVersion") or 0)
        )
        needs["parameter"] = (
            properties.get("bootstrapStackVersionSsmParameter") or needs["parameter"]
        )
        template = json.loads((Path(directory) / properties["templateFile"]).read_text())
        for resource in template.get("Resources", {}).values():
            kind, props = resource.get("Type"), resource.get("Properties", {})
            if kind in _LOGGING_STAGES and (
                props.get("AccessLogSetting") or props.get("AccessLogSettings")
            ):
                needs["logging"] = True
            elif kind == "AWS::ApiGateway::Account":
                needs["account_stack"] = name
            elif kind == "AWS::ApiGatewayV2::DomainName":
                for configuration in props.get("DomainNameConfigurations", ()):
                    arn = _literal(configuration.get("CertificateArn"))
                    if arn:
                        needs["certs"].append((str(props.get("DomainName")), arn))
            elif kind == "AWS::Route53::RecordSet" and _literal(props.get("HostedZoneId")):
                zones.append((props["HostedZoneId"], str(props.get("Name", "")).rstrip(".")))
            elif kind == "AWS::Lambda::Function":
                variables = (props.get("Environment") or {}).get("Variables", {})
                path = resource.get("Metadata", {}).get("aws:cdk:path", name)
                if any(variable.startswith("CANARY_") for variable in variables):
                    needs["canaries"].append(path.removesuffix("/Resource"))
                for variable, value in variables.items():
                    if _SECRET_VARIABLE.fullmatch(variable) and _literal(value):
                        needs["secrets"].append((path.removesuffix("/Resource"), value))
        assets_path = Path(directory) / f"{name}.assets.json"
        if assets_path.is_file():
            for image in json.loads(assets_path.read_text()).get("dockerImages", {}).values():
                if image.get("source", {}).get("platform"):
                    platforms.add(image["source"]["platform"])
    if len(accounts) > 1:
        raise ValueError(f"assembly: stacks for several accounts {sorted(accounts)}")
    return DeployTarget(
        account=accounts.pop() if accounts else "",
        regions=tuple(
            RegionNeeds(
                region=region,
                stacks=tuple(needs["stacks"]),
                bootstrap_version=needs["version"],
                bootstrap_parameter=needs["parameter"],
                logging_stages=needs["logging"],
                creates_api_gateway_account=needs["account_stack"],
                certificates=tuple(dict.fromkeys(needs["certs"])),
                secrets=tuple(dict.fromkeys(needs["secrets"])),
                canaries=tuple(needs["canaries"]),
            )
            for region, needs in regions.items()
        ),
        hosted_zones=tuple(dict.fromkeys(zones)),
        image_platforms=tuple(sorted(platforms)),
    )


# --- Checks -------------------------------------------------------------------------------------

ClientFactory = Callable[[str, str], Any]  # (service, region) -> boto3 client
CommandRunner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def default_clients(service: str, region: str) -> Any:
    import boto3

    return boto3.client(service, region_name=region)


def default_runner(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(command), capture_output=True, text=True, check=False, timeout=COMMAND_TIMEOUT_SECONDS
    )


def _code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__))


@dataclass
class Preflight:
    """Runs the checks of one target (see :func:`run_checks`)."""

    target: DeployTarget
    clients: ClientFactory = default_clients
    runner: CommandRunner = default_runner
    results: list[CheckResult] = field(default_factory=list)

    def add(self, check: str, status: str, detail: str, fix: str = "") -> None:
        self.results.append(CheckResult(check, status, detail, fix))

    def credentials(self) -> str | None:
        region = self.target.regions[0].region if self.target.regions else "us-east-1"
        try:
            identity = self.clients("sts", region).get_caller_identity()
        except Exception as exc:
            self.add(
                "credentials",
                FAIL,
                f"no usable AWS credentials ({_code(exc)})",
                "configure credentials for the target account (AWS_PROFILE, aws sso login, ...)",
            )
            return None
        account = identity["Account"]
        if self.target.account == PLACEHOLDER_ACCOUNT:
            self.add(
                "credentials",
                FAIL,
                f"the assembly was synthesized for the placeholder account {PLACEHOLDER_ACCOUNT}",
                f"synthesize with these credentials (make synth), or with "
                f"-c streamfleet:account={account}",
            )
        elif self.target.account in ("", AGNOSTIC_ACCOUNT):
            self.add("credentials", PASS, f"account {account}; the stacks deploy into it")
        elif self.target.account != account:
            self.add(
                "credentials",
                FAIL,
                f"credentials are for account {account}, the assembly for {self.target.account}",
                "use credentials of the target account, or synthesize for this one",
            )
        else:
            self.add("credentials", PASS, f"account {account} ({identity.get('Arn', '')})")
        return account

    def bootstrap(self, needs: RegionNeeds, account: str) -> None:
        check = f"bootstrap {needs.region}"
        fix = f"npx cdk bootstrap aws://{account}/{needs.region}"
        try:
            value = self.clients("ssm", needs.region).get_parameter(Name=needs.bootstrap_parameter)
            version = int(value["Parameter"]["Value"])
        except Exception as exc:
            detail = (
                "not bootstrapped"
                if _code(exc) == "ParameterNotFound"
                else f"cannot read {needs.bootstrap_parameter} ({_code(exc)})"
            )
            self.add(check, FAIL, f"{detail} ({needs.bootstrap_parameter} missing)", fix)
            return
        if version < needs.bootstrap_version:
            self.add(
                check,
                FAIL,
                f"bootstrap version {version}, the stacks need {needs.bootstrap_version}",
                fix,
            )
        else:
            self.add(check, PASS, f"bootstrap version {version} (needs {needs.bootstrap_version})")

    def api_gateway_account(self, needs: RegionNeeds, account: str) -> None:
        check = f"API Gateway CloudWatch role {needs.region}"
        if not needs.logging_stages:
            self.add(check, SKIP, "no API Gateway stage here writes logs")
            return
        if needs.creates_api_gateway_account:
            self.add(check, PASS, f"created by {needs.creates_api_gateway_account}")
            return
        role_arn = f"arn:aws:iam::{account}:role/<a role API Gateway may assume>"
        fix = (
            f"aws apigateway update-account --region {needs.region} --patch-operations "
            f"op=replace,path=/cloudwatchRoleArn,value={role_arn} (with the permissions of "
            f"AmazonAPIGatewayPushToCloudWatchLogs), or -c {CLOUDWATCH_ROLE_CONTEXT}=true"
        )
        try:
            role = self.clients("apigateway", needs.region).get_account().get("cloudwatchRoleArn")
        except Exception as exc:
            self.add(check, FAIL, f"cannot read the account settings ({_code(exc)})", fix)
            return
        if role:
            self.add(check, PASS, f"set to {role}")
        else:
            self.add(check, FAIL, "not set: stages with access logs fail to create", fix)

    def docker(self) -> None:
        platforms = self.target.image_platforms
        if not platforms:
            self.add("docker", SKIP, "no container image to build")
            return
        install = "install Docker (with buildx) on the machine that runs cdk deploy"
        try:
            info = self.runner(["docker", "info", "--format", "{{.ServerVersion}}"])
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.add("docker", FAIL, f"docker cannot run here ({type(exc).__name__})", install)
            return
        if info.returncode != 0:
            message = (info.stderr or info.stdout).strip().splitlines()
            detail = message[-1] if message else f"exit {info.returncode}"
            self.add("docker", FAIL, f"no Docker engine reachable: {detail}", "start Docker")
            return
        try:
            builder = self.runner(["docker", "buildx", "inspect"])
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.add("docker", FAIL, f"docker buildx cannot run ({type(exc).__name__})", install)
            return
        if builder.returncode != 0:
            self.add("docker", FAIL, "docker buildx is not available", install)
            return
        listed = " ".join(
            line.split(":", 1)[1]
            for line in builder.stdout.splitlines()
            if line.strip().lower().startswith("platforms:")
        )
        supported = {p.strip().rstrip("*") for p in listed.split(",") if p.strip()}
        missing = [p for p in platforms if p not in supported]
        host = platform.machine()
        if missing:
            self.add(
                "docker",
                FAIL,
                f"Docker {info.stdout.strip()} cannot build {', '.join(missing)} on {host} "
                f"(its builder offers {', '.join(sorted(supported)) or 'nothing'})",
                "docker run --privileged --rm tonistiigi/binfmt --install arm64 (QEMU), or "
                "deploy from an arm64 machine",
            )
        else:
            self.add("docker", PASS, f"Docker {info.stdout.strip()} builds {', '.join(platforms)}")

    def hosted_zones(self) -> None:
        if not self.target.hosted_zones:
            self.add(
                "hosted zone",
                SKIP,
                "no DNS records in the templates (no custom domain in context)",
            )
            return
        route53 = self.clients("route53", "us-east-1")
        for zone_id, record in self.target.hosted_zones:
            check = f"hosted zone {zone_id}"
            try:
                zone = route53.get_hosted_zone(Id=zone_id)["HostedZone"]
            except Exception as exc:
                self.add(
                    check,
                    FAIL,
                    f"not found in this account ({_code(exc)})",
                    "set streamfleet:hosted_zone_id to a public zone of this account",
                )
                continue
            name = zone["Name"].rstrip(".")
            if record == name or record.endswith(f".{name}"):
                self.add(check, PASS, f"{name} holds {record}")
            else:
                self.add(
                    check,
                    FAIL,
                    f"zone {name} cannot hold {record}",
                    "set streamfleet:ws_domain_name inside the zone, or name the right zone",
                )

    def certificates(self, needs: RegionNeeds) -> None:
        if not needs.certificates:
            return
        for domain, arn in needs.certificates:
            check = f"certificate {needs.region}"
            arn_region = arn.split(":")[3] if arn.count(":") >= 5 else ""
            if arn_region != needs.region:
                self.add(
                    check,
                    FAIL,
                    f"{arn} is in {arn_region or '?'}; a regional API needs one in {needs.region}",
                    f"request a certificate for {domain} in {needs.region}",
                )
                continue
            try:
                certificate = self.clients("acm", needs.region).describe_certificate(
                    CertificateArn=arn
                )["Certificate"]
            except Exception as exc:
                self.add(
                    check,
                    FAIL,
                    f"{arn} not found ({_code(exc)})",
                    f"request and validate a certificate for {domain} in {needs.region}",
                )
                continue
            names = [
                certificate.get("DomainName", ""),
                *certificate.get("SubjectAlternativeNames", ()),
            ]
            covered = any(
                name == domain or (name.startswith("*.") and domain.split(".", 1)[-1] == name[2:])
                for name in names
            )
            status = certificate.get("Status")
            if status != "ISSUED":
                self.add(check, FAIL, f"{arn} is {status}", f"complete the validation of {domain}")
            elif not covered:
                self.add(
                    check,
                    FAIL,
                    f"{arn} covers {', '.join(names)}, not {domain}",
                    f"use a certificate for {domain}",
                )
            else:
                self.add(check, PASS, f"{domain}: {arn} issued")

    def secrets(self, needs: RegionNeeds) -> None:
        for function, secret in needs.secrets:
            check = f"secret {needs.region}"
            try:
                described = self.clients("secretsmanager", needs.region).describe_secret(
                    SecretId=secret
                )
            except Exception as exc:
                self.add(
                    check,
                    FAIL,
                    f"{secret} (read by {function}) not found ({_code(exc)})",
                    f"aws secretsmanager create-secret --region {needs.region} --name {secret} "
                    "--secret-string file://canary-key.pem (or replicate it to this Region)",
                )
                continue
            stages = described.get("VersionIdsToStages") or {}
            if not any("AWSCURRENT" in s for s in stages.values()):
                self.add(
                    check,
                    FAIL,
                    f"{secret} has no current value",
                    f"aws secretsmanager put-secret-value --region {needs.region} "
                    f"--secret-id {secret} --secret-string file://canary-key.pem",
                )
            else:
                self.add(check, PASS, f"{secret} (read by {function}) exists")

    def canary_key(self, needs: RegionNeeds) -> None:
        if needs.canaries and not needs.secrets:
            self.add(
                f"canary signing key {needs.region}",
                WARN,
                f"{needs.canaries[0]} has none: it connects without a token, its probes are "
                "refused and the health alarm stays in ALARM",
                f"-c {CANARY_SECRET_CONTEXT}=<secret name>",
            )


def run_checks(
    target: DeployTarget,
    *,
    clients: ClientFactory = default_clients,
    runner: CommandRunner = default_runner,
) -> list[CheckResult]:
    """Every check of ``target``, in a fixed order; nothing is changed in the account."""
    preflight = Preflight(target, clients, runner)
    account = preflight.credentials()
    if account is not None:
        for needs in target.regions:
            preflight.bootstrap(needs, account)
        for needs in target.regions:
            preflight.api_gateway_account(needs, account)
    preflight.docker()
    if account is not None:
        preflight.hosted_zones()
        if not any(needs.certificates for needs in target.regions):
            preflight.add("certificates", SKIP, "no custom domain in the templates")
        for needs in target.regions:
            preflight.certificates(needs)
        for needs in target.regions:
            preflight.secrets(needs)
    for needs in target.regions:
        preflight.canary_key(needs)
    return preflight.results


def failed(results: Sequence[CheckResult]) -> bool:
    return any(result.status == FAIL for result in results)
