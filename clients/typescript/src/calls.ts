/**
 * Every request the client makes, as data: method, path, body, how to read
 * the answer, and whether repeating it after an outage is safe. Also the
 * records answers are read into.
 */

import { errorFor } from "./errors.js";
import { type Json, int, list, object, text, u64 } from "./protocol.js";

export type Body = Record<string, string | number | bigint | boolean | undefined>;
type Answer = Record<string, Json>;

export interface Call<T> {
  method: "GET" | "POST";
  path: string;
  body: Body | undefined;
  parse: (answer: Answer) => T;
  /**
   * A change of state (every call is repeated through a failover: reads,
   * and writes that do the same thing twice). A change's repeat that is
   * refused after an attempt whose answer was lost does not say whether
   * that attempt was done (see `Client.retrying`).
   */
  changes: boolean;
}

function get<T>(path: string, parse: (answer: Answer) => T, query: Record<string, string>): Call<T> {
  return { method: "GET", path: `${path}?${new URLSearchParams(query)}`, body: undefined, parse, changes: false };
}

function post<T>(path: string, body: Body, parse: (answer: Answer) => T, changes = true): Call<T> {
  return { method: "POST", path, body, parse, changes };
}

/** A session's id and secret: together, what it takes to act on the session. */
export class SessionHandle {
  constructor(
    readonly id: bigint,
    private readonly secret: string,
  ) {}

  /** The CLI's `ID.SECRET` form. */
  toString(): string {
    return `${this.id}.${this.secret}`;
  }

  /** The secret stays out of `JSON.stringify` and `console.log`. */
  toJSON(): { id: string } {
    return { id: this.id.toString() };
  }

  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return `SessionHandle { id: ${this.id} }`;
  }

  static parse(handle: string): SessionHandle {
    const dot = handle.indexOf(".");
    if (dot <= 0 || !/^\d+$/.test(handle.slice(0, dot)) || dot === handle.length - 1) {
      throw new TypeError(`${JSON.stringify(handle)} is not a session handle (ID.SECRET)`);
    }
    return new SessionHandle(BigInt(handle.slice(0, dot)), handle.slice(dot + 1));
  }

  fields(): Body {
    return { session_id: this.id, session_secret: this.secret };
  }

  /**
   * The session's fields and then `extra`'s, in a new body. Copied by
   * assignment: as an object spread (`{ ...handle.fields(), ...extra }`)
   * this cost 2.6-4.1 µs a call in Node 20, two of them in every lock's
   * acquire and release; assigned, 20-40 ns.
   */
  fieldsWith(extra: Body): Body {
    const body = this.fields();
    for (const key in extra) body[key] = extra[key];
    return body;
  }
}

/** Who holds a lock, with which token, and who waits, in queue order. */
export interface LockStatus {
  name: string;
  holder: bigint;
  token: bigint;
  waiters: bigint[];
  /** The log index of the state read: a watch after it follows on from it. */
  index: bigint;
  /** A read/write lock's: "shared" or "exclusive" ("" for a lock). */
  mode: string;
  /** A read/write lock's holders. */
  holders: { sessionId: bigint; mode: string; token: bigint }[];
  /** In lock-delay: the holder's session expired; nobody holds it until the delay ends. */
  lockDelay: boolean;
}

function lockStatus(state: Record<string, Json>, index: bigint): LockStatus {
  return {
    name: text(state["lock"]),
    holder: u64(state["holder_session_id"]),
    token: u64(state["token"]),
    waiters: list(state["waiter_session_ids"]).map(u64),
    index,
    mode: text(state["mode"]),
    holders: list(state["holders"]).map((hold) => {
      const h = object(hold) ?? {};
      return { sessionId: u64(h["session_id"]), mode: text(h["mode"]), token: u64(h["token"]) };
    }),
    lockDelay: state["lock_delay"] === true,
  };
}

/** One semaphore permit: its own fencing token and its slot. */
export interface Permit {
  token: bigint;
  slot: number;
}

function permits(answer: Record<string, Json>): Permit[] {
  return list(answer["permits"]).map((permit) => {
    const p = object(permit) ?? {};
    return { token: u64(p["token"]), slot: int(p["slot"]) };
  });
}

export interface SemaphoreStatus {
  name: string;
  capacity: number;
  holders: { sessionId: bigint; permits: Permit[] }[];
  waiters: { sessionId: bigint; count: number }[];
  index: bigint;
}

/** An election's leader, its term (a fencing token), its value, and the candidates behind it. */
export interface Leader {
  sessionId: bigint;
  term: bigint;
  value: string;
  candidates: bigint[];
  index: bigint;
}

