"""The auction's settings: its home Region (``STATE_HOME_REGION``), and the DynamoDB client that
writes there when the home is another Region."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from botocore.config import Config

from streamfleet.env import ConfigError
from streamfleet.validation import REGION_PATTERN
from streamfleet.wsapi.handlers.config import make_dynamodb_client

from .names import ENV_STATE_HOME_REGION

# Writes to the auction's home Region cross Regions from the other one: two short attempts, so a
# home that cannot be reached is told within about 6 s (HOME_CALL_MAX_MS), and a home call is
# started only with that much of the invocation left.
HOME_CALL_MAX_MS = 6_500
HOME_BOTO_CONFIG = Config(
    connect_timeout=1.0,
    read_timeout=2.0,
    retries={"max_attempts": 2, "mode": "standard"},
    max_pool_connections=16,
)


@dataclass(frozen=True)
class AuctionConfig:
    """Where auctions are decided.

    Attributes:
        home_region: the Region whose replica of the state table decides every bid (``None``:
            the Region serving the bidder). Global tables resolve concurrent writes to one item
            last-writer-wins, so a conditional write in each Region could accept two bids that
            each replace the other; one home Region evaluates every bid's condition.
    """

    home_region: str | None = None

    def __post_init__(self) -> None:
        if self.home_region is not None and not REGION_PATTERN.fullmatch(self.home_region):
            raise ConfigError(ENV_STATE_HOME_REGION, f"{self.home_region!r} is not a Region name")

    def home(self, region: str) -> str:
        """The Region whose replica decides every bid, for handlers serving ``region``."""
        return self.home_region or region

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AuctionConfig:
        return cls(home_region=env.get(ENV_STATE_HOME_REGION, "").strip() or None)


def make_home_client(region: str) -> Any:
    """A DynamoDB client for the home Region's replica, with the shorter cross-Region budget."""
    return make_dynamodb_client(region, config=HOME_BOTO_CONFIG)
