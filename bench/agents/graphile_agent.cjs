// graphile-worker peer (runs under Node with NODE_PATH at the cached npm folder; imports nothing
// from Palisade).
//
//     node graphile_agent.cjs setup | enqueue N | enqueue-bulk N | latency GAPS_JSON | work
//
// graphile-worker deletes a job when it completes and keeps no attempt history, so the durable
// record the orchestrator reads is what is left in graphile_worker._private_jobs, plus one row per
// worker process in bench_gw_marks (ready, then the first job's start on the database clock), and
// one row per latency probe in bench_gw_latency. `work` waits at a start barrier (the
// orchestrator's `go` row) after Node, the driver and the pool are up, so their start-up is not
// timed. Settings come from the environment (BENCH_GW_CONCURRENCY, BENCH_GW_LOCAL_QUEUE,
// BENCH_GW_BATCH_DELAY: -1 = graphile-worker's default, no batching).
"use strict";
const { run, makeWorkerUtils, runMigrations } = require("graphile-worker");
const { Pool } = require("pg");

const DSN = process.env.BENCH_GW_DSN;
const int = (name, dflt) => {
  const v = process.env[name];
  return v === undefined || v === "" ? dflt : parseInt(v, 10);
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function setup() {
  await runMigrations({ connectionString: DSN });
  const pool = new Pool({ connectionString: DSN, max: 1 });
  await pool.query(
    "CREATE TABLE IF NOT EXISTS bench_gw_marks (pid int PRIMARY KEY, ready_at timestamptz," +
      " first_start timestamptz)"
  );
  await pool.query("CREATE TABLE IF NOT EXISTS bench_gw_go (go boolean)");
  await pool.query(
    "CREATE TABLE IF NOT EXISTS bench_gw_latency (job_id bigint PRIMARY KEY," +
      " created_at timestamptz, started_at timestamptz)"
  );
  await pool.end();
  console.log(JSON.stringify({ ok: true }));
}

async function enqueue(n, bulk) {
  const utils = await makeWorkerUtils({ connectionString: DSN });
  const t0 = process.hrtime.bigint();
  if (bulk) {
    await utils.addJobs(Array.from({ length: n }, () => ({ identifier: "noop", payload: {} })));
  } else {
    for (let i = 0; i < n; i++) await utils.addJob("noop", {});
  }
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  await utils.release();
  console.log(JSON.stringify({ n, seconds }));
}

async function latency(gaps) {
  const utils = await makeWorkerUtils({ connectionString: DSN });
  const pool = new Pool({ connectionString: DSN, max: 1 });
  const samples = [];
  for (const gap of gaps) {
    await sleep(gap * 1000);
    const job = await utils.addJob("probe", {});
    const deadline = Date.now() + 30000;
    for (;;) {
      const r = await pool.query(
        "SELECT extract(epoch FROM started_at - created_at) * 1000 AS ms" +
          " FROM bench_gw_latency WHERE job_id = $1",
        [job.id]
      );
      if (r.rows.length) {
        samples.push(Number(r.rows[0].ms));
        break;
      }
      if (Date.now() > deadline) throw new Error(`job ${job.id} not started after 30 s`);
      await sleep(0.5);
    }
  }
  await utils.release();
  await pool.end();
  console.log(JSON.stringify({ enqueue_to_start_ms: samples }));
}

async function work() {
  const pool = new Pool({ connectionString: DSN, max: 1 });
  await pool.query(
    "INSERT INTO bench_gw_marks (pid, ready_at) VALUES ($1, clock_timestamp())" +
      " ON CONFLICT (pid) DO UPDATE SET ready_at = excluded.ready_at, first_start = NULL",
    [process.pid]
  );
  while (!(await pool.query("SELECT 1 FROM bench_gw_go")).rows.length) await sleep(2);
  let marked = false;
  const worker = {
    concurrentJobs: int("BENCH_GW_CONCURRENCY", 1),
  };
  const localQueue = int("BENCH_GW_LOCAL_QUEUE", 0);
  if (localQueue > 0) worker.localQueue = { size: localQueue };
  const delay = int("BENCH_GW_BATCH_DELAY", -1);
  if (delay >= 0) {
    worker.completeJobBatchDelay = delay;
    worker.failJobBatchDelay = delay;
  }
  const runner = await run({
    connectionString: DSN,
    noHandleSignals: false,
    preset: { worker },
    taskList: {
      noop: async (_payload, helpers) => {
        if (!marked) {
          marked = true;
          await helpers.query(
            "UPDATE bench_gw_marks SET first_start = clock_timestamp() WHERE pid = $1",
            [process.pid]
          );
        }
      },
      probe: async (_payload, helpers) => {
        // The job row lives (locked) while its task runs: its created_at at full precision.
        await helpers.query(
          "INSERT INTO bench_gw_latency SELECT id, created_at, clock_timestamp()" +
            " FROM graphile_worker._private_jobs WHERE id = $1",
          [helpers.job.id]
        );
      },
    },
  });
  await pool.end();
  await runner.promise;
}

const [cmd, arg] = process.argv.slice(2);
const main = {
  setup: () => setup(),
  enqueue: () => enqueue(parseInt(arg, 10), false),
  "enqueue-bulk": () => enqueue(parseInt(arg, 10), true),
  latency: () => latency(JSON.parse(arg)),
  work: () => work(),
}[cmd];
if (!main) {
  console.error(`unknown command ${cmd}`);
  process.exit(2);
}
main().catch((err) => {
  console.error(err);
  process.exit(1);
});
