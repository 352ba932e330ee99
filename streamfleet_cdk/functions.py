"""Every Lambda function of the app, built one way: one runtime, one architecture, JSON logs.

:func:`python_function` is the only place a ``lambda_.Function`` is created, so the event router,
the WebSocket handler, the authorizer and the canary cannot drift apart again: all run
:data:`~streamfleet_cdk.assets.LAMBDA_TARGET` (Python 3.14 on arm64), with their code bundled for
it by :func:`~streamfleet_cdk.assets.lambda_code`, and log JSON with an explicit application log
level. Lambda's Python runtime applies that level to the ``logging`` root logger, so the
handlers' ``logger.info`` decisions (allow/deny, START/STOP) reach CloudWatch at ``INFO`` and
can be filtered by level and field there.

:func:`function_alarms` gives each function an errors and a throttles alarm; the stacks send
every alarm to the Region's alarm topic (:mod:`streamfleet_cdk.alarms`).

checkov's Lambda checks that no function of the app meets are judged here, once: outside a VPC
(:data:`NO_VPC_REASON`), the environment without a customer managed key
(:data:`ENVIRONMENT_KMS_REASON`), and no dead-letter queue, for a reason each caller gives by how
its function is invoked (:data:`INVOKED_SYNCHRONOUSLY`, :data:`INVOKED_BY_STREAM`, or its own).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from streamfleet_cdk.assets import LAMBDA_TARGET, lambda_code
from streamfleet_cdk.nag import skip_checkov

# Lambda's application log levels, by name (CDK's enum has the same names).
LOG_LEVELS = {
    "TRACE": lambda_.ApplicationLogLevel.TRACE,
    "DEBUG": lambda_.ApplicationLogLevel.DEBUG,
    "INFO": lambda_.ApplicationLogLevel.INFO,
    "WARN": lambda_.ApplicationLogLevel.WARN,
    "ERROR": lambda_.ApplicationLogLevel.ERROR,
    "FATAL": lambda_.ApplicationLogLevel.FATAL,
}
DEFAULT_LOG_LEVEL = "INFO"
# The platform's own lines (START/END/REPORT are always written): only its warnings and errors.
SYSTEM_LOG_LEVEL = lambda_.SystemLogLevel.WARN

ALARM_PERIOD = Duration.minutes(5)

# checkov CKV_AWS_117 and CKV_AWS_173, true of every function python_function builds.
NO_VPC_REASON = (
    "Calls public HTTPS endpoints only: AWS service APIs (DynamoDB, SQS, the API Gateway "
    "Management API, CloudWatch, Secrets Manager) signed with the function's own role, "
    "CloudFormation's pre-signed response URL, and for the authorizer and the canary the "
    "identity provider's JWKS URL and the WebSocket API's public URL. Nothing it uses is in a "
    "VPC; one would only add NAT gateways or interface endpoints in every Region to reach them."
)
ENVIRONMENT_KMS_REASON = (
    "The environment holds names, URLs, limits and public keys, never a secret: the canary "
    "reads its signing key from Secrets Manager at run time, and JwtSettings accepts public "
    "keys only. The same values are in the CloudFormation template in plain text, and Lambda "
    "encrypts them at rest with its own key; a customer managed key would hide nothing more."
)
# checkov CKV_AWS_116: why a function has no dead-letter queue, for the two ways of invoking one
# that never use it. A function invoked asynchronously gives its own reason.
INVOKED_SYNCHRONOUSLY = (
    "Invoked synchronously only, by API Gateway, which waits for the answer and returns any "
    "error to its caller; Lambda sends only failed asynchronous invocations to a dead-letter "
    "queue, so one would never receive anything."
)
INVOKED_BY_STREAM = (
    "Invoked only by an event source mapping on a DynamoDB stream, which never uses a "
    "function's dead-letter queue; the mapping's own on-failure destination (the FailedRecords "
    "queue, with its alarm) keeps the batches it gives up on."
)


def check_log_level(field: str, value: object) -> str:
    """``value`` if it is one of :data:`LOG_LEVELS`; ``ValueError`` naming ``field``."""
    if value not in LOG_LEVELS:
        raise ValueError(f"{field}: expected one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return str(value)


def check_reserved_concurrency(field: str, value: object) -> None:
    """``None`` (unreserved) or a whole number of at least 1 (0 would disable the function)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field}: expected a whole number of at least 1 or None, got {value!r}")


