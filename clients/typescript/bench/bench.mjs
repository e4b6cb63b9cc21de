// Acquire+release pairs per second, and client CPU per pair, for the
// TypeScript client and for node-redlock on one Redis: N concurrent loops,
// each on its own lock (the uncontended workload of `deadbolt bench`), or
// with --contended all on one lock.
//
//   node bench.mjs MODE --endpoint URL --redis URL [--clients 16] [--duration 5] [--contended]
//
// MODE is what is measured:
//   deadbolt-readme   one Client, each loop doing what the README shows:
//                     `await client.withLock(name, { ttl: "30s" }, work)`
//   deadbolt-session  one Client, each loop an explicit long-lived session:
//                     `session.lock(name)` then `guard.release()`
//                     (`deadbolt` is the same, the name scripts/client-bench.sh uses)
//   redlock           node-redlock 5 on ioredis: `acquire([name], 30000)`
//                     then `release()` (retrying every 10 ms while --contended)
//
// Prints one line: `MODE pairs/s client-µs/pair`. scripts/client-bench.sh
// starts the servers and runs every client side by side.
import { parseArgs } from "node:util";
import { Client } from "../dist/index.js";

const { positionals, values } = parseArgs({
  allowPositionals: true,
  options: {
    endpoint: { type: "string", default: "http://127.0.0.1:7070" },
    redis: { type: "string", default: "redis://127.0.0.1:6379" },
    clients: { type: "string", default: "16" },
    duration: { type: "string", default: "5" },
    contended: { type: "boolean", default: false },
  },
});
const mode = positionals[0];
const clients = Number(values.clients);
const duration = Number(values.duration) * 1000;
const WARMUP = 1000;
const lockName = (i) => (values.contended ? "bench:ts" : `bench:ts:${i}`);

let measuring = false;
let stop = false;

/** `clients` loops of `pair(i)`, each counting the pairs it did while measuring. */
function loops(pair) {
  return Array.from({ length: clients }, async (_, i) => {
    let done = 0;
    while (!stop) {
      await pair(i);
      if (measuring) done++;
    }
    return done;
  });
}

function deadboltReadme() {
  const client = new Client({ endpoints: values.endpoint });
  const work = async () => {};
  return { loops: loops((i) => client.withLock(lockName(i), { ttl: "30s" }, work)), close: () => client.close() };
}

function deadboltSession() {
  const client = new Client({ endpoints: values.endpoint });
  const sessions = Array.from({ length: clients }, () => client.session({ ttl: "30s" }));
  const pair = async (i) => {
    const guard = await (await sessions[i]).lock(lockName(i));
    await guard.release();
  };
  const close = async () => {
    await Promise.all(sessions.map(async (session) => (await session).close()));
    await client.close();
  };
  return { loops: loops(pair), close };
}

async function redlock() {
  const { default: Redis } = await import("ioredis");
  const { default: Redlock } = await import("redlock");
  const redis = new Redis(values.redis);
  const settings = values.contended ? { retryCount: -1, retryDelay: 10, retryJitter: 10 } : { retryCount: 0 };
  const locks = new Redlock([redis], settings);
  const pair = async (i) => {
    const lock = await locks.acquire([lockName(i)], 30_000);
    await lock.release();
  };
  return { loops: loops(pair), close: () => redis.disconnect() };
}

const run = { "deadbolt-readme": deadboltReadme, "deadbolt-session": deadboltSession, deadbolt: deadboltSession, redlock }[mode];
if (!run) {
  console.error("usage: node bench.mjs deadbolt-readme|deadbolt-session|redlock [--endpoint URL] [--redis URL] [--clients N] [--duration SECONDS] [--contended]");
  process.exit(2);
}
const cpuBefore = process.cpuUsage();
const { loops: running, close } = await run();
await new Promise((resolve) => setTimeout(resolve, WARMUP));
measuring = true;
await new Promise((resolve) => setTimeout(resolve, duration));
stop = true;
const pairs = (await Promise.all(running)).reduce((a, b) => a + b, 0);
const cpu = process.cpuUsage(cpuBefore);
await close();
// The CPU of the whole run, warm-up included, over the pairs of the whole
// run at the measured rate.
const rate = pairs / (duration / 1000);
const micros = (cpu.user + cpu.system) / (rate * ((duration + WARMUP) / 1000));
console.log(`${mode} ${Math.round(rate)} ${Math.round(micros)}`);
