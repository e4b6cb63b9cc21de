// The client against a real server (the package's own test helper).
import assert from "node:assert/strict";
import { test } from "node:test";
import { Client, type Guard, InvalidArgumentError, LeaseLostError, PermissionDeniedError, SessionHandle, UnavailableError, UnknownSessionError, WaitTimeoutError } from "deadbolt-client";
import { startServer } from "deadbolt-client/testing";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

test("await using gives a bigint token and releases at the end of the block", async () => {
  await using server = await startServer();
  const client = new Client({ endpoints: server.endpoint });
  let first: bigint;
  {
    await using guard = await client.lock("invoice-981", { ttl: "30s", timeout: "5s" });
    first = guard.token;
    assert.equal(typeof guard.token, "bigint");
    assert.equal((await client.status("invoice-981"))?.token, guard.token);
  }
  assert.equal(await client.status("invoice-981"), undefined);
  const later = await client.withLock("invoice-981", {}, async (guard) => guard.token);
  assert.ok(later > first);
  client.close();
});

test("a lock not acquired throws before the work runs", async () => {
  await using server = await startServer();
  const client = new Client({ endpoints: server.endpoint });
  const held = await client.lock("busy");
  let ran = false;
  await assert.rejects(
    client.withLock("busy", { timeout: "300ms" }, async () => {
      ran = true;
    }),
    WaitTimeoutError,
  );
  assert.equal(await client.tryLock("busy"), null);
  assert.equal(ran, false);
  await held.release();
  client.close();
});

test("renewal keeps the lock through several TTLs", async () => {
  await using server = await startServer();
  const client = new Client({ endpoints: server.endpoint });
  const guard = await client.lock("renewed", { ttl: "1s" });
  await sleep(3000);
  assert.equal(guard.signal.aborted, false);
  assert.equal((await client.status("renewed"))?.token, guard.token);
  await guard.release();
  client.close();
});

test("a frozen server aborts guard.signal, and the block's end says so", async () => {
  await using server = await startServer();
  const client = new Client({ endpoints: server.endpoint });
  let token = 0n;
  server.pause();
  const frozenAt = Date.now();
  try {
    await assert.rejects(async () => {
      await using guard = await (async () => {
        server.resume();
        const taken = await client.lock("frozen", { ttl: "1s" });
        server.pause();
        return taken;
      })();
      token = guard.token;
      await new Promise((resolve) => guard.signal.addEventListener("abort", resolve));
      assert.ok(guard.signal.reason instanceof LeaseLostError);
    }, LeaseLostError);
  } finally {
    server.resume();
  }
  assert.ok(Date.now() - frozenAt < 5000);
  const next = await client.lock("frozen", { timeout: "10s" });
  assert.ok(next.token > token);
  await next.release();
  client.close();
});

test("aborting a waiting acquire gives its place back", async () => {
  await using server = await startServer();
  const client = new Client({ endpoints: server.endpoint });
  const holder = await client.lock("cancelled");
  const session = await client.session({ ttl: "30s" });
  const controller = new AbortController();
  const waiting = session.lock("cancelled", { signal: controller.signal });
  while ((await session.queuePosition("cancelled")) !== 0) await sleep(20);
  controller.abort(new Error("gave up"));
  await assert.rejects(waiting, /gave up/);
  // The server drops a wait whose connection closed, after its 3 s grace.
  const deadline = Date.now() + 10_000;
  while ((await session.queuePosition("cancelled")) !== undefined) {
    assert.ok(Date.now() < deadline, "the aborted wait kept its place");
    await sleep(100);
  }
  await holder.release();
  assert.equal(await client.status("cancelled"), undefined);
  await session.close();
  client.close();
});

test("errors carry their kind and the server's words", async () => {
  await using server = await startServer();
  const client = new Client({ endpoints: server.endpoint });
  await assert.rejects(client.session({ ttl: "100ms" }), InvalidArgumentError);
  await using session = await client.session();
  await assert.rejects(session.tryLock(""), InvalidArgumentError);
  await assert.rejects(client.keepAlive(new SessionHandle(session.id, "0".repeat(32))), PermissionDeniedError);
  assert.ok((await client.keepAlive(session.handle)) > 0);
  const nobody = new Client({ endpoints: "127.0.0.1:9" });
  await assert.rejects(nobody.session(), (error: unknown) => error instanceof UnavailableError && /127\.0\.0\.1:9/.test(error.message));
  client.close();
});

test("read/write locks, semaphores and elections", async () => {
  await using server = await startServer();
  const client = new Client({ endpoints: server.endpoint });
  await using a = await client.session({ ttl: "10s" });
  await using b = await client.session({ ttl: "10s" });
  await using c = await client.session({ ttl: "10s" });
  const reader = await a.readLock("catalog");
  const alsoReading = await b.tryReadLock("catalog");
  assert.ok(alsoReading !== null && alsoReading.token > reader.token);
  assert.equal(await c.tryWriteLock("catalog"), null);
  await alsoReading.release();
  const permit = await a.semaphore("gpus", 1);
  assert.equal(permit.permits[0]?.slot, 0);
  assert.equal(await b.trySemaphore("gpus", 1), null);
  const leadership = await a.campaign("scheduler", "10.0.0.7:8080");
  await leadership.proclaim("10.0.0.7:9090");
  const leader = await client.leader("scheduler");
  assert.equal(leader?.term, leadership.token);
  assert.equal(leader?.value, "10.0.0.7:9090");
  await reader.release();
  await permit.release();
  await leadership.resign();
  assert.equal(await client.leader("scheduler"), undefined);
  client.close();
});

