"""The inside of a local Lambda execution environment (see :mod:`.lambda_runner`).

Started as ``python -I -S _lambda_bootstrap.py ASSET_DIR SDK_DIR HANDLER REQUEST_FD RESPONSE_FD``:
isolated (no ``PYTHON*`` variables, no script directory, no site-packages), so until this
file puts them on ``sys.path`` the interpreter sees only the standard library. Then, as in
Lambda, the asset directory comes first and the runtime's SDK (boto3 and its dependencies)
after it; nothing of the repository, the virtualenv or the parent process.

Before the handler's module is imported, ``os.environ`` is replaced by a mapping that records
every variable the code looks up (and from which file), so the parent can compare what the code
reads with what the template sets. Then it serves invocations: one JSON object per line on
``REQUEST_FD`` (``{"op": "invoke", "event": ..., "context": ...}``, ``{"op": "env_reads"}``,
``{"op": "modules"}``), one answer per line on ``RESPONSE_FD``. The function's own output
(stdout, stderr) goes wherever the parent pointed them: its "CloudWatch Logs".

Standard library only, on purpose: anything imported here would be visible to the function.
"""

import importlib
import json
import os
import sys
import time
import traceback


def _caller_file():
    # The first frame outside this file and outside os / collections.abc (frozen modules on
    # CPython 3.11+, ordinary files before): the code that asked.
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        base = os.path.basename(name)
        if not (
            name == __file__
            or name.startswith("<frozen")
            or base in ("os.py", "_collections_abc.py")
        ):
            return name
        frame = frame.f_back
    return "?"


class _RecordingEnviron(os._Environ):  # type: ignore[name-defined]
    """``os.environ`` that remembers which names were looked up, by whom, and if they were set."""

    def __init__(self, base):
        super().__init__(
            base._data, base.encodekey, base.decodekey, base.encodevalue, base.decodevalue
        )
        self.reads = {}

    def _record(self, key):
        if isinstance(key, str):
            present = self.encodekey(key) in self._data
            entry = self.reads.setdefault(key, {"present": present, "files": []})
            caller = _caller_file()
            if caller not in entry["files"]:
                entry["files"].append(caller)

    def __getitem__(self, key):
        # Walking the whole mapping (items(), values(), copy()) reads no variable by name.
        if sys._getframe(1).f_code.co_name not in ("__iter__", "copy"):
            self._record(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self._record(key)
        return super().__contains__(key)


class LambdaContext:
    """The handler's ``context`` argument, as the Python runtime shapes it."""

    def __init__(self, fields, timeout_ms):
        self.function_name = fields.get("function_name", "")
        self.function_version = fields.get("function_version", "$LATEST")
        self.invoked_function_arn = fields.get("invoked_function_arn", "")
        self.memory_limit_in_mb = fields.get("memory_limit_in_mb", "128")
        self.aws_request_id = fields.get("aws_request_id", "")
        self.log_group_name = fields.get("log_group_name", "")
        self.log_stream_name = fields.get("log_stream_name", "")
        self.identity = None
        self.client_context = None
        self.deadline = time.monotonic() + timeout_ms / 1000

    def get_remaining_time_in_millis(self):
        return max(0, int((self.deadline - time.monotonic()) * 1000))


def _error(exc):
    return {
        "errorType": type(exc).__name__,
        "errorMessage": str(exc),
        "stackTrace": traceback.format_exception(exc),
    }


def _modules():
    found = []
    for name, module in sorted(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path:
            found.append([name, path])
    return found


def main():
    asset_dir, sdk_dir, handler = sys.argv[1], sys.argv[2], sys.argv[3]
    requests = os.fdopen(int(sys.argv[4]), "r", encoding="utf-8")
    responses = os.fdopen(int(sys.argv[5]), "w", encoding="utf-8")

    def send(message):
        responses.write(json.dumps(message, default=str) + "\n")
        responses.flush()

    timeout_ms = int(float(os.environ.get("AWS_LAMBDA_FUNCTION_TIMEOUT", "3")) * 1000)
    sys.path[:0] = [asset_dir, *([sdk_dir] if sdk_dir else [])]
    recorder = _RecordingEnviron(os.environ)
    os.environ = recorder  # noqa: B003 - same variables, now recorded (not a reset)
    module_name, _, function_name = handler.rpartition(".")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except BaseException as exc:  # an init error is an answer, not a crash of the runner
        send({"op": "init", "ok": False, "error": _error(exc), "env_reads": recorder.reads})
        return
    send({"op": "init", "ok": True})
    for line in requests:
        request = json.loads(line)
        op = request.get("op")
        if op == "env_reads":
            send({"op": op, "env_reads": recorder.reads})
        elif op == "modules":
            send({"op": op, "modules": _modules()})
        elif op == "invoke":
            context = LambdaContext(request.get("context") or {}, timeout_ms)
            error = None
            try:
                result = function(request.get("event"), context)
                text = json.dumps(result)
            except Exception as exc:
                error = _error(exc)
            if time.monotonic() > context.deadline:
                # Lambda ends an invocation at its timeout, whatever the function would have
                # answered (or raised) after it: a late answer is a failure, not a success.
                error = {
                    "errorType": "Sandbox.Timedout",
                    "errorMessage": f"Task timed out after {timeout_ms / 1000:.2f} seconds",
                }
            if error is not None:
                send({"op": op, "id": request.get("id"), "error": error})
                continue
            identifier = json.dumps(request.get("id"))
            responses.write(f'{{"op": "invoke", "id": {identifier}, "result": {text}}}\n')
            responses.flush()
        else:
            send({"op": op, "error": {"errorType": "UnknownOp", "errorMessage": str(op)}})


if __name__ == "__main__":
    main()
