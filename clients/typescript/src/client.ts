/**
 * `Client`, `Session` (a lease renewed in the background) and `Guard` (a
 * held lock and its fencing token). The rules are `protocol.ts`'s and the
 * requests `calls.ts`'; this file decides when to send and retry.
 *
 * `client.lock`, `tryLock` and `withLock` take their locks in sessions the
 * client shares (`SessionPool`, as etcd's `concurrency.Session` is shared),
 * not in a session each: a session of its own cost every lock two more
 * round trips (open and close) and a watchdog of its own, and the
 * README's `withLock` loop did half the pairs per second of an explicit
 * session's (issue 60). The price is shared fate: a lost lease loses every
 * lock of that session at once, which the docs say; `ownSession` keeps a
 * lock's loss its own.
 */

import { type Body, type Call, type Grant, type Leader, type LockStatus, type Permit, type SemaphoreStatus, SessionHandle, type Stored, type AuditEntry, type WatchEvent, Target, WATCH_POLL, calls } from "./calls.js";
import { DeadboltError, InvalidArgumentError, LeaseLostError, LockBusyError, NotLeaderError, UnavailableError, UnknownSessionError, WaitTimeoutError } from "./errors.js";
import { type Duration, Endpoints as EndpointRing, Lease, encodeBody, endsSession, isTransient, mayHaveBeenDone, millis, nextAttempt, normalize, now, parseAnswer, RetryPause, unknownOutcome, unreachable } from "./protocol.js";
import { FramedCalls, FramedRefused } from "./framed.js";
import { Deadlines, type Lane, type TlsFiles, Transport, TransportError } from "./transport.js";

/** How long a call that does not wait on a lock may take before it counts as unanswered. */
const CALL_TIMEOUT = 10_000;
const CONNECT_TIMEOUT = 2_000;
/** How long after an acquire is abandoned its clean-up looks for a grant. */
const CLEAN_UP_DELAY = 1_000;
/** How long `client.close()` waits for each shared session's close. */
const CLOSE_AT_EXIT = 1_000;

/**
 * Where the cluster is: one URL (`"http://10.0.0.1:7070"`, or a bare
 * `host:port`), several comma-separated in one string, or an array of them.
 * Give every node's, so that the client gets in while one is down.
 */
export type Endpoints = string | readonly string[];

export interface ClientOptions extends TlsFiles {
  /** The servers (see `Endpoints`). Default `http://127.0.0.1:7070`. */
  endpoints?: Endpoints | undefined;
  /** A bearer token from `deadbolt acl token create`. */
  token?: string | undefined;
}

/** The options after an endpoint list: `new Client(["a:7070", "b:7070"], { token })`. */
export type ConnectOptions = Omit<ClientOptions, "endpoints">;

const OPTION_NAMES = new Set(["endpoints", "token", "ca", "cert", "key"]);

function describe(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  if (typeof value === "string") return JSON.stringify(value);
  if (typeof value === "object") return "an object";
  return `${typeof value} ${String(value)}`;
}

/**
 * The constructor's arguments as one checked options object: every
 * mistake (a number, a misspelt option, an empty list, a field of the
 * wrong type) is a `TypeError` here rather than a client quietly talking
 * to 127.0.0.1:7070.
 */
function clientArguments(first: unknown, second: unknown): { urls: string[]; options: ClientOptions } {
  const usage = "new Client(endpoints?, options?) takes an endpoint URL string, an array of them, or an options object";
  let options: Record<string, unknown>;
  let endpoints: unknown;
  const plain = (value: unknown): value is Record<string, unknown> =>
    typeof value === "object" && value !== null && !Array.isArray(value);
  if (typeof first === "string" || Array.isArray(first)) {
    if (second !== undefined && !plain(second)) throw new TypeError(`${usage}; its options must be an object, not ${describe(second)}`);
    options = second ?? {};
    if (options["endpoints"] !== undefined) throw new TypeError(`${usage}: the endpoints were given twice (as the first argument and as options.endpoints)`);
    endpoints = first;
  } else if (first === undefined) {
    if (second !== undefined) throw new TypeError(`${usage}: options come second only after the endpoints`);
    options = {};
  } else if (plain(first)) {
    if (second !== undefined) throw new TypeError(`${usage}: options come second only after the endpoints`);
    options = first;
    endpoints = options["endpoints"];
  } else {
    throw new TypeError(`${usage}, not ${describe(first)}`);
  }
  for (const name of Object.keys(options)) {
    if (!OPTION_NAMES.has(name)) {
      throw new TypeError(`new Client: unknown option ${JSON.stringify(name)} (the options are ${[...OPTION_NAMES].join(", ")})`);
    }
  }
  for (const name of ["token", "ca", "cert", "key"]) {
    const value = options[name];
    if (value !== undefined && value !== null && typeof value !== "string") {
      throw new TypeError(`new Client: option ${name} must be a string, not ${describe(value)}`);
    }
  }
  const file = (name: string): string | undefined => (typeof options[name] === "string" ? (options[name] as string) : undefined);
  if ((file("cert") === undefined) !== (file("key") === undefined)) {
    throw new TypeError("new Client: a client certificate needs both cert and key");
  }
  let items: string[];
  if (endpoints === undefined || endpoints === null) {
    items = ["http://127.0.0.1:7070"];
  } else if (typeof endpoints === "string") {
    items = endpoints.split(",");
  } else if (Array.isArray(endpoints)) {
    if (endpoints.length === 0) throw new TypeError("new Client: the endpoint list is empty");
    items = endpoints.map((item: unknown) => {
      if (typeof item !== "string") throw new TypeError(`new Client: each endpoint must be a string, not ${describe(item)}`);
      return item;
    });
  } else {
    throw new TypeError(`new Client: endpoints must be a URL string or an array of them, not ${describe(endpoints)}`);
  }
  const tls = file("ca") !== undefined || file("cert") !== undefined;
  const urls = items.map((item) => {
    if (item.trim() === "") throw new TypeError(`new Client: an empty endpoint in ${describe(endpoints)}`);
    try {
      return normalize(item, tls);
    } catch (error) {
      const why = error instanceof InvalidArgumentError ? error.message : `not a URL`;
      throw new TypeError(`new Client: endpoint ${JSON.stringify(item)}: ${why}`, { cause: error });
    }
  });
  const checked: ClientOptions = {};
  const token = file("token");
  if (token !== undefined) checked.token = token;
  for (const name of ["ca", "cert", "key"] as const) {
    const value = file(name);
    if (value !== undefined) checked[name] = value;
  }
  return { urls, options: checked };
}

