"""The two services ``make local`` runs next to the fleet, each as ``cdk deploy`` would run it.

* :class:`RegionsProcess`: the client-facing WebSocket API in two local regions
  (:class:`~streamfleet_dev.wsapi.regions.LocalRegions`, ``--serve``) in a process of its own,
  steered over its HTTP port;
* :func:`start_event_api`: the event REST API, the template's methods served locally, each
  request a proxy event for the event router running from its synthesized asset.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamfleet import model
from streamfleet_dev import lifeline
from streamfleet_dev.assembly import default_assembly, local_environment, reference_of
from streamfleet_dev.emulator import http_adapter
from streamfleet_dev.emulator.lambda_runner import (
    LambdaProcess,
    LambdaSpec,
    host_twin,
    native_mismatches,
)
from streamfleet_dev.wsapi.regions import LiveSettings, format_fault_rates

from .fleet import WORKER_STACK, Fleet

ROUTER_HANDLER = "streamfleet.event_router.handler"
REGIONS_START_TIMEOUT = 90.0


# --- The WebSocket API's two regions, in a process of their own ---------------------------------


class RegionsProcess:
    """``python -m streamfleet_dev.wsapi.regions --serve``: LocalRegions out of this process
    (its canaries run every 0.5 s; the live view's loop and its logs stay apart), steered over
    its HTTP port as a browser test or ``curl`` would."""

    def __init__(
        self,
        *,
        static_dir: Path | None,
        log_path: Path,
        live: LiveSettings | None = None,
        dynamodb_endpoint: str | None = None,
        streams: tuple[str, ...] = (),
        management_fault_rates: tuple[tuple[int, float], ...] | None = None,
    ):
        self.management_fault_rates = management_fault_rates
        self.static_dir = static_dir
        self.log_path = log_path
        self.live = live
        self.dynamodb_endpoint = dynamodb_endpoint
        self.streams = streams
        self.process: subprocess.Popen[str] | None = None
        self.described: dict[str, Any] = {}

    def command(self) -> list[str]:
        """``regions --serve`` with this configuration's options."""
        command = [sys.executable, "-m", "streamfleet_dev.wsapi.regions", "--serve"]
        if self.static_dir is not None:
            command += ["--static-dir", str(self.static_dir)]
        if self.dynamodb_endpoint is not None:
            command += ["--dynamodb-endpoint", self.dynamodb_endpoint]
        if self.live is not None:
            command += live_arguments(self.live)
        for stream in self.streams:
            command += ["--stream", stream]
        if self.management_fault_rates is not None:
            command += ["--management-faults", format_fault_rates(self.management_fault_rates)]
        return command

    def start(self) -> RegionsProcess:
        command = self.command()
        with open(self.log_path, "ab") as log:
            self.process = lifeline.popen(
                command,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,  # Ctrl-C reaches local mode, which stops it in order
            )
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], REGIONS_START_TIMEOUT)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the local WebSocket regions did not start:\n{tail}")
        self.described = json.loads(line)
        return self

    @property
    def http_url(self) -> str:
        return str(self.described["http_url"])

    @property
    def primary(self) -> str:
        return str(self.described["primary"])

    @property
    def secondary(self) -> str:
        return str(self.described["secondary"])

    def region_url(self, name: str) -> str:
        return str(self.described["regions"][name])

    def _call(self, path: str, method: str = "GET") -> dict[str, Any]:
        request = urllib.request.Request(f"{self.http_url}{path}", method=method, data=None)
        try:
            with urllib.request.urlopen(request, timeout=3) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            return json.load(error)

    def health(self) -> dict[str, Any]:
        return self._call("/health")

    def fail(self, mode: str) -> dict[str, Any]:
        return self._call(f"/fail?mode={mode}", "POST")

    def restore(self) -> dict[str, Any]:
        return self._call("/restore", "POST")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def live_arguments(live: LiveSettings) -> list[str]:
    """``regions --serve``'s options for ``live`` (its defaults are left out)."""
    arguments = [
        "--lease-table",
        live.lease_table,
        "--messages-tables",
        ",".join(live.messages_tables),
        "--streams-endpoint",
        live.streams_endpoint,
        "--event-source-poll",
        repr(live.poll_interval),
    ]
    for claim in live.reader_claims:
        arguments += ["--reader-claim", claim]
    for claim, values in live.token_claims:
        arguments += ["--token-claim", f"{claim}={','.join(values)}"]
    if not live.fanout_from_assembly:
        arguments.append("--in-process-fanout")
    if not live.create_replica or live.replication_interval != LiveSettings.replication_interval:
        raise ValueError("LiveSettings: create_replica, replication_interval: no option for them")
    return arguments


# --- The event router, from its synthesized asset -----------------------------------------------


@dataclass
class EventApi:
    """The REST API's methods from the template, served locally; the router from its asset."""

    router: LambdaProcess
    server: Any
    url: str

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.router.stop()


def start_event_api(fleet: Fleet, allowed_upstreams: str, log_path: Path) -> EventApi:
    """The event router as the primary fleet stack deploys it: its asset, handler, runtime
    settings and environment (references mapped to this fleet's table and queue; the allow-list
    naming the local upstream), behind the template's REST methods."""
    stack = default_assembly().stack(WORKER_STACK)
    function = stack.function_with_handler(ROUTER_HANDLER)
    refs = {
        reference_of(function.environment[model.ENV_TABLE_NAME]): fleet.lease_table,
        reference_of(function.environment[model.ENV_QUEUE_URL]): fleet.queue_url,
    }
    environment = local_environment(
        function.environment,
        stack,
        refs=refs,
        overrides={model.ENV_ALLOWED_UPSTREAMS: allowed_upstreams},
    )
    spec = LambdaSpec.for_function(function, environment, region=stack.region)
    code_dir = host_twin(function.asset_dir) if native_mismatches(spec) else None
    router = LambdaProcess(
        spec,
        extra_env={k: v for k, v in os.environ.items() if k.startswith("AWS_ENDPOINT_URL")},
        log_path=log_path,
        code_dir=code_dir,
    ).start()
    routes = [
        http_adapter.Route(method.http_method, method.resource_path)
        for method in stack.rest_methods()
        if method.function == function.logical_id
    ]
    server = http_adapter.make_server(handler=router, routes=routes)
    http_adapter.serve_in_thread(server)
    return EventApi(router, server, f"http://127.0.0.1:{server.server_address[1]}")
