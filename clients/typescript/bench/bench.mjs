// Acquire+release pairs per second, and client CPU per pair, for the
// TypeScript client and for node-redlock on one Redis, N concurrent loops
// each on its own lock (the uncontended workload of `deadbolt bench`).
//
//   node bench.mjs deadbolt --endpoint http://127.0.0.1:7070 [--clients 16] [--duration 5]
//   node bench.mjs redlock --redis redis://127.0.0.1:6379
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
  },
});
const mode = positionals[0];
const clients = Number(values.clients);
const duration = Number(values.duration) * 1000;
const WARMUP = 1000;

let measuring = false;
let stop = false;

async function deadbolt() {
  const client = new Client({ endpoints: values.endpoint });
  const loops = Array.from({ length: clients }, async (_, i) => {
    let done = 0;
    const session = await client.session({ ttl: "30s" });
    try {
      while (!stop) {
        const guard = await session.lock(`bench:ts:${i}`);
        await guard.release();
        if (measuring) done++;
      }
    } finally {
      await session.close();
    }
    return done;
  });
  return { loops, close: () => client.close() };
}

async function redlock() {
  const { default: Redis } = await import("ioredis");
  const { default: Redlock } = await import("redlock");
  const redis = new Redis(values.redis);
  const locks = new Redlock([redis], { retryCount: 0 });
  const loops = Array.from({ length: clients }, async (_, i) => {
    let done = 0;
    while (!stop) {
      const lock = await locks.acquire([`bench:ts:${i}`], 30_000);
      await lock.release();
      if (measuring) done++;
    }
    return done;
  });
  return { loops, close: () => redis.disconnect() };
}

const run = { deadbolt, redlock }[mode];
if (!run) {
  console.error("usage: node bench.mjs deadbolt|redlock [--clients N] [--duration SECONDS]");
  process.exit(2);
}
const cpuBefore = process.cpuUsage();
const { loops, close } = await run();
await new Promise((resolve) => setTimeout(resolve, WARMUP));
measuring = true;
await new Promise((resolve) => setTimeout(resolve, duration));
stop = true;
const pairs = (await Promise.all(loops)).reduce((a, b) => a + b, 0);
const cpu = process.cpuUsage(cpuBefore);
close();
// The CPU of the whole run, warm-up included, over the pairs of the whole
// run at the measured rate.
const rate = pairs / (duration / 1000);
const micros = (cpu.user + cpu.system) / (rate * ((duration + WARMUP) / 1000));
console.log(`${mode} ${Math.round(rate)} ${Math.round(micros)}`);