def python_function(
    scope: Construct,
    construct_id: str,
    *,
    description: str,
    handler: str,
    role: iam.IRole,
    log_group: logs.ILogGroup,
    environment: dict[str, str],
    timeout: Duration,
    no_dead_letter_queue: str,
    memory_size: int = 256,
    distributions: tuple[str, ...] = (),
    reserved_concurrency: int | None = None,
    log_level: str = DEFAULT_LOG_LEVEL,
    tracing: bool = False,
    packages: Mapping[str, Path] | None = None,
) -> lambda_.Function:
    """A function on :data:`LAMBDA_TARGET` running ``handler`` from the ``streamfleet`` package
    (or from one of ``packages``, other top-level packages by name and directory, which it
    carries as the assets module says) plus ``distributions``, logging JSON at ``log_level``
    into ``log_group``.

    ``no_dead_letter_queue``: why the function needs none, by how it is invoked (see
    :data:`INVOKED_SYNCHRONOUSLY`); checkov's CKV_AWS_116 is skipped with it.
    """
    function = lambda_.Function(
        scope,
        construct_id,
        description=description,
        runtime=LAMBDA_TARGET.runtime,
        architecture=LAMBDA_TARGET.architecture,
        handler=handler,
        code=lambda_code(
            distributions,
            LAMBDA_TARGET,
            entries=(handler.rpartition(".")[0],),
            packages=packages,
        ),
        role=role,
        log_group=log_group,
        logging_format=lambda_.LoggingFormat.JSON,
        application_log_level_v2=LOG_LEVELS[check_log_level("log_level", log_level)],
        system_log_level_v2=SYSTEM_LOG_LEVEL,
        memory_size=memory_size,
        timeout=timeout,
        reserved_concurrent_executions=reserved_concurrency,
        tracing=lambda_.Tracing.ACTIVE if tracing else lambda_.Tracing.DISABLED,
        environment=environment,
    )
    skip_checkov(function, "CKV_AWS_116", no_dead_letter_queue)
    skip_checkov(function, "CKV_AWS_117", NO_VPC_REASON)
    if environment:
        skip_checkov(function, "CKV_AWS_173", ENVIRONMENT_KMS_REASON)
    return function


def function_alarms(
    scope: Construct,
    function: lambda_.Function,
    *,
    what: str,
    expected_errors: cloudwatch.IMetric | None = None,
) -> tuple[cloudwatch.Alarm, cloudwatch.Alarm]:
    """``(errors, throttles)``: in ALARM after one unhandled error, or one throttled invocation,
    in five minutes. A throttle means the function's reserved concurrency was exhausted (for
    the authorizer: a connection flood is being refused, as designed, but someone should know).

    ``expected_errors`` counts invocations that raise by design (the authorizer's 401, which
    only an exception can answer): the errors alarm counts ``Errors`` minus those.
    """
    errors_metric: cloudwatch.IMetric = function.metric_errors(period=ALARM_PERIOD, statistic="Sum")
    if expected_errors is not None:
        errors_metric = cloudwatch.MathExpression(
            expression="errors - FILL(expected, 0)",
            using_metrics={"errors": errors_metric, "expected": expected_errors},
            label=f"{what}: errors not raised by design",
            period=ALARM_PERIOD,
        )
    errors = cloudwatch.Alarm(
        scope,
        f"{function.node.id}ErrorsAlarm",
        alarm_description=f"StreamFleet: {what} failed (unhandled errors); see its logs",
        metric=errors_metric,
        threshold=1,
        evaluation_periods=1,
        comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
    )
    throttles = cloudwatch.Alarm(
        scope,
        f"{function.node.id}ThrottlesAlarm",
        alarm_description=(
            f"StreamFleet: {what} was throttled (its reserved concurrency is exhausted)"
        ),
        metric=function.metric_throttles(period=ALARM_PERIOD, statistic="Sum"),
        threshold=1,
        evaluation_periods=1,
        comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
    )
    return errors, throttles
