"""What a person types into ``make local``, while the live view owns the screen.

On a terminal, stdin is switched to cbreak mode (keys arrive one by one, the terminal echoes
nothing, Ctrl-C still interrupts) and :class:`LineEditor` keeps the line being typed, so the
view can show it: a terminal's own echo would be drawn over by the next frame. When stdin is
not a terminal (a pipe, a test), whole lines are read instead. Either way the keys reach the
asyncio loop from a daemon thread: stdin has no asyncio reader here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import termios
import threading
import tty
from collections.abc import Callable
from dataclasses import dataclass, field

ENTER = ("\r", "\n")
ERASE = ("\x7f", "\b")
KILL_LINE = "\x15"  # Ctrl-U
MAX_LINE = 200


@dataclass
class LineEditor:
    """The line being typed: printable keys, backspace, Ctrl-U, Enter (escape sequences such as
    arrow keys are dropped)."""

    text: str = ""
    _escape: bool = field(default=False, repr=False)

    def feed(self, key: str) -> str | None:
        """Take one key; returns the finished line on Enter."""
        if self._escape:  # ESC [ A ... : skip up to the final letter
            if key.isalpha() or key == "~":
                self._escape = False
            return None
        if key == "\x1b":
            self._escape = True
            return None
        if key in ENTER:
            line, self.text = self.text, ""
            return line
        if key in ERASE:
            self.text = self.text[:-1]
        elif key == KILL_LINE:
            self.text = ""
        elif key.isprintable() and len(self.text) < MAX_LINE:
            self.text += key
        return None


class Keyboard:
    """Delivers typed keys (or lines) to ``on_key`` on the loop; ``restore()`` gives the
    terminal back as it was (call it in a ``finally``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_key: Callable[[str], None]):
        self._loop = loop
        self._on_key = on_key
        self._fd = sys.stdin.fileno() if sys.stdin is not None else -1
        self._saved: list | None = None
        self.interactive = self._fd >= 0 and os.isatty(self._fd)

    def start(self) -> Keyboard:
        if self.interactive:
            self._saved = termios.tcgetattr(self._fd)
            tty.setcbreak(self._fd)
            target = self._read_keys
        else:
            target = self._read_lines
        threading.Thread(target=target, daemon=True, name="keyboard").start()
        return self

    def restore(self) -> None:
        if self._saved is not None:
            with contextlib.suppress(termios.error):
                termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
            self._saved = None

    def _deliver(self, key: str) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed while we were reading
            self._loop.call_soon_threadsafe(self._on_key, key)

    def _read_keys(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 64)
            except OSError:
                return
            if not data:
                return
            for key in data.decode(errors="replace"):
                self._deliver(key)

    def _read_lines(self) -> None:
        for line in sys.stdin:
            for key in line.rstrip("\n"):
                self._deliver(key)
            self._deliver("\n")
        # stdin closed: keep running (a pipe that ended is not a quit)
