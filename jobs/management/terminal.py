"""Text for the operator's terminal: what `manage.py jobs` prints.

A row's text -- a handler's error, a kind, a worker name, an intent's key, a queue name inserted
by hand -- and an argument echoed back may hold control characters; printed as they are, an ESC
or CSI sequence would act on the terminal (retitle it, clear it, answer back) and a \\r or \\n
would forge a line of output, instead of being read. So the command writes every message through
`Printable`: each message's control characters as \\xNN (`printable`, the log's text-line rule),
on stdout and on stderr (where Django writes a CommandError's message). A message is one line:
a line break in it is data, never layout. Never: changes what is stored.
"""

from collections.abc import Callable
from typing import TextIO, cast

from django.core.management.base import OutputWrapper
from django.utils.functional import Promise

from jobs.ops.logs import printable  # one rule for the terminal and the log's text lines

__all__ = ["Printable"]


class Printable(OutputWrapper):
    """Django's OutputWrapper `out`, every message written as `printable` makes it (its ending
    and style added after, by `out`). A lazy translation (`gettext_lazy`), which `out` takes, is
    its text."""

    def __init__(self, out: OutputWrapper) -> None:
        super().__init__(cast(TextIO, out), ending="")  # a stream: its attributes are out's
        self._inner = out

    def write(  # type: ignore[override]  # OutputWrapper's own, as django-stubs declare it
        self,
        msg: str | Promise = "",
        style_func: Callable[[str], str] | None = None,
        ending: str | None = None,
    ) -> None:
        self._inner.write(
            printable(str(msg) if isinstance(msg, Promise) else msg), style_func, ending
        )

    @classmethod
    def around(cls, out: OutputWrapper) -> "Printable":
        return out if isinstance(out, Printable) else cls(out)
