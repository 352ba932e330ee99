"""A value built from the environment, kept while the variables it reads keep their values
(``streamfleet/env.py``)."""

from __future__ import annotations

import threading
import time

import pytest

from streamfleet.env import ConfigError, EnvironmentCache


def test_the_value_is_rebuilt_only_when_a_variable_it_reads_changes(monkeypatch):
    monkeypatch.setenv("CACHE_TEST_READ", "one")
    builds: list[str] = []

    def build() -> str:
        builds.append("built")
        return f"value {len(builds)}"

    cache = EnvironmentCache(("CACHE_TEST_READ",), build)
    assert cache.get() == cache.get() == "value 1"
    monkeypatch.setenv("CACHE_TEST_UNREAD", "anything")
    assert cache.get() == "value 1"
    monkeypatch.setenv("CACHE_TEST_READ", "two")
    assert cache.get() == cache.get() == "value 2"
    cache.clear()
    assert cache.get() == "value 3"


def test_a_failed_build_is_not_cached(monkeypatch):
    monkeypatch.delenv("CACHE_TEST_READ", raising=False)
    attempts: list[str] = []

    def build() -> str:
        attempts.append("tried")
        if len(attempts) == 1:
            raise ConfigError("CACHE_TEST_READ", "required but not set")
        return "built"

    cache = EnvironmentCache(("CACHE_TEST_READ",), build)
    with pytest.raises(ConfigError, match=r"^CACHE_TEST_READ: required") as raised:
        cache.get()
    assert raised.value.variable == "CACHE_TEST_READ"
    assert cache.get() == "built"  # tried again, the environment unchanged


def test_concurrent_first_calls_build_once():
    builds: list[object] = []

    def slow_build() -> object:
        time.sleep(0.05)  # long enough for every thread to arrive while it runs
        builds.append(object())
        return builds[-1]

    cache = EnvironmentCache((), slow_build)
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(cache.get())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1 and got == builds * 4
