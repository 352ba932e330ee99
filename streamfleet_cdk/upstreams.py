"""The upstream allow-list, checked at synth with the parser the worker and the router use.

A START names a URL from outside; both the event router and every worker refuse URLs outside
``ALLOWED_UPSTREAMS``. Parsing the list here with the runtime's own
:class:`~streamfleet.worker.upstream_policy.UpstreamPolicy` means a list that would make the
workers refuse to start fails ``cdk synth`` instead of a deployment.
"""

from __future__ import annotations

from streamfleet.worker.upstream_policy import UpstreamPolicy

SEPARATOR = ","


def check_allowed_upstreams(field: str, value: object) -> tuple[str, ...]:
    """A non-empty tuple of ``scheme://host[:port]`` entries; ``ValueError`` naming ``field``."""
    if isinstance(value, str) or not isinstance(value, tuple):
        raise ValueError(f"{field}: expected a tuple of scheme://host[:port] strings")
    if not value:
        raise ValueError(f"{field}: at least one allowed upstream is required")
    for entry in value:
        if not isinstance(entry, str) or not entry.strip() or SEPARATOR in entry:
            raise ValueError(f"{field}: {entry!r} is not one scheme://host[:port] entry")
        UpstreamPolicy.parse(field, entry)
    if len(set(value)) != len(value):
        raise ValueError(f"{field}: duplicate entry in {value!r}")
    return value


def allowed_upstreams_env(entries: tuple[str, ...]) -> str:
    """The ``ALLOWED_UPSTREAMS`` value the worker and the router parse: comma-joined."""
    return SEPARATOR.join(entries)