test("the fenced store refuses an older holder", async () => {
  await using server = await startServer();
  const client = new Client({ endpoints: server.endpoint });
  const first = await client.lock("accounts/42");
  assert.equal(await client.put("balance/42", "100", first.token), first.token);
  await first.release();
  const second = await client.lock("accounts/42");
  await client.put("balance/42", "150", second.token, { lock: "accounts/42" });
  await assert.rejects(client.put("balance/42", "90", first.token), /stale|fence|token/i);
  assert.deepEqual(await client.get("balance/42"), { value: "150", fence: second.token });
  assert.ok(await client.check("accounts/42", second.token));
  await second.release();
  client.close();
});

test("a watch sees each change and resumes after an event", async () => {
  await using server = await startServer();
  const client = new Client({ endpoints: server.endpoint });
  const first = await client.withLock("jobs/nightly", {}, async (guard) => guard.token);
  const events = client.watch("jobs/", { prefix: true, after: 0n });
  const granted = (await events.next()).value;
  assert.deepEqual([granted?.kind, granted?.name, granted?.token], ["granted", "jobs/nightly", first]);
  const released = (await events.next()).value;
  assert.equal(released?.kind, "released");
  await events.return(undefined);
  const second = await client.withLock("jobs/weekly", {}, async (guard) => guard.token);
  for await (const event of client.watch("jobs/", { prefix: true, after: released?.id ?? "" })) {
    assert.deepEqual([event.kind, event.name, event.token], ["granted", "jobs/weekly", second]);
    break;
  }
  client.close();
});

test("a wait ends with the lease when the server stops answering", async () => {
  await using server = await startServer();
  const client = new Client({ endpoints: server.endpoint });
  const holder = await client.lock("held", { ttl: "30s" });
  const waiter = await client.session({ ttl: "1s" });
  const waiting = waiter.lock("held");
  waiting.catch(() => {});
  while ((await waiter.queuePosition("held")) === undefined) await sleep(20);
  server.pause();
  try {
    const started = Date.now();
    await assert.rejects(waiting, LeaseLostError);
    assert.ok(Date.now() - started < 5000);
  } finally {
    server.resume();
  }
  await holder.release();
  client.close();
});

test("client.lock shares one session between locks, and opens another only for a name it already holds", async () => {
  await using server = await startServer();
  const client = new Client({ endpoints: server.endpoint });
  const a = await client.lock("shared/a", { ttl: "10s" });
  const [b, c] = (await Promise.all(["shared/b", "shared/c"].map((name) => client.lock(name, { ttl: "10s" })))) as [Guard, Guard];
  assert.ok(a.session === b.session && b.session === c.session);
  assert.equal((await client.status("shared/b"))?.holder, a.session.id);
  // The same name again waits in FIFO order, in a session of its own.
  const second = client.lock("shared/a", { ttl: "10s" });
  while ((await client.status("shared/a"))?.waiters.length !== 1) await sleep(20);
  await a.release();
  const next = await second;
  assert.notEqual(next.session, a.session);
  assert.ok(next.token > a.token);
  // Released: that guard's signal is aborted, the others' are not.
  assert.equal(a.signal.aborted, true);
  assert.equal((a.signal.reason as Error).name, "AbortError");
  assert.equal(b.signal.aborted, false);
  for (const guard of [b, c, next]) await guard.release();
  // With ownSession, a session of its own, closed on release.
  const own = await client.lock("shared/own", { ttl: "10s", ownSession: true });
  assert.notEqual(own.session, b.session);
  await own.release();
  assert.equal(own.session.signal.aborted, true);
  await client.close();
  assert.equal(b.session.signal.aborted, true, "client.close() closes the shared session");
});

test("a shared session that held nothing for a renewal interval is closed", async () => {
  await using server = await startServer();
  const client = new Client({ endpoints: server.endpoint });
  const guard = await client.lock("idle", { ttl: "1s" });
  await guard.release();
  const deadline = Date.now() + 5000;
  while (!guard.session.signal.aborted) {
    assert.ok(Date.now() < deadline, "the idle session was renewed on and on");
    await sleep(50);
  }
  assert.ok(guard.session.signal.reason instanceof UnknownSessionError);
  const again = await client.lock("idle", { ttl: "1s" });
  assert.notEqual(again.session, guard.session);
  await again.release();
  await client.close();
});

test("every lock of a shared session stops its work before anyone else is granted one", async () => {
  await using server = await startServer();
  const client = new Client({ endpoints: server.endpoint });
  const names = ["fate/1", "fate/2", "fate/3"];
  const held = await Promise.all(names.map((name) => client.lock(name, { ttl: "1s" })));
  const stopped: number[] = [];
  for (const guard of held) guard.signal.addEventListener("abort", () => stopped.push(Date.now()));
  const other = new Client({ endpoints: server.endpoint });
  server.pause();
  try {
    await sleep(1500); // past the lease: no renewal got through
  } finally {
    server.resume();
  }
  const next = await Promise.all(names.map(async (name) => {
    const guard = await other.lock(name, { timeout: "10s", ownSession: true });
    return { guard, at: Date.now() };
  }));
  const granted = next.map(({ at }) => at);
  assert.equal(stopped.length, names.length, "every guard's signal aborted");
  assert.ok(Math.max(...stopped) < Math.min(...granted), `stopped at ${stopped}, others granted at ${granted}`);
  for (const [i, { guard }] of next.entries()) assert.ok(guard.token > (held[i] as Guard).token);
  for (const { guard } of next) await guard.release();
  await client.close();
  await other.close();
});
