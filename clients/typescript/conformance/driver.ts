// The TypeScript client's conformance driver (crates/conformance/README.md):
// JSON commands on stdin, one per line, each run concurrently through the
// package's public API; one JSON answer per command on stdout, by id.
import { createInterface } from "node:readline";
import { Client, DeadboltError, type Guard, type Session, SessionHandle } from "deadbolt-client";

let client: Client | undefined;
const sessions = new Map<string, Session>();
const guards = new Map<string, Guard>();

type Command = Record<string, unknown> & { id: number; op: string };

function need(): Client {
  if (!client) throw new Error("connect first");
  return client;
}

function session(command: Command): Session {
  const found = sessions.get(String(command["session"]));
  if (!found) throw new Error(`no session ${String(command["session"])} here`);
  return found;
}

function granted(guard: Guard | null): Record<string, unknown> {
  if (!guard) return { token: null };
  guards.set(`${guard.session.id}/${guard.name}`, guard);
  return { token: guard.token };
}

async function run(command: Command): Promise<Record<string, unknown>> {
  const name = String(command["name"]);
  switch (command.op) {
    case "connect":
      client = new Client({
        endpoints: command["endpoints"] as string[],
        ca: command["ca"] as string | undefined,
        cert: command["cert"] as string | undefined,
        key: command["key"] as string | undefined,
        token: (command["token"] as string | null | undefined) ?? undefined,
      });
      return {};
    case "open": {
      const opened = await need().session({ ttl: Number(command["ttl_ms"]) });
      sessions.set(opened.id.toString(), opened);
      return { session: opened.id };
    }
    case "lock": {
      const timeout = command["timeout_ms"];
      return granted(await session(command).lock(name, timeout === undefined ? {} : { timeout: Number(timeout) }));
    }
    case "try_lock":
      return granted(await session(command).tryLock(name));
    case "release": {
      const key = `${String(command["session"])}/${name}`;
      const guard = guards.get(key);
      if (!guard) throw new Error(`${key} is not held here`);
      guards.delete(key);
      await guard.release();
      return {};
    }
    case "lost": {
      const reason = await session(command).waitLost(Number(command["margin_ms"]));
      return { reason: reason?.kind === "unknown_session" ? "closed" : "expired" };
    }
    case "close":
      await session(command).close();
      sessions.delete(String(command["session"]));
      return {};
    case "status": {
      const status = await need().status(name);
      return status ? { holder: status.holder, token: status.token, waiters: status.waiters } : { holder: null, token: null, waiters: [] };
    }
    case "handle": {
      const [id, secret] = session(command).handle.toString().split(".");
      return { session_id: BigInt(id ?? "0"), secret };
    }
    case "keep_alive_handle":
      return { ttl_ms: await need().keepAlive(new SessionHandle(BigInt(String(command["session_id"])), String(command["secret"]))) };
    default:
      throw new DeadboltError("invalid_argument", `unknown op ${command.op}`);
  }
}

// bigints as exact JSON integers.
const encode = (value: unknown): string =>
  JSON.stringify(value, (_, v: unknown) => (typeof v === "bigint" ? `\u0000${v}` : v)).replace(/"\\u0000(\d+)"/g, "$1");

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const command = JSON.parse(line) as Command;
  void run(command).then(
    (ok) => process.stdout.write(`${encode({ id: command.id, ok })}\n`),
    (error: unknown) => {
      const kind = error instanceof DeadboltError ? error.kind : "driver";
      const message = error instanceof Error ? error.message : String(error);
      process.stdout.write(`${encode({ id: command.id, error: { kind, message } })}\n`);
    },
  );
}
