// The Client's constructor: endpoints as a string, a list, or options; anything else a TypeError.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Client, UnavailableError } from "deadbolt-client";
import { startServer } from "deadbolt-client/testing";

test("the endpoint given as a string or an array is the one used", async () => {
  await using server = await startServer();
  const port = new URL(server.endpoint).port;
  const dead = "127.0.0.1:9"; // nothing listens on the discard port
  const forms = [
    new Client(server.endpoint),
    new Client(`127.0.0.1:${port}`),
    new Client(`http://${dead},${server.endpoint}`),
    new Client([dead, server.endpoint]),
    new Client([server.endpoint], { token: undefined }),
    new Client({ endpoints: [server.endpoint] }),
    new Client({ endpoints: server.endpoint }),
  ];
  for (const client of forms) {
    await client.withLock("constructed", { timeout: "5s" }, async (guard) => assert.ok(guard.token > 0n));
    client.close();
  }
});

test("a string is not ignored for the default endpoint", async () => {
  // Before, `new Client("...")` read the string as empty options and went to 127.0.0.1:7070.
  const client = new Client("http://127.0.0.1:9");
  await assert.rejects(client.lock("x", { timeout: "300ms" }), (error: unknown) => error instanceof UnavailableError && /127\.0\.0\.1:9\b/.test(error.message));
  client.close();
});

test("anything else is a TypeError", () => {
  const bad: unknown[][] = [
    [7070],
    [null],
    [true],
    [() => "127.0.0.1:7070"],
    [[]],
    [[7070]],
    [["127.0.0.1:7070", ""]],
    [""],
    [" , "],
    ["ftp://127.0.0.1:7070"],
    ["http://[::1"],
    [{ endpoints: 7070 }],
    [{ endpoints: [] }],
    [{ endpoints: {} }],
    [{ endpoint: "127.0.0.1:7070" }], // a misspelt option is not silently the default
    [{ token: 42 }],
    [{ ca: true }],
    [{ cert: "client.pem" }], // without its key
    ["127.0.0.1:7070", "token"],
    ["127.0.0.1:7070", { endpoints: "127.0.0.1:7071" }],
    [{ endpoints: "127.0.0.1:7070" }, { token: "t" }],
    [undefined, { token: "t" }],
  ];
  for (const args of bad) {
    assert.throws(() => new (Client as unknown as new (...a: unknown[]) => Client)(...args), TypeError, JSON.stringify(args, (_k, v: unknown) => (typeof v === "function" ? "fn" : v)));
  }
  // The defaults still work.
  new Client().close();
  new Client(undefined).close();
  new Client({}).close();
  new Client({ endpoints: "127.0.0.1:7070", token: "t", ca: undefined }).close();
});
