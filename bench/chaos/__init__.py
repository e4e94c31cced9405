"""The fault-injection suite: real clusters, a PostgreSQL of its own, nemeses on a seeded schedule,
an append-only history of what every handler did, and a checker of the invariants.

    .venv/bin/python bench/chaos/run.py --jobs 300 --faults 30 --seed 1 --clusters 2

Modules: pgserver (the private PostgreSQL: initdb, pg_ctl, kill -9, restart), nemesis (the
seeded schedule of faults and their injection), history (the append-only log handlers write),
workload (the Django app whose handlers the clusters run), checker (the invariants), report
(text and JSON), run (the command). Never touches the machine's shared PostgreSQL server beyond
reading nothing from it: everything runs against the private one.
"""
