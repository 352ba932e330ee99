"""How an entry point gets its configuration (``streamfleet/logs.py``, :func:`configured`)."""

from __future__ import annotations

import logging
import traceback
from types import SimpleNamespace

import pytest

from streamfleet.env import ConfigError, EnvironmentCache
from streamfleet.logs import configured

logger = logging.getLogger("tests.unit.test_logs")


def _bad_build() -> str:
    raise ConfigError("LOGS_TEST_TABLE", "required but not set")


def test_a_config_error_is_one_record_naming_the_variable_and_raised_without_its_frames(caplog):
    caplog.set_level(logging.DEBUG, logger=logger.name)
    context = SimpleNamespace(aws_request_id="req-1")

    with pytest.raises(ConfigError) as raised:
        configured(EnvironmentCache(("LOGS_TEST_TABLE",), _bad_build), logger, context)

    assert raised.value.variable == "LOGS_TEST_TABLE"
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    # Only the frames from the raise in configured() outward: none of the code that found it.
    frames = [frame.name for frame in traceback.extract_tb(raised.value.__traceback__)]
    assert "_bad_build" not in frames and "get" not in frames, frames
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert record.event == "config_error"
    assert record.variable == "LOGS_TEST_TABLE"
    assert record.field_requestId == "req-1"
    assert record.getMessage().startswith("config_error variable=LOGS_TEST_TABLE error=")
    assert record.exc_info is None


def test_a_valid_configuration_is_returned_and_other_errors_pass_unchanged(caplog):
    caplog.set_level(logging.DEBUG, logger=logger.name)
    assert configured(EnvironmentCache((), lambda: "built"), logger, None) == "built"

    def broken() -> str:
        raise RuntimeError("not a configuration error")

    with pytest.raises(RuntimeError, match="not a configuration error"):
        configured(EnvironmentCache((), broken), logger, None)
    assert caplog.records == []
