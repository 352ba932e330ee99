"""The Lambda entry point of the WebSocket API with the demo auction installed
(``streamfleet_auction.handler.handler``): the core's routes plus ``bid``."""

from __future__ import annotations

from streamfleet.wsapi.handlers import make_handler

from .extension import auction_extension

handler = make_handler(extensions=(auction_extension(),))
