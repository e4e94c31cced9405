"""Every write path beyond the job row, each fenced by the presenting attempt.

- staging.py -- outputs staged under an attempt-scoped path, promoted by the commit;
- keys.py    -- effects keyed `"<job_id>:<step>"`, performed at most once per (job, step), and
                the built-in mail effect `send_mail`; in_flight.py (one attempt's threads in
                a step one at a time);
- fenced.py  -- token-checked writes to application tables (`ctx.fenced_write`);
- outbox.py  -- intents written by the commit, and the relay that performs them with
                reconciliation; targets.py (what it calls), webhook.py and exchange.py (the
                built-in target), relay.py and slots.py (its calls in flight);
- pending.py -- what an attempt staged and intended, held in-process until its commit;
- janitor.py -- deletes the outputs of attempts that lost (orphans).

Effects import the core and the records, never jobs.worker or jobs.ops. `send_mail` is
re-exported here: `from jobs.effects import send_mail` is the documented path.
"""

from jobs.effects.keys import send_mail

__all__ = ["send_mail"]