export interface SessionOptions {
  /** The lease (default `"30s"`). */
  ttl?: Duration;
  /** How long before the lease could end unrenewed `signal` aborts (default a tenth of the TTL, at most 2 s). */
  margin?: Duration;
}

export interface WaitOptions {
  /** Wait at most this long (`WaitTimeoutError` after it); default: until granted. */
  timeout?: Duration;
  /** Cancels the wait: the connection closes, and the server gives the queue place back. */
  signal?: AbortSignal;
}

/** The lease TTL and margin of `options`, in ms. */
function leaseOf(options: SessionOptions): { ttl: number; margin: number } {
  const ttl = millis(options.ttl ?? "30s", "ttl");
  return { ttl, margin: options.margin === undefined ? Math.min(ttl / 10, 2000) : millis(options.margin, "margin") };
}

export interface TryLockOptions extends SessionOptions {
  /**
   * Take the lock in a session of its own, opened for it and closed when
   * it is released: its lease is lost only with its own renewals, never
   * with another lock's, for two more round trips per lock. Without it
   * (the default) the lock shares the client's session of its TTL and
   * margin with every other lock of the client.
   */
  ownSession?: boolean;
}

export type LockOptions = TryLockOptions & WaitOptions;

/** How `Client.send` sends one request: `body` replaces the call's, `wait` bounds the answer's wait. */
interface SendOptions {
  body?: Body;
  wait?: number | undefined;
  signal?: AbortSignal;
  lane?: Lane;
}

function sleep(ms: number, unref = false, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(ms, 0));
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
    if (unref) timer.unref();
  });
}

/** A connection to a Deadbolt cluster. Share one per process. */
export class Client {
  private readonly endpoints: EndpointRing;
  private readonly transport: Transport;
  /** Acquires, releases and keepalives, where the endpoint serves them framed; everything else goes by `transport`. */
  private readonly framed: FramedCalls;
  /** The sessions `lock`, `tryLock` and `withLock` share, by TTL and margin. */
  private readonly pools = new Map<string, SessionPool>();

  /**
   * `new Client("http://10.0.0.1:7070,http://10.0.0.2:7070")`,
   * `new Client(["10.0.0.1:7070", "10.0.0.2:7070"], { token })`, or
   * `new Client({ endpoints, ca, cert, key, token })`; no argument: one
   * node at `http://127.0.0.1:7070`. Anything else is a `TypeError`.
   */
  constructor(options?: ClientOptions);
  constructor(endpoints: Endpoints, options?: ConnectOptions);
  constructor(first?: Endpoints | ClientOptions, second?: ConnectOptions) {
    const { urls, options } = clientArguments(first, second);
    this.endpoints = new EndpointRing(urls, false);
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (options.token) headers["authorization"] = `Bearer ${options.token}`;
    const deadlines = new Deadlines();
    this.transport = new Transport(headers, options, CONNECT_TIMEOUT, deadlines);
    this.framed = new FramedCalls(headers["authorization"] ?? "", CONNECT_TIMEOUT, deadlines, (base) => this.transport.ping(base), now);
  }

