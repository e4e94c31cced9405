"""The core: what a job is and the one writer of its row.

States, bounds, exceptions, settings (`conf`), the handler registry, the retry policy, enqueue's
rules, and `transitions` (the only writer of a job's state, attempt, lease and result) over
`sql/` (one driver per database vendor). The core imports nothing of jobs.worker, jobs.effects,
jobs.ops or dashboard (checked by import-linter in bin/test); it may use the records in
jobs/models.py, which themselves import only the core's states, bounds and enqueue rules.
"""
