"""Text for the operator's terminal: what `manage.py jobs` prints from rows.

A row's text -- a handler's error, a kind, a worker name, a queue name inserted by hand -- may
hold control characters; printed as they are, an ESC or CSI sequence would act on the terminal
(retitle it, clear it, answer back) instead of being read. Never: changes what is stored.
"""

import re

# C0 and C1 control characters.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(line: str) -> str:
    """One line as text a terminal shows rather than obeys: control characters as \\xNN."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", line)