  /** One request to the current endpoint; on failure the endpoint moves on before throwing. */
  async send<T>(call: Call<T>, options: SendOptions = {}): Promise<T> {
    const url = this.endpoints.url();
    const body = options.body ?? call.body;
    const wait = "wait" in options ? options.wait : CALL_TIMEOUT;
    let answer;
    try {
      if (body && this.framed.serves(url, call.path)) {
        try {
          answer = await this.framed.request(url, call.path, body, wait, options.signal, (options.lane ?? "calls") === "calls");
        } catch (error) {
          if (!(error instanceof FramedRefused)) throw error;
          // Nothing was sent: over HTTP/2, then.
        }
      }
      if (answer === undefined) {
        const raw = await this.transport.request(url, call.method, call.path, body && encodeBody(body), wait, options.signal, options.lane);
        answer = parseAnswer(raw.status, raw.text, raw.retryAfter);
      }
    } catch (error) {
      if (error instanceof DeadboltError) {
        this.endpoints.failed(url, error);
        throw error;
      }
      if (error instanceof TransportError) {
        const failure = unreachable(url, error, error.unsent);
        this.endpoints.failed(url, failure);
        throw failure;
      }
      throw error; // aborted by the caller's signal
    }
    return call.parse(answer);
  }

  /**
   * Repeats a request that is safe to repeat while the server is
   * unreachable, not the leader, or overloaded: until `giveUp` (a `now()`
   * instant: the call's own deadline), while `lost` says the lease holds,
   * and until `signal` aborts. Straight to the leader a follower named, or
   * to the next endpoint after one that could not even be reached (at most
   * once round the list in a row); otherwise after a jittered pause (50 ms
   * doubling to 1 s), so that every client of a dead leader does not hammer
   * the survivors at once while they elect the next.
   */
  async retrying<T>(
    request: () => Promise<T>,
    options: {
      giveUp?: number | undefined;
      lost?: () => DeadboltError | undefined;
      retryable?: (error: unknown) => boolean;
      signal?: AbortSignal | undefined;
      /**
       * The request changes state. After an attempt that may have been done
       * (its answer lost), a refusal of a repeat does not say whether that
       * attempt was done: it is thrown as an `UnavailableError` whose
       * outcome is unknown (the Rust client's rule), unless it is `doneIf`,
       * a refusal that means the attempt was done (`not_holder` after a
       * release), and then the call's `answer`. A refusal that ends the
       * session is the truth either way: nothing of it is held.
       */
      changes?: boolean | { doneIf: string; answer: T };
    } = {},
  ): Promise<T> {
    const pause = new RetryPause();
    const retryable = options.retryable ?? isTransient;
    let hops = 0;
    let cutOff: DeadboltError | undefined;
    for (;;) {
      options.signal?.throwIfAborted();
      const ended = options.lost?.();
      if (ended) throw ended;
      try {
        return await request();
      } catch (error) {
        if (!(error instanceof DeadboltError)) throw error;
        if (!retryable(error)) {
          if (cutOff === undefined) throw error;
          if (typeof options.changes === "object" && error.kind === options.changes.doneIf) return options.changes.answer;
          throw endsSession(error) ? error : unknownOutcome(cutOff, error);
        }
        if (options.changes && mayHaveBeenDone(error)) cutOff ??= error;
        const elsewhere =
          (error instanceof NotLeaderError && error.leader !== undefined) || (error instanceof UnavailableError && error.unsent);
        const delay = elsewhere && hops < this.endpoints.urls.length ? 0 : pause.after(error);
        hops = delay === 0 ? hops + 1 : 0;
        if (options.giveUp !== undefined && now() + delay >= options.giveUp) throw error;
        if (delay > 0) await sleep(delay, false, options.signal);
      }
    }
  }

  /** A call that is not a lock's: repeated through a failover for up to the call budget (10 s). */
  private call<T>(call: Call<T>): Promise<T> {
    return this.retrying(() => this.send(call), { giveUp: now() + CALL_TIMEOUT, changes: call.changes });
  }

  /** Opens a session: a lease renewed every third of its TTL in the background. */
  session(options: SessionOptions = {}): Promise<Session> {
    return this.openSession(leaseOf(options), now() + CALL_TIMEOUT, undefined);
  }

  /**
   * Opens a session, repeating the request through a failover until
   * `giveUp`. A repeat after an attempt whose answer was lost may open a
   * second session: the first, which nobody knows of, holds nothing and
   * ends by itself one TTL later. Failing the caller instead would turn
   * every leader change into an error.
   * @internal
   */
  async openSession({ ttl, margin }: { ttl: number; margin: number }, giveUp: number, signal: AbortSignal | undefined): Promise<Session> {
    const open = calls.openSession(ttl);
    let sent = now();
    const opened = await this.retrying(() => {
      // The server counts the lease from when it received the attempt that
      // opened it: no earlier than this.
      sent = now();
      return this.send(open, signal ? { signal } : {});
    }, { giveUp, signal, changes: true });
    return new Session(this, opened.handle, opened.ttlMs, sent, margin);
  }