/** A fenced-store key: its value (`undefined` if none) and its fence. */
export interface Stored {
  value: string | undefined;
  fence: bigint;
}

export interface AuditEntry {
  seq: bigint;
  atMs: number;
  sessionId: bigint;
  token: bigint;
  /** granted, released, closed, expired, abandoned or delayed. */
  what: string;
  identity: string;
}

/** One change, as the log applied it; watch `after` its `id` to go on from exactly here. */
export interface WatchEvent {
  index: bigint;
  position: number;
  id: string;
  /** granted, released, closed, expired, abandoned, queued, left_queue, delayed, proclaimed, put or deleted. */
  kind: string;
  name: string;
  sessionId: bigint;
  identity: string;
  token: bigint;
  mode: string;
  permits: number;
  value: string | undefined;
}

/** How long one long poll of a watch waits for events (the server's default), in ms. */
export const WATCH_POLL = 30_000;

export const calls = {
  /** One long poll: the events after `after` (from now without it), and the `after` of the next. */
  watchPoll(name: string, prefix: boolean, after: string | undefined): Call<{ events: WatchEvent[]; cursor: string }> {
    const query: Record<string, string> = { name, timeout_ms: String(WATCH_POLL) };
    if (prefix) query["prefix"] = "true";
    if (after) query["after"] = after;
    return get("/v1/watch", (a) => ({
      events: list(a["events"]).map((event) => {
        const e = object(event) ?? {};
        return {
          index: u64(e["index"]),
          position: int(e["position"]),
          id: text(e["id"]),
          kind: text(e["kind"]),
          name: text(e["name"]),
          sessionId: u64(e["session_id"]),
          identity: text(e["identity"]),
          token: u64(e["token"]),
          mode: text(e["mode"]),
          permits: int(e["permits"]),
          value: typeof e["value"] === "string" ? e["value"] : undefined,
        };
      }),
      cursor: text(a["cursor"]) || (after ?? ""),
    }), query);
  },


  status(name: string): Call<LockStatus | undefined> {
    return get("/v1/lock/status", (a) => {
      const state = object(a["state"]);
      return state ? lockStatus(state, u64(a["index"])) : undefined;
    }, { lock: name });
  },

  locksPage(after: string): Call<{ page: LockStatus[]; more: boolean }> {
    const query: Record<string, string> = after ? { limit: "200", after } : { limit: "200" };
    return get("/v1/locks", (a) => {
      const page = list(a["locks"]).map((state) => lockStatus(object(state) ?? {}, u64(a["index"])));
      return { page, more: a["more"] === true && page.length > 0 };
    }, query);
  },

  history(name: string): Call<AuditEntry[]> {
    return get("/v1/lock/history", (a) =>
      list(a["entries"]).map((entry) => {
        const e = object(entry) ?? {};
        return {
          seq: u64(e["seq"]),
          atMs: int(e["at_ms"]),
          sessionId: u64(e["session_id"]),
          token: u64(e["token"]),
          what: text(e["what"]),
          identity: text(e["identity"]),
        };
      }), { lock: name });
  },

  check(name: string, token: bigint): Call<boolean> {
    return get("/v1/lock/check", (a) => a["current"] === true, { lock: name, token: token.toString() });
  },

  semaphoreStatus(name: string): Call<SemaphoreStatus | undefined> {
    return get("/v1/semaphore/status", (a) => {
      const state = object(a["state"]);
      if (!state) return undefined;
      return {
        name: text(state["semaphore"]),
        capacity: int(state["capacity"]),
        holders: list(state["holders"]).map((holder) => {
          const h = object(holder) ?? {};
          return { sessionId: u64(h["session_id"]), permits: permits(h) };
        }),
        waiters: list(state["waiters"]).map((waiter) => {
          const w = object(waiter) ?? {};
          return { sessionId: u64(w["session_id"]), count: int(w["count"]) };
        }),
        index: u64(a["index"]),
      };
    }, { semaphore: name });
  },

  leader(election: string): Call<Leader | undefined> {
    return get("/v1/election/leader", (a) => {
      const leader = object(a["leader"]);
      if (!leader) return undefined;
      return {
        sessionId: u64(leader["session_id"]),
        term: u64(leader["term"]),
        value: text(leader["value"]),
        candidates: list(a["candidate_session_ids"]).map(u64),
        index: u64(a["index"]),
      };
    }, { election });
  },

  put(key: string, value: string, token: bigint, lock: string | undefined): Call<bigint> {
    return post("/v1/store/put", { key, value, token, lock }, (a) => u64(a["fence"]));
  },

  get(key: string, token: bigint | undefined, lock: string | undefined): Call<Stored> {
    const parse = (a: Answer): Stored => ({
      value: a["found"] === true ? text(a["value"]) : undefined,
      fence: u64(a["fence"]),
    });
    if (token === undefined && lock === undefined) return get("/v1/store/get", parse, { key });
    return post("/v1/store/get", { key, token, lock }, parse);
  },

  delete(key: string, token: bigint): Call<boolean> {
    return post("/v1/store/delete", { key, token }, (a) => a["existed"] === true);
  },

  /**
   * Repeated through a failover, though not idempotent: a repeat after an
   * attempt whose answer was lost may open a second session, which nobody
   * knows of, holds nothing, and expires one TTL later.
   */
  openSession(ttlMs: number): Call<{ handle: SessionHandle; ttlMs: number }> {
    return post("/v1/session/open", { ttl_ms: Math.round(ttlMs) }, (a) => ({
      handle: new SessionHandle(u64(a["session_id"]), text(a["session_secret"])),
      ttlMs: int(a["ttl_ms"]) || ttlMs,
    }));
  },

  /** Not a change whose outcome matters: a refused keepalive (the session gone) is the truth either way. */
  keepAlive(handle: SessionHandle): Call<number> {
    return post("/v1/session/keepalive", handle.fields(), (a) => int(a["ttl_ms"]), false);
  },

  closeSession(handle: SessionHandle): Call<void> {
    return post("/v1/session/close", handle.fields(), () => undefined);
  },

  proclaim(handle: SessionHandle, election: string, term: bigint, value: string): Call<void> {
    return post("/v1/election/proclaim", handle.fieldsWith({ election, term, value }), () => undefined);
  },
};

