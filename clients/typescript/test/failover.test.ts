// A leader's crash does not reach the callers: three real nodes, the leader
// killed with SIGKILL while loops take and release locks (issue 59).
import assert from "node:assert/strict";
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { closeSync, mkdtempSync, openSync, rmSync } from "node:fs";
import http from "node:http";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { Client, type Endpoints } from "deadbolt-client";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const bin = process.env["DEADBOLT_BIN"] ?? "deadbolt";

async function freePort(): Promise<number> {
  for (;;) {
    const port = 10_000 + Math.floor(Math.random() * 20_000);
    const free = await new Promise<boolean>((resolve) => {
      const probe = createServer();
      probe.once("error", () => resolve(false));
      probe.listen(port, "127.0.0.1", () => probe.close(() => resolve(true)));
    });
    if (free) return port;
  }
}

/** The HTTP status of `path` on `endpoint`, or 0 without an answer. */
function statusOf(endpoint: string, path: string): Promise<number> {
  return new Promise((resolve) => {
    const request = http.get(`${endpoint}${path}`, { timeout: 1000 }, (response) => {
      response.resume();
      resolve(response.statusCode ?? 0);
    });
    request.on("error", () => resolve(0));
    request.on("timeout", () => request.destroy());
  });
}

/** Three nodes on loopback with a peer secret, as `scripts/cluster.sh` runs them. */
class Cluster {
  private readonly processes = new Map<number, ChildProcess>();

  private constructor(
    readonly directory: string,
    readonly ports: number[],
  ) {}

  get endpoints(): string[] {
    return this.ports.map((port) => `http://127.0.0.1:${port}`);
  }

  static async start(): Promise<Cluster> {
    const directory = mkdtempSync(join(tmpdir(), "deadbolt-failover-"));
    const ports: number[] = [];
    while (ports.length < 3) {
      const port = await freePort();
      if (!ports.includes(port)) ports.push(port);
    }
    execFileSync(bin, ["peer-secret", "new", join(directory, "peer-secret")], { stdio: "ignore" });
    const cluster = new Cluster(directory, ports);
    for (const id of [1, 2, 3]) cluster.run(id);
    const started = Date.now();
    while ((await cluster.leader()) === undefined || (await Promise.all(cluster.endpoints.map((e) => statusOf(e, "/ready")))).some((s) => s !== 200)) {
      assert.ok(Date.now() - started < 30_000, `no cluster within 30 s; see ${directory}`);
      await sleep(100);
    }
    return cluster;
  }

  /** Starts node `id` (again: it rejoins with its data). */
  run(id: number): void {
    const members = this.ports.map((port, i) => `${i + 1}=127.0.0.1:${port}`).join(",");
    const log = openSync(join(this.directory, `node${id}.log`), "a");
    const child = spawn(bin, [
      "server", "--node-id", String(id), "--listen", `127.0.0.1:${this.ports[id - 1]}`,
      "--data-dir", join(this.directory, `node${id}`), "--initial-cluster", members,
      "--peer-secret-file", join(this.directory, "peer-secret"),
    ], { stdio: ["ignore", "ignore", log] });
    closeSync(log);
    this.processes.set(id, child);
  }

  /** The node that answers /health with 200 (the leader), if any. */
  async leader(): Promise<number | undefined> {
    const answers = await Promise.all(this.endpoints.map((endpoint) => statusOf(endpoint, "/health")));
    const index = answers.indexOf(200);
    return index < 0 ? undefined : index + 1;
  }

  /** Freezes node `id` (SIGSTOP): what was sent to it stays unanswered. */
  pause(id: number): void {
    this.processes.get(id)?.kill("SIGSTOP");
  }

  async kill(id: number): Promise<void> {
    const child = this.processes.get(id);
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.kill("SIGKILL");
    child.kill("SIGCONT");
    await exited;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    for (const id of this.processes.keys()) await this.kill(id);
    rmSync(this.directory, { recursive: true, force: true });
  }
}

interface Loops {
  grants: { token: bigint; at: number }[][];
  errors: unknown[];
  stop: () => Promise<void>;
}

/** `count` loops, each taking and releasing a lock of its own in a session of its own, as fast as they can. */
function loops(endpoints: Endpoints, count: number): Loops {
  const client = new Client({ endpoints });
  const grants: Loops["grants"] = [];
  const errors: unknown[] = [];
  let running = true;
  const done = Array.from({ length: count }, async (_, i) => {
    const mine: { token: bigint; at: number }[] = [];
    grants.push(mine);
    while (running) {
      try {
        await client.withLock(`failover/${i}`, { ttl: "5s", timeout: "20s" }, async (guard) => {
          mine.push({ token: guard.token, at: Date.now() });
        });
      } catch (error) {
        errors.push(error);
      }
    }
  });
  return {
    grants,
    errors,
    stop: async () => {
      running = false;
      await Promise.all(done);
      client.close();
    },
  };
}

/** The longest a loop may go without a grant after the fault: a few election timeouts, with room for a slow machine. */
const GAP_LIMIT = 5000;

/**
 * Kills (or freezes) the leader under `running` loops; the time from the
 * fault to the next grant of each loop.
 */
