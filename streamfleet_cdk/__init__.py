"""CDK constructs of the resilient streaming fleet.

This package is deliberately not called ``constructs``: a top-level ``constructs/`` folder would
shadow the ``constructs`` package that ``aws_cdk`` itself imports (aws/aws-cdk#19301).

Constructs take their names (tables, attributes, indexes, metrics) from :mod:`streamfleet.model`,
the runtime's data model, so the infrastructure and the code that reads it cannot drift apart.
The dependency goes one way only: the runtime never imports CDK.

* :class:`FleetTables` / :class:`FleetTableReplicas`: the lease and messages global tables.
* :class:`EventIngestion`: the REST API, the event router Lambda and the notification queue.
* :class:`WorkerFleet`: the ECS Fargate workers, scaled on their ``ActiveConnections``.
* :class:`ApiGatewayAccount`: a Region's API Gateway CloudWatch role (one per account and Region).
* :class:`AlarmTopic` and :class:`AlarmNotifications`: a Region's alarm topic, and the aspect
  that sends every alarm of a scope to it.

The WebSocket API's constructs are in :mod:`streamfleet_cdk.websocket_api`,
:mod:`streamfleet_cdk.canary` and :mod:`streamfleet_cdk.failover_dns`.
"""

from streamfleet_cdk.alarms import AlarmNotifications, AlarmTopic
from streamfleet_cdk.api_gateway_account import ApiGatewayAccount
from streamfleet_cdk.config import AppConfig
from streamfleet_cdk.event_ingestion import EventIngestion, EventIngestionProps
from streamfleet_cdk.tables import FleetTableReplicas, FleetTables, FleetTablesProps
from streamfleet_cdk.worker_fleet import WorkerFleet, WorkerFleetProps

__all__ = [
    "AlarmNotifications",
    "AlarmTopic",
    "ApiGatewayAccount",
    "AppConfig",
    "EventIngestion",
    "EventIngestionProps",
    "FleetTableReplicas",
    "FleetTables",
    "FleetTablesProps",
    "WorkerFleet",
    "WorkerFleetProps",
]
