"""The core: what a job is, and the one writer of its row.

States, bounds, exceptions, settings (`conf`), the handler registry, the retry policy, enqueue's
rules, bounded round trips (`connectivity`), and `transitions` -- the only writer of a job's
state, attempt, lease and result -- over `sql/` (all SQL text, one driver per database vendor).

The core is the bottom layer: it imports nothing else of `jobs`, not even the records
(jobs/models, which are built on the core's states, bounds and enqueue rules); its writes are SQL
through the driver. Checked by import-linter in bin/test.
"""