  /**
   * Takes `name`, waiting in FIFO order, in the session this client shares
   * between its locks of the same TTL and margin (opened on first use, and
   * renewed by one watchdog): every lock of that session is lost together
   * if its lease is, and `guard.signal` of each aborts at once. With
   * `ownSession`, in a session of its own, closed on release. If the lock
   * is not acquired, this throws: code after it never runs without it.
   * `timeout` bounds the whole call, a failover's repeats included.
   */
  async lock(name: string, options: LockOptions = {}): Promise<Guard> {
    const giveUp = options.timeout === undefined ? undefined : now() + millis(options.timeout, "timeout");
    return this.inSession(name, options, giveUp ?? now() + CALL_TIMEOUT, options.signal, (session) => {
      const wait: WaitOptions = {};
      if (giveUp !== undefined) wait.timeout = Math.max(giveUp - now(), 0);
      if (options.signal) wait.signal = options.signal;
      return session.lock(name, wait);
    });
  }

  /** Takes `name` if it is free (in the shared session, as `lock` does); `null` if someone holds it. */
  async tryLock(name: string, options: TryLockOptions = {}): Promise<Guard | null> {
    const giveUp = now() + CALL_TIMEOUT;
    return this.inSession(name, options, giveUp, undefined, (session) => session.tryWithin(Target.lock(name), giveUp));
  }

  /**
   * Runs `acquire` in a session in which `name` is free: the shared one of
   * `options`' TTL and margin, or one opened for this lock alone
   * (`ownSession`), closed when its guard is released or the lock is not
   * acquired.
   */
  private async inSession<G extends Guard | null>(
    name: string,
    options: TryLockOptions,
    giveUp: number,
    signal: AbortSignal | undefined,
    acquire: (session: Session) => Promise<G>,
  ): Promise<G> {
    const lease = leaseOf(options);
    if (!options.ownSession) {
      const key = `${lease.ttl} ${lease.margin}`;
      let pool = this.pools.get(key);
      if (!pool) this.pools.set(key, (pool = new SessionPool(this, lease)));
      return pool.run(name, giveUp, signal, acquire);
    }
    const session = await this.openSession(lease, giveUp, signal);
    try {
      const guard = await acquire(session);
      if (guard) guard.ownsSession = true;
      else await session.close();
      return guard;
    } catch (error) {
      await session.close();
      throw error;
    }
  }

  /**
   * Runs `work` holding `name`, and releases it after, whatever happens:
   * `try`/`finally` for code without `await using`. `work` gets the guard,
   * whose `signal` aborts when the lease can no longer be trusted.
   */
  async withLock<T>(name: string, options: LockOptions, work: (guard: Guard) => Promise<T>): Promise<T> {
    const guard = await this.lock(name, options);
    try {
      return await work(guard);
    } finally {
      await guard.release();
    }
  }

  /** Who holds `name` (and who waits); `undefined` when nobody holds it. */
  status(name: string): Promise<LockStatus | undefined> {
    return this.call(calls.status(name));
  }

  /** Every held lock, in name order. */
  async locks(): Promise<LockStatus[]> {
    const held: LockStatus[] = [];
    for (let more = true; more; ) {
      const next = await this.call(calls.locksPage(held.at(-1)?.name ?? ""));
      held.push(...next.page);
      more = next.more;
    }
    return held;
  }

  history(name: string): Promise<AuditEntry[]> {
    return this.call(calls.history(name));
  }

  /** Whether `token` is the current grant of `name`. */
  check(name: string, token: bigint): Promise<boolean> {
    return this.call(calls.check(name, token));
  }

  semaphoreStatus(name: string): Promise<SemaphoreStatus | undefined> {
    return this.call(calls.semaphoreStatus(name));
  }

  leader(election: string): Promise<Leader | undefined> {
    return this.call(calls.leader(election));
  }

  /** Writes the fenced store's `key` unless `token` is below its fence (`StaleTokenError`); the new fence. */
  put(key: string, value: string, token: bigint, options: { lock?: string } = {}): Promise<bigint> {
    return this.call(calls.put(key, value, token, options.lock));
  }

  /** Reads `key`; with `token`, a fenced read that first raises the fence to it. */
  get(key: string, options: { token?: bigint; lock?: string } = {}): Promise<Stored> {
    return this.call(calls.get(key, options.token, options.lock));
  }

  delete(key: string, token: bigint): Promise<boolean> {
    return this.call(calls.delete(key, token));
  }

  /**
   * Every event of `name` (or, with `prefix`, of every name that starts
   * with it) as the log applies it: from now, or after `after` (the `index`
   * of a status read, or an event's `id`). It goes on after the last event
   * it gave through outages and leader changes, and throws
   * `CompactedError` when the node no longer keeps the history it needs.
   * Stop it with `break`, or with `signal`.
   */
  async *watch(name: string, options: { prefix?: boolean; after?: string | bigint; signal?: AbortSignal } = {}): AsyncGenerator<WatchEvent> {
    let cursor = options.after === undefined ? undefined : String(options.after);
    for (;;) {
      const poll = calls.watchPoll(name, options.prefix ?? false, cursor);
      const sendOptions = { wait: WATCH_POLL + CALL_TIMEOUT, ...(options.signal ? { signal: options.signal } : {}) };
      const { events, cursor: next } = await this.retrying(() => this.send(poll, sendOptions));
      cursor = next;
      yield* events;
    }
  }

