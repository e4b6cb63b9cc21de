// The protocol rules, without a server.
import assert from "node:assert/strict";
import { test } from "node:test";
import { DeadboltError, ERROR_KINDS, LockBusyError, NotLeaderError, OverloadedError, WaitTimeoutError, errorFor, millis, decodeJson, SessionHandle } from "deadbolt-client";
// The retry pacing is internal: its test builds the source's own errors, as the client would see them.
import { errorFor as internalErrorFor, type DeadboltError as InternalError } from "../src/errors.js";
import { FAILOVER_CAP, Lease, OVERLOAD_CAP, RetryPause, now } from "../src/protocol.js";

test("durations read as people write them", () => {
  assert.equal(millis("30s"), 30_000);
  assert.equal(millis("500ms"), 500);
  assert.equal(millis("1m30s"), 90_000);
  assert.equal(millis("2h"), 7_200_000);
  assert.equal(millis(250), 250);
  for (const bad of ["", "30", "thirty seconds", "5x", -1]) {
    assert.throws(() => millis(bad), /duration/);
  }
});

test("a token above 2^53 round-trips exactly", () => {
  const big = 2n ** 53n + 1n; // 9007199254740993: a double would make it ...992
  const answer = decodeJson(`{"token":${big},"name":"a:1234567890123456789,","nested":[{"slot":3}]}`);
  assert.deepEqual(answer, { token: big.toString(), name: "a:1234567890123456789,", nested: [{ slot: "3" }] });
  assert.equal(BigInt((answer as { token: string }).token), big);
});

test("every server error kind has its class, with the server's message", () => {
  assert.deepEqual(ERROR_KINDS, [
    "busy", "compacted", "internal", "invalid_argument", "limit_reached", "needs_upgrade", "not_holder",
    "not_leader", "overloaded", "permission_denied", "session_expiring", "stale_token", "unauthenticated",
    "unavailable", "unknown_session", "wait_cancelled", "wait_timeout",
  ]);
  for (const kind of ERROR_KINDS) {
    const error = errorFor(kind, `the server's words about ${kind}`);
    assert.equal(error.kind, kind);
    assert.equal(error.message, `the server's words about ${kind}`);
    assert.notEqual(error.constructor, DeadboltError, kind);
  }
  assert.ok(errorFor("busy", "x") instanceof LockBusyError);
  assert.ok(errorFor("wait_timeout", "x") instanceof WaitTimeoutError);
  assert.equal((errorFor("not_leader", "x", { leader: "10.0.0.2:7070" }) as NotLeaderError).leader, "10.0.0.2:7070");
  assert.equal((errorFor("overloaded", "x", { retryAfter: 1 }) as OverloadedError).retryAfter, 1);
});

test("a handle keeps its secret out of logs", () => {
  const handle = SessionHandle.parse("12.9f8e7d");
  assert.equal(handle.id, 12n);
  assert.equal(handle.toString(), "12.9f8e7d");
  assert.doesNotMatch(JSON.stringify(handle), /9f8e7d/);
});

test("an answer with a malformed integer is refused, not read as 0", async () => {
  // Not a Deadbolt server: an HTTP/2 server that answers every call with one body.
  const { createServer } = await import("node:http2");
  let body = "";
  const server = createServer((_request, response) => response.end(body));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  assert.ok(address && typeof address === "object");
  const { Client } = await import("deadbolt-client");
  const client = new Client({ endpoints: `http://127.0.0.1:${address.port}` });
  try {
    body = `{"state":{"lock":"a","token":7},"index":9}`;
    assert.equal((await client.status("a"))?.token, 7n);
    body = `{"state":{"lock":"a"},"index":9}`;
    assert.equal((await client.status("a"))?.token, 0n);
    for (const token of ["-5", "1.5", "true", "18446744073709551616"]) {
      body = `{"state":{"lock":"a","token":${token}},"index":9}`;
      await assert.rejects(client.status("a"), (error: unknown) => {
        assert.ok(error instanceof DeadboltError, String(error));
        assert.equal(error.kind, "internal");
        assert.match(error.message, /unsigned 64-bit integer/);
        return true;
      });
    }
  } finally {
    client.close();
    server.close();
  }
});