/** What an acquire answered: the token (a lock's, the first permit's, or the term) and any permits. */
export interface Grant {
  token: bigint;
  permits: Permit[];
}

/** Every grant has a token above zero: an answer without one is not a grant (a test caught an empty answer read as token 0). */
function grantToken(token: bigint): bigint {
  if (token <= 0n) throw errorFor("internal", "the server answered an acquire without a token");
  return token;
}

/**
 * What an acquire takes, and how it is released and looked for: a lock (in
 * a read/write mode or none), permits of a semaphore, or an election's
 * leadership.
 */
export class Target {
  private constructor(
    readonly kind: "lock" | "semaphore" | "election",
    readonly name: string,
    readonly fields: Body,
  ) {}

  static lock(name: string, mode?: "shared" | "exclusive"): Target {
    return new Target("lock", name, { lock: name, mode });
  }

  static semaphore(name: string, capacity: number, count: number): Target {
    return new Target("semaphore", name, { semaphore: name, capacity, count });
  }

  static election(name: string, value: string): Target {
    return new Target("election", name, { election: name, value });
  }

  acquire(body: Body): Call<Grant> {
    if (this.kind === "semaphore") {
      return post("/v1/semaphore/acquire", body, (a) => {
        const granted = permits(a);
        return { token: grantToken(u64(a["token"]) || (granted[0]?.token ?? 0n)), permits: granted };
      });
    }
    if (this.kind === "election") {
      return post("/v1/election/campaign", body, (a) => ({ token: grantToken(u64(a["term"])), permits: [] }));
    }
    return post("/v1/lock/acquire", body, (a) => ({ token: grantToken(u64(a["token"])), permits: [] }));
  }

  release(handle: SessionHandle, token: bigint): Call<void> {
    const path = { lock: "/v1/lock/release", semaphore: "/v1/semaphore/release", election: "/v1/election/resign" }[this.kind];
    return post(path, handle.fieldsWith({ lock: this.name, token }), () => undefined);
  }

  /** The token `sessionId` holds this with, if it does: for the clean-up of an abandoned acquire. */
  heldBy(sessionId: bigint): Call<bigint | undefined> {
    if (this.kind === "semaphore") {
      const status = calls.semaphoreStatus(this.name);
      return { ...status, parse: (a) => status.parse(a)?.holders.find((h) => h.sessionId === sessionId)?.permits[0]?.token };
    }
    if (this.kind === "election") {
      const leader = calls.leader(this.name);
      return { ...leader, parse: (a) => {
        const found = leader.parse(a);
        return found?.sessionId === sessionId ? found.term : undefined;
      } };
    }
    const status = calls.status(this.name);
    return { ...status, parse: (a) => {
      const found = status.parse(a);
      if (!found || found.lockDelay) return undefined;
      const hold = found.holders.find((h) => h.sessionId === sessionId);
      if (hold) return hold.token;
      return found.holders.length === 0 && found.holder === sessionId ? found.token : undefined;
    } };
  }
}