  /** A raw keepalive of someone's session by its handle (repeated through a failover); the TTL granted, in ms. */
  keepAlive(handle: SessionHandle): Promise<number> {
    return this.call(calls.keepAlive(handle));
  }

  /**
   * Closes the sessions `lock` shares (releasing what they still hold; one
   * attempt each, of at most 1 s: a lease left behind ends by itself) and
   * then the kept connections.
   */
  async close(): Promise<void> {
    const pools = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(pools.map((pool) => pool.close()));
    this.framed.close();
    this.transport.close();
  }
}

/**
 * The sessions a client's `lock`, `tryLock` and `withLock` share, for one
 * TTL and margin: one session, opened on first use, holds every lock; a
 * second (third, ...) is opened only while the same name is wanted again
 * in this client, since a session holds a lock once (the server answers a
 * repeat by the same session with the grant it has), and so each waiter
 * keeps its own FIFO place on the server. A caller that finds no free
 * session opens one with its own `timeout` and `signal`, as a lock of its
 * own did (callers that come together before the first is open open one
 * each, and the spares fall idle). A session that held nothing for a whole
 * renewal interval is closed instead of renewed.
 */
class SessionPool {
  private readonly sessions: Session[] = [];

  constructor(
    private readonly client: Client,
    private readonly lease: { ttl: number; margin: number },
  ) {}

  /**
   * `acquire` in a live session in which `name` is free, called in the
   * same turn as it is found free (or opened), so that no other caller
   * takes the name in it first.
   */
  async run<T>(name: string, giveUp: number, signal: AbortSignal | undefined, acquire: (session: Session) => Promise<T>): Promise<T> {
    const free = this.freeFor(name);
    if (free) return acquire(free);
    const opened = await this.client.openSession(this.lease, giveUp, signal);
    opened.closesWhenIdle = true;
    this.sessions.push(opened);
    return acquire(opened);
  }

  private freeFor(name: string): Session | undefined {
    for (let i = 0; i < this.sessions.length; ) {
      const session = this.sessions[i] as Session;
      if (session.signal.aborted) {
        this.sessions.splice(i, 1);
        continue;
      }
      if (!session.isBusyWith(name)) return session;
      i++;
    }
    return undefined;
  }

  close(): Promise<void> {
    return Promise.all(this.sessions.splice(0).map((session) => session.closeWithin(CLOSE_AT_EXIT))).then(() => undefined);
  }
}

/**
 * A lease on the server, renewed every third of its TTL. The server counts
 * a lease from when it *receives* a keepalive; the client only knows when it
 * *sent* one, so its deadline is never later than the server's.
 */
export class Session {
  readonly ttl: number;
  readonly margin: number;
  private readonly lease: Lease;
  private readonly lostController = new AbortController();
  private changed: { promise: Promise<void>; resolve: () => void };
  private readonly inUse = new Set<string>();
  private alarm: ReturnType<typeof setTimeout> | undefined;
  /** @internal A shared session (`SessionPool`): closed rather than renewed once it held nothing for a renewal interval. */
  closesWhenIdle = false;
  /** Whether a lock was held or wanted through this session since its last renewal. */
  private usedSinceRenewal = false;

  constructor(
    /** The client this session was opened through. */
    readonly client: Client,
    readonly handle: SessionHandle,
    ttl: number,
    opened: number,
    margin: number,
  ) {
    this.ttl = ttl;
    this.margin = margin;
    this.lease = new Lease(handle.id, opened + ttl);
    this.changed = Session.signalled();
    void this.watchdog();
    this.armAlarm();
  }

  private static signalled(): { promise: Promise<void>; resolve: () => void } {
    let resolve = (): void => {};
    const promise = new Promise<void>((done) => (resolve = done));
    return { promise, resolve };
  }

  /** The server's id for this session (public: status shows it). */
  get id(): bigint {
    return this.handle.id;
  }

  /** The latest instant (on `now()`'s clock, in ms) the lease is certain to last until. */
  get deadline(): number {
    return this.lease.deadline;
  }

  /**
   * Aborts once the lease is within `margin` of ending unrenewed, was ended
   * by the server, or the session was closed; its `reason` says which. Hand
   * it to `fetch`, a database driver, or anything else that takes one.
   */
  get signal(): AbortSignal {
    return this.lostController.signal;
  }

  /** Why the lease cannot be trusted `margin` ms ahead, or `undefined`. */
  lostReason(margin = 0): DeadboltError | undefined {
    return this.lease.lostReason(margin);
  }

