"""Children that die with their parent: Linux's parent-death signal for every process started here.

:func:`popen` and :func:`run` are ``subprocess.Popen`` and ``subprocess.run`` for a child that
must not outlive the process that started it, however that process ends: an orderly exit,
SIGTERM, SIGINT, a closed terminal's SIGHUP, ``kill -9`` or a crash. The child asks the kernel
for SIGKILL when its parent goes (``prctl(PR_SET_PDEATHSIG, SIGKILL)``); no code of the parent
has to run for it, so it holds where local mode's own orderly stop cannot run (``kill -9``, a
crash) and even when local mode's reaper (reaper.py) is gone too. SIGKILL, not SIGTERM: with
its parent gone nothing is left to stop in order for, and SIGKILL also ends a paused (SIGSTOPped)
worker and a process that ignores SIGTERM. An owner that is still alive stops its children in
order as before (a worker's SIGTERM hands its streams over); this only covers its death.

Four details of that signal shape this module:

* It is set in the child, between fork and exec. ``subprocess``'s ``preexec_fn`` would run
  Python in the forked copy of a threaded parent (local mode, the regions process and the test
  run all have threads), which its documentation calls unsafe. So the child first execs a tiny
  wrapper instead (``python -I -S -c`` :data:`ARM`, a few tens of ms), which sets the signal
  and then execs the command: same pid, argv, environment, working directory and descriptors.
* The parent may die before the signal is armed (between fork and ``prctl``): the wrapper then
  finds that its parent is no longer the process that started it and ends itself the same way.
* The "parent" is the *thread* that forked, not the process: a child forked from a thread that
  ends (``asyncio.to_thread``'s pool ends with its loop, an HTTP server's request thread with
  its request, and a Lambda runner restarts after a timeout on the thread that invoked it) would
  be killed when that thread ends. So every fork happens on a thread that lives as long as the
  process: the main thread itself, or for any other thread one spawner thread that does the
  forking for it.
* It survives exec (except of a set-user-ID, set-group-ID or file-capability binary: none here)
  but not fork: each level sets it for its own children. Local mode's children that start
  processes (the regions process starts Lambda runners) start them through this module too.
  Children of third-party tools (``cdk synth``'s app, pip's, a ``DYNALITE_BIN`` script's) are
  not covered by it: local mode's reaper stops them.

Linux only (``prctl``). Elsewhere :func:`popen` is ``subprocess.Popen`` unchanged, and what
remains is local mode's orderly stop and its reaper.
"""

from __future__ import annotations

import concurrent.futures
import errno
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

# The wrapper: arm the parent-death signal, check the parent is still there, exec the command.
# argv: signal, the expected parent's pid, the program, then the command's own argv.
ARM = """\
import ctypes, os, signal, sys
signum, parent, program, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
if ctypes.CDLL(None, use_errno=True).prctl(1, signum, 0, 0, 0) != 0:  # 1: PR_SET_PDEATHSIG
    print(f"lifeline: PR_SET_PDEATHSIG: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
if os.getppid() != parent:  # the parent died before the signal was armed
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)
for name in ("SIGPIPE", "SIGXFSZ"):  # this interpreter ignores them; the command must not
    if hasattr(signal, name):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
try:
    os.execvp(program, argv)
except OSError as error:
    print(f"lifeline: {program}: {error}", file=sys.stderr)
    os._exit(127)
"""
SIGNAL = signal.SIGKILL
AVAILABLE = sys.platform.startswith("linux") and os.path.isabs(sys.executable or "")

T = TypeVar("T")


class _Spawner:
    """One thread that lives as long as the process and forks for every other thread."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._requests: queue.SimpleQueue[
            tuple[Callable[[], Any], concurrent.futures.Future[Any]]
        ] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="lifeline-spawner", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            call, done = self._requests.get()
            try:
                done.set_result(call())
            except BaseException as exc:  # the caller's to handle, in the caller's thread
                done.set_exception(exc)

    def call(self, function: Callable[[], T]) -> T:
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._requests.put((function, done))
        return done.result()


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _on_a_lasting_thread(function: Callable[[], T]) -> T:
    """Run ``function`` (a fork) on the main thread or on the spawner thread: never on a thread
    that may end before the child should."""
    global _spawner
    if threading.current_thread() is threading.main_thread():
        return function()
    with _spawner_lock:
        if _spawner is None or _spawner.pid != os.getpid():  # none yet, or a forked copy's
            _spawner = _Spawner()
        spawner = _spawner
    if threading.current_thread() is spawner.thread:
        return function()
    return spawner.call(function)


def _program(args: Any, kwargs: dict[str, Any]) -> tuple[str, list[str]]:
    """What Popen would execute and the argv it would give it (taking ``shell`` and
    ``executable`` out of ``kwargs``: the wrapper is what Popen executes now)."""
    argv = [os.fsdecode(args)] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    argv = [os.fsdecode(a) for a in argv]
    if kwargs.pop("shell", False):
        argv = ["/bin/sh", "-c", *argv]
    executable = kwargs.pop("executable", None)
    program = os.fsdecode(executable) if executable is not None else argv[0]
    # Popen says a missing program by raising in the parent: so does this, before the wrapper.
    if os.sep in program:
        found = os.access(os.path.join(os.fsdecode(kwargs.get("cwd") or ""), program), os.X_OK)
    else:
        path = os.pathsep.join(os.get_exec_path(kwargs.get("env")))
        found = shutil.which(program, path=path) is not None
    if not found:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    return program, argv


def popen(args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(args, **kwargs)`` for a child that gets SIGKILL when this process
    ends (see the module's doc). Its ``args`` are the command's, as given."""
    if not AVAILABLE:
        return subprocess.Popen(args, **kwargs)
    program, argv = _program(args, kwargs)

    def start() -> subprocess.Popen[Any]:
        wrapper = [sys.executable, "-I", "-S", "-c", ARM, str(int(SIGNAL)), str(os.getpid())]
        return subprocess.Popen([*wrapper, program, *argv], **kwargs)

    process = _on_a_lasting_thread(start)
    process.args = args
    return process


def run(
    args: Any,
    *,
    input: Any = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **kwargs: Any,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` through :func:`popen` (the same arguments and outcomes)."""
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with popen(args, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            process.kill()
            exc.stdout, exc.stderr = process.communicate()
            raise
        except BaseException:
            process.kill()
            raise
        code = process.poll()
    if check and code:
        raise subprocess.CalledProcessError(code, args, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(args, code if code is not None else 0, stdout, stderr)
