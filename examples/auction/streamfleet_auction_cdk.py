"""The demo auction's CDK side: the :class:`~streamfleet_cdk.websocket_api.HandlerExtension`
that adds it to a :class:`~streamfleet_cdk.websocket_api.WebSocketApi`.

It names the handler's entry module with the auction installed
(``streamfleet_auction.handler.handler``) and bundles its package beside ``streamfleet``, adds
the ``bid`` route and ``STATE_HOME_REGION``, and grants what bids call: ``PutItem`` (the
immutable bid records) on this Region's state table when the home is this Region, or, when it is
another, the home replica's auction and bid items only (``AUCTION#*``, ``BID#*``). It imports
the auction's names, never its runtime: the construct side and the handler side stay apart.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Stack
from aws_cdk import aws_iam as iam

from streamfleet_auction import names
from streamfleet_cdk.websocket_api import HANDLER_ACTIONS, HandlerExtension, WebSocketApi

PACKAGE_NAME = "streamfleet_auction"
PACKAGE_DIR = Path(names.__file__).resolve().parent
# What the auction calls on the state table besides the core's GetItem/UpdateItem: PutItem, of
# each accepted bid's immutable record.
BID_RECORD_ACTIONS = ("dynamodb:PutItem",)


def home_state_table_arn(api: WebSocketApi, home_region: str) -> str:
    """ARN of the state table's replica in ``home_region`` (global tables share one name)."""
    return Stack.of(api).format_arn(
        service="dynamodb",
        region=home_region,
        resource="table",
        resource_name=api.state_table.table_name,
    )


def auction_extension(home_region: str | None = None) -> HandlerExtension:
    """The demo auction for one Region's API. ``home_region``: the Region whose replica of the
    state table decides every bid (``STATE_HOME_REGION``); ``None``: each Region's own. Every
    Region of one deployment names the same home, so each auction has one writer."""

    def grant(api: WebSocketApi) -> None:
        if home_region is None or home_region == Stack.of(api).region:
            api.handler_role.add_to_policy(
                iam.PolicyStatement(
                    actions=list(BID_RECORD_ACTIONS), resources=[api.state_table.table_arn]
                )
            )
            return
        # Bids are decided in the home Region's replica: its auctions and bid records only.
        api.handler_role.add_to_policy(
            iam.PolicyStatement(
                actions=sorted({*HANDLER_ACTIONS["state_table"], *BID_RECORD_ACTIONS}),
                resources=[home_state_table_arn(api, home_region)],
                conditions={
                    "ForAllValues:StringLike": {
                        "dynamodb:LeadingKeys": [f"{prefix}*" for prefix in names.HOME_KEY_PREFIXES]
                    }
                },
            )
        )

    return HandlerExtension(
        entry=names.HANDLER_ENTRY,
        packages={PACKAGE_NAME: PACKAGE_DIR},
        routes=(names.WS_ROUTE_BID,),
        environment=({names.ENV_STATE_HOME_REGION: home_region} if home_region else {}),
        grant=grant,
    )
