"""Runtime of the resilient streaming fleet: the code the worker image and the Lambdas run.

Nothing in this package imports aws_cdk; the CDK constructs import it (for names), never the
other way round.
"""
