// pg-boss peer (runs under Node with NODE_PATH at the cached npm folder; imports nothing from
// Palisade).
//
//     node pgboss_agent.cjs setup | enqueue N | enqueue-bulk N | latency GAPS_JSON | work
//
// pg-boss keeps every job in pgboss.job with created_on, started_on and completed_on on the
// database clock: that is the durable record the orchestrator reads. `work` waits at a start
// barrier (it writes its pid to bench_pb_ready, then waits for a row in bench_pb_go) after Node, the driver and pg-boss are up. The worker fetches
// BENCH_PB_BATCH jobs at a time (pg-boss 10 hands a handler an array) and polls every
// BENCH_PB_POLL seconds (pg-boss has no LISTEN: idle latency is its polling interval).
"use strict";
const PgBoss = require("pg-boss");

const DSN = process.env.BENCH_PB_DSN;
const QUEUE = "bench";
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const quiet = { supervise: false, schedule: false, migrate: false };

async function boss(options) {
  const b = new PgBoss({ connectionString: DSN, max: 2, ...options });
  b.on("error", (err) => console.error(err));
  await b.start();
  return b;
}

async function setup() {
  const b = await boss({ supervise: false, schedule: false });  // migrate: creates the schema
  await b.createQueue(QUEUE);
  await b.getDb().executeSql("CREATE TABLE IF NOT EXISTS bench_pb_go (go boolean)");
  await b.getDb().executeSql("CREATE TABLE IF NOT EXISTS bench_pb_ready (pid int PRIMARY KEY)");
  await b.stop({ graceful: false, wait: true });
  console.log(JSON.stringify({ ok: true }));
}

async function enqueue(n, bulk) {
  const b = await boss(quiet);
  const t0 = process.hrtime.bigint();
  if (bulk) {
    await b.insert(Array.from({ length: n }, () => ({ name: QUEUE, data: {} })));
  } else {
    for (let i = 0; i < n; i++) await b.send(QUEUE, {});
  }
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  await b.stop({ graceful: false, wait: true });
  console.log(JSON.stringify({ n, seconds }));
}

async function latency(gaps) {
  const b = await boss(quiet);
  const db = b.getDb();
  const samples = [];
  for (const gap of gaps) {
    await sleep(gap * 1000);
    const id = await b.send(QUEUE, {});
    const deadline = Date.now() + 30000;
    for (;;) {
      const r = await db.executeSql(
        "SELECT extract(epoch FROM started_on - created_on) * 1000 AS ms FROM pgboss.job" +
          " WHERE name = $1 AND id = $2 AND started_on IS NOT NULL",
        [QUEUE, id]
      );
      if (r.rows.length) {
        samples.push(Number(r.rows[0].ms));
        break;
      }
      if (Date.now() > deadline) throw new Error(`job ${id} not started after 30 s`);
      await sleep(0.5);
    }
  }
  await b.stop({ graceful: false, wait: true });
  console.log(JSON.stringify({ enqueue_to_start_ms: samples }));
}

async function work() {
  const b = await boss(quiet);
  const db = b.getDb();
  await db.executeSql("INSERT INTO bench_pb_ready VALUES ($1) ON CONFLICT DO NOTHING", [process.pid]);
  while (!(await db.executeSql("SELECT 1 FROM bench_pb_go")).rows.length) await sleep(2);
  await b.work(
    QUEUE,
    {
      batchSize: parseInt(process.env.BENCH_PB_BATCH || "100", 10),
      pollingIntervalSeconds: parseFloat(process.env.BENCH_PB_POLL || "0.5"),
    },
    async (_jobs) => {}
  );
  const stop = () => b.stop({ graceful: true, wait: true }).then(() => process.exit(0));
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
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