  private notify(): void {
    const changed = this.changed;
    this.changed = Session.signalled();
    changed.resolve();
    this.armAlarm();
  }

  private armAlarm(): void {
    clearTimeout(this.alarm);
    const reason = this.lease.lostReason(this.margin);
    if (reason) {
      this.lostController.abort(reason);
      return;
    }
    // Now and then even before the alarm: a suspend delays timers.
    const wake = Math.min(this.lease.deadline - this.margin - now(), 1000);
    this.alarm = setTimeout(() => this.armAlarm(), Math.max(wake, 0));
    this.alarm.unref();
  }

  /**
   * Resolves once the lease is lost, or within `margin` of running out with
   * no renewal moving it, with why; `undefined` after `timeout`.
   */
  async waitLost(margin: Duration = 0, timeout?: Duration): Promise<DeadboltError | undefined> {
    const marginMs = millis(margin, "margin");
    const giveUp = timeout === undefined ? undefined : now() + millis(timeout, "timeout");
    for (;;) {
      const reason = this.lease.lostReason(marginMs);
      if (reason) return reason;
      let wake = this.lease.deadline - marginMs;
      if (giveUp !== undefined) {
        if (now() >= giveUp) return undefined;
        wake = Math.min(wake, giveUp);
      }
      await Promise.race([this.changed.promise, sleep(Math.min(wake - now(), 1000))]);
    }
  }

  private end(reason: DeadboltError): void {
    this.lease.end(reason);
    this.notify();
  }

  private async watchdog(): Promise<void> {
    const interval = this.ttl / 3;
    let lastSent = this.lease.deadline - this.ttl;
    while (!this.lease.ended) {
      await sleep(lastSent + interval - now(), true);
      if (this.lease.ended) return;
      if (this.closesWhenIdle && !this.usedSinceRenewal && this.inUse.size === 0) {
        await this.close();
        return;
      }
      this.usedSinceRenewal = this.inUse.size > 0;
      const deadline = this.lease.deadline;
      const sent = now();
      let granted: number;
      try {
        granted = await this.renew(deadline, interval);
      } catch (error) {
        if (endsSession(error)) this.end(error as DeadboltError);
        else {
          this.end(this.lease.expired(error));
          await this.closeQuietly(interval);
        }
        return;
      }
      if (!this.lease.renewed(sent, granted, this.margin)) {
        this.end(this.lease.expired());
        await this.closeQuietly(interval);
        return;
      }
      lastSent = sent;
      this.notify();
    }
  }

  private renew(deadline: number, interval: number): Promise<number> {
    const keepAlive = calls.keepAlive(this.handle);
    return this.client.retrying(() => this.client.send(keepAlive, { wait: Math.max(Math.min(interval, deadline - now()), 1) }), {
      giveUp: deadline,
      retryable: (error) => !endsSession(error),
    });
  }

  /**
   * Takes `name`, waiting in its FIFO queue. Retries while the server is
   * unreachable or changing leader, for as long as the lease lasts (acquire
   * is idempotent). Aborting `signal` gives the place (or a grant answered
   * as it aborted) back.
   */
  lock(name: string, options: WaitOptions = {}): Promise<Guard> {
    return this.acquire(Target.lock(name), true, options);
  }

  /** Takes `name` if it is free; `null` if another session holds it. */
  tryLock(name: string): Promise<Guard | null> {
    return this.try(Target.lock(name));
  }

  /** The read/write lock `name`, shared with other readers, FIFO behind any writer first in line. */
  readLock(name: string, options: WaitOptions = {}): Promise<Guard> {
    return this.acquire(Target.lock(name, "shared"), true, options);
  }

  /** The read/write lock `name`, alone. */
  writeLock(name: string, options: WaitOptions = {}): Promise<Guard> {
    return this.acquire(Target.lock(name, "exclusive"), true, options);
  }

  tryReadLock(name: string): Promise<Guard | null> {
    return this.try(Target.lock(name, "shared"));
  }

  tryWriteLock(name: string): Promise<Guard | null> {
    return this.try(Target.lock(name, "exclusive"));
  }

  /** `count` permits of the semaphore `name` of `capacity` (0: a defined one's); each permit has its token and slot. */
  semaphore(name: string, capacity: number, options: WaitOptions & { count?: number } = {}): Promise<Guard> {
    return this.acquire(Target.semaphore(name, capacity, options.count ?? 1), true, options);
  }

  trySemaphore(name: string, capacity: number, options: { count?: number } = {}): Promise<Guard | null> {
    return this.try(Target.semaphore(name, capacity, options.count ?? 1));
  }

  /** Runs for leader of `election`; the guard's token is the term. */
  campaign(election: string, value: string, options: WaitOptions = {}): Promise<Guard> {
    return this.acquire(Target.election(election, value), true, options);
  }

  /** @internal Whether `name` is held or being acquired through this session. */
  isBusyWith(name: string): boolean {
    return this.inUse.has(name);
  }

