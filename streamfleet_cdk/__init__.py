"""CDK constructs of the resilient streaming fleet.

This package is deliberately not called ``constructs``: a top-level ``constructs/`` folder would
shadow the ``constructs`` package that ``aws_cdk`` itself imports (aws/aws-cdk#19301).

Constructs take their names (tables, attributes, indexes) from :mod:`streamfleet.model`, the
runtime's data model, so the infrastructure and the code that reads it cannot drift apart. The
dependency goes one way only: the runtime never imports CDK.
"""

from streamfleet_cdk.config import AppConfig
from streamfleet_cdk.tables import FleetTableReplicas, FleetTables, FleetTablesProps

__all__ = ["AppConfig", "FleetTableReplicas", "FleetTables", "FleetTablesProps"]
