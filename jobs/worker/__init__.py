"""What runs inside `manage.py qcluster`.

The django-q2 bridge hands a worker process a drain (runner), which claims, runs each handler with
its context (`ctx`, context.py) under a background heartbeat, and presents the outcome through
the completer; the embedded scheduler runs the reaper, cron ticks, the outbox relay and the
janitor (maintenance), with shutdown, bounded connectivity and the unresolved-outcome spool
around them. The worker may import the core, effects and ops; nothing below imports it back.
"""
