"""What runs inside `manage.py qcluster`.

The django-q2 bridge hands a worker process a drain (runner), which claims, runs each handler with
its context (`ctx`, built from jobs/context.py) under a background heartbeat, and presents the
outcome through the completer; the embedded scheduler wakes drains (listener), runs the reaper,
cron ticks (jobs/ops/cron.py), and, on a thread of its own, the outbox relay and the janitor
(maintenance); shutdown and the unresolved-outcome spool surround them. The worker is the top
layer below Django's entry points: it may import everything else in `jobs`, and nothing in `jobs`
imports it back -- nor does the dashboard.
"""