test("a change refused on repeat after an attempt of unknown outcome reports the outcome unknown", async () => {
  // Not a Deadbolt server: each path answers its scripted answers in turn.
  // A forwarding node's 503 says the first attempt may or may not have
  // been done; a `not_leader` says it was not.
  const { createServer } = await import("node:http2");
  const { Client, StaleTokenError, UnavailableError } = await import("deadbolt-client");
  const maybe = `{"error":{"kind":"unavailable","message":"forwarding to the leader failed: the call may or may not have been done there"}}`;
  const notLeader = `{"error":{"kind":"not_leader","message":"no leader yet"}}`;
  const stale = `{"error":{"kind":"stale_token","message":"token 5 is below the fence 6"}}`;
  const notHolder = `{"error":{"kind":"not_holder","message":"session 1 does not hold lock"}}`;
  let script: Record<string, string[]> = {};
  const server = createServer((request, response) => {
    const path = (request.url ?? "").split("?")[0] ?? "";
    const answer = script[path]?.shift() ?? `{"session_id":1,"session_secret":"s","ttl_ms":30000,"token":5}`;
    response.statusCode = answer.includes(`"error"`) ? 503 : 200;
    response.end(answer);
  });
  // It speaks no framed calls: the client's preface ends that connection,
  // and acquires and releases come over HTTP/2 instead.
  server.on("sessionError", () => {});
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  assert.ok(address && typeof address === "object");
  const client = new Client({ endpoints: `http://127.0.0.1:${address.port}` });
  const unknown = (error: unknown): boolean => {
    assert.ok(error instanceof UnavailableError, String(error));
    assert.equal(error.kind, "unavailable");
    assert.equal(error.outcomeUnknown, true);
    assert.match(error.message, /may have been/);
    assert.match(error.message, /token 5 is below the fence 6/);
    return true;
  };
  try {
    script = { "/v1/store/put": [maybe, stale] };
    await assert.rejects(client.put("k", "v", 5n), unknown);
    script = { "/v1/store/put": [notLeader, stale] };
    await assert.rejects(client.put("k", "v", 5n), StaleTokenError);
    script = { "/v1/store/put": [stale] };
    await assert.rejects(client.put("k", "v", 5n), StaleTokenError);
    const session = await client.session();
    script = { "/v1/lock/release": [maybe, stale] };
    await assert.rejects((await session.lock("a")).release(), unknown);
    // "Not holder" after a release whose answer was lost: it went through.
    script = { "/v1/lock/release": [maybe, notHolder] };
    await (await session.lock("a")).release();
    await session.close();
  } finally {
    await client.close();
    server.close();
  }
});

test("a failover is retried within a quarter second, an overload within a second", () => {
  // Issue 59: a pause of up to a second after an election made callers wait for nothing.
  const cases: [InternalError, number][] = [
    [internalErrorFor("not_leader", "x"), FAILOVER_CAP],
    [internalErrorFor("unavailable", "x"), FAILOVER_CAP],
    [internalErrorFor("overloaded", "x"), OVERLOAD_CAP],
  ];
  for (const [error, cap] of cases) {
    const pause = new RetryPause();
    const delays = Array.from({ length: 200 }, () => pause.after(error));
    assert.ok(delays.every((delay) => delay >= 0 && delay <= cap), `${error.kind}: ${Math.max(...delays)}`);
    assert.ok(Math.max(...delays) > cap / 2, `${error.kind} never grew`);
  }
  assert.ok(FAILOVER_CAP < OVERLOAD_CAP);
});

test("a renewal answered within the margin does not revive the lease", () => {
  // The Go client's frozen-server test found it: an answer that came once
  // the signal had aborted renewed the lease, and lostReason read undefined again.
  const lease = new Lease(7n, now() + 1000);
  assert.equal(lease.renewed(now(), 30_000, 2000), false);
  assert.ok(lease.lostReason(2000));
  assert.equal(lease.renewed(now(), 30_000, 500), true);
  assert.equal(lease.lostReason(2000), undefined);
});