async function killLeaderUnder(cluster: Cluster, running: Loops, how: "kill" | "pause" = "kill"): Promise<number[]> {
  while (running.grants.flat().length < 20) await sleep(20);
  const leader = await cluster.leader();
  assert.ok(leader !== undefined);
  const killedAt = Date.now();
  if (how === "kill") await cluster.kill(leader);
  else cluster.pause(leader);
  const deadline = killedAt + 15_000;
  const firstAfter = () => running.grants.map((loop) => loop.find((grant) => grant.at > killedAt)?.at);
  while (firstAfter().some((at) => at === undefined) && Date.now() < deadline) await sleep(20);
  await sleep(300); // a few more rounds on the new leader
  await running.stop();
  assert.deepEqual(running.errors.map(String), [], "a caller saw the failover");
  for (const loop of running.grants) {
    for (let i = 1; i < loop.length; i++) {
      assert.ok((loop[i]?.token ?? 0n) > (loop[i - 1]?.token ?? 0n), "tokens must strictly increase");
    }
  }
  const gaps = firstAfter().map((at) => (at === undefined ? Infinity : at - killedAt));
  assert.ok(gaps.every((gap) => gap < GAP_LIMIT), `every loop got a grant within ${GAP_LIMIT} ms of the fault: ${gaps.join(", ")} ms`);
  return gaps;
}

function report(what: string, gaps: number[]): string {
  const sorted = [...gaps].sort((a, b) => a - b);
  return `${what}: from the fault to each loop's next grant, median ${sorted[Math.floor(sorted.length / 2)]} ms, max ${sorted.at(-1)} ms`;
}

test("lock/release loops given every endpoint ride through kill -9 of the leader", async (t) => {
  await using cluster = await Cluster.start();
  const gaps = await killLeaderUnder(cluster, loops(cluster.endpoints, 8));
  t.diagnostic(report("every endpoint", gaps));
});

test("lock/release loops given one follower's address ride through kill -9 of the leader", async (t) => {
  await using cluster = await Cluster.start();
  const leader = await cluster.leader();
  const follower = cluster.endpoints.find((_, i) => i + 1 !== leader) as string;
  const gaps = await killLeaderUnder(cluster, loops(follower, 8));
  t.diagnostic(report("one follower", gaps));
});

test("lock/release loops given every endpoint ride through a paused leader (SIGSTOP)", async (t) => {
  await using cluster = await Cluster.start();
  // It answers nothing and closes nothing: only the missing ping answers tell.
  const gaps = await killLeaderUnder(cluster, loops(cluster.endpoints, 8), "pause");
  t.diagnostic(report("every endpoint, leader paused", gaps));
});

test("calls in flight when the leader dies are repeated, their outcome unknown", async () => {
  await using cluster = await Cluster.start();
  const leader = await cluster.leader();
  assert.ok(leader !== undefined);
  // The leader first, so that every call below is sent to it.
  const endpoints = [cluster.endpoints[leader - 1] as string, ...cluster.endpoints.filter((_, i) => i + 1 !== leader)];
  const client = new Client({ endpoints });
  const holder = await client.session({ ttl: "5s" });
  const held = await holder.lock("in-flight/held");
  const waiter = await client.session({ ttl: "5s" });
  const closing = await client.session({ ttl: "5s" });
  // Frozen, the leader takes each request into its socket and answers none;
  // killed, it resets them: each may or may not have been done, as far as
  // the client can tell.
  cluster.pause(leader);
  const inFlight = {
    open: client.session({ ttl: "5s" }),
    acquire: waiter.lock("in-flight/free", { timeout: "10s" }),
    release: held.release(),
    keepAlive: client.keepAlive(holder.handle),
    close: closing.close(),
    read: client.status("in-flight/held"),
  };
  const settled = Promise.allSettled(Object.values(inFlight));
  await sleep(200);
  await cluster.kill(leader);
  const outcomes = await settled;
  const failed = Object.keys(inFlight).flatMap((call, i) => {
    const outcome = outcomes[i];
    return outcome?.status === "rejected" ? [`${call}: ${String(outcome.reason)}`] : [];
  });
  assert.deepEqual(failed, []);
  assert.equal(await client.status("in-flight/held"), undefined, "the release went through");
  const guard = await inFlight.acquire;
  assert.ok((await client.check("in-flight/free", guard.token)) && !guard.signal.aborted);
  await guard.release();
  await (await inFlight.open).close();
  await waiter.close();
  await holder.close();
  client.close();
});

test("a held lock keeps its lease through the failover", async () => {
  await using cluster = await Cluster.start();
  const client = new Client({ endpoints: cluster.endpoints });
  const guard = await client.lock("held-through", { ttl: "3s" });
  const leader = await cluster.leader();
  assert.ok(leader !== undefined);
  await cluster.kill(leader);
  await sleep(4000); // past the TTL: only renewals through the new leader keep it
  assert.equal(guard.signal.aborted, false, `lease lost: ${String(guard.signal.reason)}`);
  assert.ok(await client.check("held-through", guard.token));
  await guard.release();
  assert.equal(await client.status("held-through"), undefined);
  client.close();
});
