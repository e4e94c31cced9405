"""Text for the operator's terminal: what `manage.py jobs` prints from rows.

A row's text -- a handler's error, a kind, a worker name, a queue name inserted by hand -- may
hold control characters; printed as they are, an ESC or CSI sequence would act on the terminal
(retitle it, clear it, answer back) instead of being read. Never: changes what is stored.
"""

from jobs.ops.logs import printable  # one rule for the terminal and the log's text lines

__all__ = ["printable"]
