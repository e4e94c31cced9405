"""An operator's tools: actions, metrics, cron schedules, retention, system checks, the lease
hint and log formatting. Imports the core, the records and effects' read-only counts, never
jobs.worker (the dashboard and the admin use these and must not pull a worker in).
"""
