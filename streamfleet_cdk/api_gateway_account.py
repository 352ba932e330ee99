"""The Region's API Gateway account settings: the CloudWatch role that stages log through.

API Gateway writes a stage's access logs and execution logs with one role per account and
Region (``AWS::ApiGateway::Account``'s ``CloudWatchRoleArn``). Without it, creating a stage with
access logs fails ("CloudWatch Logs role ARN must be set in account settings"), which is what a
first deployment into a fresh account or Region ran into. Exactly one stack per Region may own
this singleton (two would overwrite each other's role, and deleting either would break the
other's logs); in this app it is the fleet stack, and the WebSocket API stack of the same
Region deploys after it. Accounts whose baseline sets the role centrally turn it off
(``streamfleet:api_gateway_cloudwatch_role=false``).
"""

from __future__ import annotations

from aws_cdk import ArnFormat, RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigateway
from aws_cdk import aws_iam as iam
from constructs import Construct

from streamfleet_cdk.nag import acknowledge, nag_text

# What API Gateway does with the role (the actions of AWS's managed policy
# AmazonAPIGatewayPushToCloudWatchLogs), written out instead of attaching that policy.
LOGGING_ACTIONS = (
    "logs:CreateLogGroup",
    "logs:CreateLogStream",
    "logs:DescribeLogGroups",
    "logs:DescribeLogStreams",
    "logs:PutLogEvents",
    "logs:GetLogEvents",
    "logs:FilterLogEvents",
)


class ApiGatewayAccount(Construct):
    """``AWS::ApiGateway::Account`` with its CloudWatch role, for this stack's Region.

    The role is retained when the stack is deleted: the account setting outlives the stack
    (CloudFormation does not reset it), and other stacks' stages keep logging through it.

    Attributes:
        role: the role API Gateway assumes to write logs in this Region.
        account: the account settings resource (stages that log should depend on it).
    """

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        log_groups = stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name="*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        # The policy is inline, so it is retained with the role: a separate policy resource
        # would be deleted with the stack and leave the account setting on a powerless role.
        self.role = iam.Role(
            self,
            "CloudWatchRole",
            assumed_by=iam.ServicePrincipal("apigateway.amazonaws.com"),
            description="API Gateway: access and execution logs of this Region's stages",
            inline_policies={
                "Logging": iam.PolicyDocument(
                    statements=[
                        iam.PolicyStatement(actions=list(LOGGING_ACTIONS), resources=[log_groups])
                    ]
                )
            },
        )
        self.role.apply_removal_policy(RemovalPolicy.RETAIN)
        self.account = apigateway.CfnAccount(
            self, "Account", cloud_watch_role_arn=self.role.role_arn
        )
        acknowledge(
            self.role,
            f"IAM5[Resource::{nag_text(stack, log_groups)}]",
            "The account-wide API Gateway role writes the logs of every stage in this Region "
            "(execution logs go to API-Gateway-Execution-Logs_<api id>/<stage>, created by API "
            "Gateway on first use), so it is limited to this account's and Region's log "
            "groups, not to named ones.",
        )
