"""The operator's tools: ``python -m streamfleet_ops.cli`` (the ``cli`` extra) and its preflight
checks. Not deployed: no Lambda and not the worker image import them."""