  /** This session's place in lock `name`'s queue (0 is next), or `undefined` if it is not waiting. */
  async queuePosition(name: string): Promise<number | undefined> {
    const status = await this.client.status(name);
    const place = status?.waiters.indexOf(this.id) ?? -1;
    return place < 0 ? undefined : place;
  }

  private try(target: Target): Promise<Guard | null> {
    return this.tryWithin(target, now() + CALL_TIMEOUT);
  }

  /** @internal A non-waiting acquire, repeated through a failover until `giveUp`. */
  async tryWithin(target: Target, giveUp: number): Promise<Guard | null> {
    try {
      return await this.acquire(target, false, {}, giveUp);
    } catch (error) {
      if (error instanceof LockBusyError) return null;
      throw error;
    }
  }

  /**
   * An acquire, repeated through a failover (the server answers a repeat by
   * the same session with the grant it already has, or the same queue
   * place): a wait until its `timeout` (or for as long as the lease holds),
   * a non-waiting one until `budget`.
   */
  private async acquire(target: Target, wait: boolean, options: WaitOptions, budget?: number): Promise<Guard> {
    const name = target.name;
    if (typeof name !== "string") throw new InvalidArgumentError("invalid_argument", "a lock name is a string");
    const giveUp = options.timeout === undefined ? budget : now() + millis(options.timeout, "timeout");
    if (this.inUse.has(name)) {
      throw new InvalidArgumentError(
        "invalid_argument",
        `lock ${JSON.stringify(name)} is already held or being acquired through session ${this.id}; use one session per holder`,
      );
    }
    options.signal?.throwIfAborted();
    this.inUse.add(name);
    this.usedSinceRenewal = true;
    const send = (): Promise<Grant> => {
      const body = this.handle.fieldsWith(target.fields);
      body["wait"] = wait;
      let readTimeout: number | undefined = CALL_TIMEOUT;
      if (wait) {
        body["attempt"] = nextAttempt();
        readTimeout = undefined;
        if (giveUp !== undefined) {
          const left = Math.max(giveUp - now(), 0);
          body["timeout_ms"] = Math.round(left);
          readTimeout = left + CALL_TIMEOUT;
        }
      }
      // No longer than the lease lasts: a server that stops answering must
      // not hold the caller past it. The wait is sent again (a fresh attempt
      // keeps the queue place) while the lease holds.
      const leaseLeft = Math.max(this.deadline - now(), 1);
      const waitFor = readTimeout === undefined ? leaseLeft : Math.min(readTimeout, leaseLeft);
      const sendOptions: SendOptions = { body, wait: waitFor, lane: wait ? "waits" : "calls" };
      if (options.signal) sendOptions.signal = options.signal;
      return this.client.send(target.acquire(body), sendOptions).catch((error: unknown) => {
        if (mayHaveBeenDone(error)) outcomeUnknown = true;
        throw error;
      });
    };
    let outcomeUnknown = false;
    let grant: Grant;
    try {
      grant = await this.client.retrying(send, { giveUp, lost: () => this.lostReason(), signal: options.signal });
    } catch (error) {
      if (options.signal?.aborted) {
        this.cleanUpAbandoned(target);
        throw options.signal.reason;
      }
      // Out of time after a failure whose outcome is unknown: an attempt
      // may have been granted, and is given back if it was.
      if (outcomeUnknown && isTransient(error)) this.cleanUpAbandoned(target);
      else this.inUse.delete(name);
      if (isTransient(error) && wait && options.timeout !== undefined) {
        throw new WaitTimeoutError("wait_timeout", `timed out waiting for ${target.kind} ${JSON.stringify(name)} (last error: ${error.message})`);
      }
      throw error;
    }
    // An answer that arrives as the lease ends cannot be relied on.
    const lost = this.lostReason();
    if (lost) {
      this.inUse.delete(name);
      throw lost;
    }
    return new Guard(this, target, grant);
  }

  /** A grant the server answered as its caller gave up: released a moment later, if it came. */
  private cleanUpAbandoned(target: Target): void {
    // Free at once: a new caller may retry straight away, and gets the grant
    // (if any) itself. The clean-up claims the name only if nobody has.
    this.inUse.delete(target.name);
    void (async () => {
      await sleep(CLEAN_UP_DELAY, true);
      if (this.inUse.has(target.name) || this.lease.ended) return;
      this.inUse.add(target.name);
      try {
        const token = await this.client.retrying(() => this.client.send(target.heldBy(this.id)), { giveUp: now() + CALL_TIMEOUT });
        if (token !== undefined && !this.signal.aborted) await this.release(target, token);
      } catch {
        // The server gives it back after its grace period.
      } finally {
        this.inUse.delete(target.name);
      }
    })();
  }

  /** @internal */
  async release(target: Target, token: bigint): Promise<void> {
    const release = target.release(this.handle, token);
    try {
      // An answer after the lease's end means nothing: wait no longer.
      await this.client.retrying(() => this.client.send(release, { wait: Math.max(Math.min(CALL_TIMEOUT, this.deadline - now()), 1) }), {
        lost: () => this.lostReason(),
        // A live session holds its locks until it releases them: "not
        // holder" after a send whose reply was lost means it went through.
        changes: { doneIf: "not_holder", answer: undefined },
      });
    } finally {
      this.inUse.delete(target.name);
    }
  }

  /** Stops renewing and ends the session on the server, releasing its locks. */
  close(): Promise<void> {
    return this.closeWithin(Math.max(this.deadline - now(), 1000));
  }

  /** @internal `close`, trying for at most `within` ms. */
  async closeWithin(within: number): Promise<void> {
    if (!this.lease.end(new UnknownSessionError("unknown_session", `session ${this.id} is closed`))) return;
    this.notify();
    await this.closeQuietly(within);
  }

  private async closeQuietly(within: number): Promise<void> {
    const close = calls.closeSession(this.handle);
    try {
      await this.client.retrying(() => this.client.send(close, { wait: Math.max(Math.min(CALL_TIMEOUT, within), 1) }), {
        giveUp: now() + within,
        // "Unknown session" after a close whose reply was lost: it was closed.
        changes: { doneIf: "unknown_session", answer: undefined },
      });
    } catch {
      // Best effort: the lease ends by itself.
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/**
 * A held lock (or semaphore permits, or an election's leadership) and its
 * fencing token. Pass `token` to whatever the lock protects, and have it
 * refuse tokens lower than the highest it has seen.
 */
export class Guard {
  readonly name: string;
  /** The fencing token: a lock's, the first permit's, or the term. Never rounded: a `bigint`. */
  readonly token: bigint;
  /** A semaphore's permits, each with its own token and slot. */
  readonly permits: Permit[];
  /** @internal Its session is its own (`ownSession`), closed when it is released. */
  ownsSession = false;
  private released = false;
  /** `signal`'s, made on first use (most guards never read it) while the session is shared. */
  private signalOfItsOwn: { controller: AbortController; onLost: () => void } | undefined;

  constructor(
    readonly session: Session,
    private readonly target: Target,
    grant: Grant,
  ) {
    this.name = target.name;
    this.token = grant.token;
    this.permits = grant.permits;
  }

  /**
   * Aborts when the lease of the session holding the lock can no longer be
   * trusted (see `Session.signal`): in the client's shared session, that
   * is every lock of the session at once. Also aborted once the guard is
   * released: in a shared session with an `AbortError`, in a session of its
   * own as the session closes (`UnknownSessionError`).
   */
  get signal(): AbortSignal {
    if (this.ownsSession) return this.session.signal;
    if (!this.signalOfItsOwn) {
      const controller = new AbortController();
      const shared = this.session.signal;
      const onLost = (): void => controller.abort(shared.reason);
      this.signalOfItsOwn = { controller, onLost };
      if (this.released) controller.abort(this.releasedReason());
      else if (shared.aborted) onLost();
      else shared.addEventListener("abort", onLost, { once: true });
    }
    return this.signalOfItsOwn.controller.signal;
  }

  private releasedReason(): DOMException {
    return new DOMException(`lock ${JSON.stringify(this.name)} (token ${this.token}) was released`, "AbortError");
  }

  /** An election leader's new value; `NotHolderError` or `StaleTokenError` once its term is over. */
  async proclaim(value: string): Promise<void> {
    const client = this.session.client;
    const call = calls.proclaim(this.session.handle, this.name, this.token, value);
    await client.retrying(() => client.send(call), { giveUp: now() + CALL_TIMEOUT, changes: true });
  }

  /**
   * Releases the lock (resigns an election), and closes the session
   * `Client.lock` opened. Throws `LeaseLostError` if the lease was already
   * gone: the lock may then have been someone else's for a while.
   */
  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    try {
      await this.session.release(this.target, this.token);
    } finally {
      if (this.ownsSession) await this.session.close();
      else if (this.signalOfItsOwn) {
        const { controller, onLost } = this.signalOfItsOwn;
        this.session.signal.removeEventListener("abort", onLost);
        if (!controller.signal.aborted) controller.abort(this.releasedReason());
      }
    }
  }

  resign(): Promise<void> {
    return this.release();
  }

  /**
   * `await using guard = await client.lock(...)`: released at the end of
   * the block. If the lease could no longer be trusted by then, this throws
   * `LeaseLostError`, so a loss never goes unnoticed.
   */
  async [Symbol.asyncDispose](): Promise<void> {
    const { aborted, reason } = this.session.signal;
    const lostDuring = !this.released && aborted && !(reason instanceof UnknownSessionError);
    await this.release().catch((error: unknown) => {
      if (!lostDuring) throw error;
    });
    if (lostDuring) {
      throw new LeaseLostError(
        "session_expiring",
        `the lease of lock ${JSON.stringify(this.name)} (token ${this.token}) could no longer be trusted while it was held: stop work when guard.signal aborts`,
      );
    }
  }
}
