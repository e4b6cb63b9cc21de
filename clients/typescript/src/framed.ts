/**
 * Framed calls (docs/framed-calls.md): a lock's acquire and release and a
 * session's keepalive as protobuf messages behind a 4-byte length, many at
 * once on one plain TCP connection to the leader, answered by id, instead
 * of an HTTP/2 request each. Everything else, and every endpoint that does
 * not serve them (a follower, an older server, `https://`), stays on
 * HTTP/2 (`transport.ts`).
 *
 * Why: Node runs the client on one thread, so its CPU per call is its
 * throughput. An HTTP/2 request through `node:http2` (a stream object,
 * headers, five events, a JSON body each way) costs far more than one
 * `socket.write` of a few dozen bytes and a frame read out of a buffer: in
 * one run (`bench/bench.mjs deadbolt-session`, 16 and 64 loops, the
 * README's Performance section), an acquire+release pair in an explicit
 * session cost 238-307 µs of client CPU over HTTP/2 (1,178-1,984 pairs/s)
 * and 38-51 µs framed (5,830-10,150 pairs/s).
 *
 * The codec is hand-rolled for the few messages it needs, rather than a
 * protobuf library: the client has no runtime dependency, and the wire
 * format is small and fixed (client API 1).
 *
 * A frozen leader answers nothing and closes nothing. HTTP/2 pings find it
 * on the HTTP/2 connection; here, while calls are in flight and nothing
 * has arrived for `SILENCE`, the endpoint's HTTP/2 connection is
 * pinged for this one, and an unanswered ping drops it too.
 */

import net from "node:net";
import type { Body } from "./calls.js";
import { DeadboltError, errorFor } from "./errors.js";
import type { Json } from "./protocol.js";
import { type Deadline, Deadlines, PING_INTERVAL, TransportError } from "./transport.js";

const PREFACE = Buffer.from("\0deadbolt-framed-calls/1\n", "latin1");
/** The largest frame either side sends or accepts (the server's limit). */
const MAX_FRAME_BYTES = 128 * 1024;
/** The largest welcome taken as one: a `CallsWelcome` is at most a short refusal. */
const MAX_WELCOME_BYTES = 4096;
/** How long a refusal (a follower, an older server) keeps an endpoint on HTTP/2 before framed calls are tried there again. */
const REFUSAL_MEMORY = 10_000;
/**
 * How long a connection with calls in flight may be silent before the
 * server is pinged, and how often that is looked at: a frozen leader is
 * found within 1.25-1.5 s (with the ping's 1 s), as HTTP/2's pings every
 * 0.5 s find one; at twice this, the failover test's loops took 1.9-2.0 s
 * to be granted again after a `kill -STOP` of the leader.
 */
const SILENCE = PING_INTERVAL / 2;

/** The calls that go framed, by the HTTP/JSON path they have there. */
const FRAMED_PATHS = new Set(["/v1/lock/acquire", "/v1/lock/release", "/v1/session/keepalive"]);

// ---- protobuf, for these messages only ---------------------------------------

/**
 * Where a message is encoded before its frame is made: one buffer, reused
 * (grown if a message ever needs more), so that encoding a call allocates
 * its frame and nothing else (not a byte array per message and per string
 * as before, though the garbage collector's share of a 64-loop profile
 * stayed at 11-12 %: the rest of a call's promises and objects make it).
 */
let scratch = Buffer.allocUnsafe(1024);
let at = 0;

function room(bytes: number): void {
  if (at + bytes <= scratch.length) return;
  const bigger = Buffer.allocUnsafe(Math.max(scratch.length * 2, at + bytes));
  scratch.copy(bigger, 0, 0, at);
  scratch = bigger;
}

function putVarint(value: number | bigint): void {
  room(10);
  if (typeof value === "bigint" && value > BigInt(Number.MAX_SAFE_INTEGER)) {
    let v = value;
    while (v >= 0x80n) {
      scratch[at++] = Number(v & 0x7fn) | 0x80;
      v >>= 7n;
    }
    scratch[at++] = Number(v);
    return;
  }
  let v = Number(value);
  while (v >= 0x80) {
    scratch[at++] = (v % 0x80) | 0x80;
    v = Math.floor(v / 0x80);
  }
  scratch[at++] = v;
}

/** A varint field, left out when 0 (proto3's default), unless `always`. */
function putUint(field: number, value: number | bigint | boolean | undefined, always = false): void {
  if (value === undefined) return;
  const v = typeof value === "boolean" ? Number(value) : value;
  if (!always && (v === 0 || v === 0n)) return;
  putVarint(field << 3);
  putVarint(v);
}

function putString(field: number, value: string | undefined): void {
  if (!value) return;
  const length = Buffer.byteLength(value, "utf8");
  putVarint((field << 3) | 2);
  putVarint(length);
  room(length);
  at += scratch.write(value, at, "utf8");
}

/**
 * The frame of the message `encode` writes, inside field `field` of an
 * outer message that first has `id` as field 1 (a `CallRequest`), or as
 * it is without `field`.
 */
function framed(encode: () => void, id?: number, field?: number): Buffer {
  at = 0;
  encode();
  const inner = at;
  if (field !== undefined) {
    putUint(1, id);
    putVarint((field << 3) | 2);
    putVarint(inner);
  }
  const head = at - inner;
  const out = Buffer.allocUnsafe(4 + head + inner);
  out.writeUInt32BE(head + inner, 0);
  scratch.copy(out, 4, inner, at);
  scratch.copy(out, 4 + head, 0, inner);
  return out;
}

/** A message's fields: varints as `bigint` (exact), length-delimited ones as bytes. The last of a field wins. */
function readFields(bytes: Uint8Array): Map<number, bigint | Uint8Array> {
  const fields = new Map<number, bigint | Uint8Array>();
  let at = 0;
  const varint = (): bigint => {
    let small = 0;
    let shift = 0;
    // Seven bytes (49 bits) add up exactly as a number; beyond, as a bigint.
    while (shift < 49) {
      const byte = bytes[at++];
      if (byte === undefined) throw new TransportError("a truncated frame");
      small += (byte & 0x7f) * 2 ** shift;
      if (byte < 0x80) return BigInt(small);
      shift += 7;
    }
    let big = BigInt(small);
    for (let bigShift = 49n; ; bigShift += 7n) {
      const byte = bytes[at++];
      if (byte === undefined || bigShift > 63n) throw new TransportError("a malformed varint");
      big |= BigInt(byte & 0x7f) << bigShift;
      if (byte < 0x80) return big;
    }
  };
  while (at < bytes.length) {
    const key = Number(varint());
    const field = key >>> 3;
    switch (key & 7) {
      case 0:
        fields.set(field, varint());
        break;
      case 2: {
        const length = Number(varint());
        if (at + length > bytes.length) throw new TransportError("a truncated frame");
        fields.set(field, bytes.subarray(at, at + length));
        at += length;
        break;
      }
      case 1:
        at += 8;
        break;
      case 5:
        at += 4;
        break;
      default:
        throw new TransportError(`a field of wire type ${key & 7}`);
    }
  }
  return fields;
}

function fieldText(fields: Map<number, bigint | Uint8Array>, field: number): string {
  const value = fields.get(field);
  return value instanceof Uint8Array ? Buffer.from(value).toString("utf8") : "";
}

function fieldUint(fields: Map<number, bigint | Uint8Array>, field: number): bigint {
  const value = fields.get(field);
  return typeof value === "bigint" ? value : 0n;
}

/** The framed `CallRequest` of the HTTP/JSON call at `path` (one of `FRAMED_PATHS`) with `body`. */
function encodeCall(id: number, path: string, body: Body): Buffer {
  if (path === "/v1/lock/acquire") {
    return framed(() => {
      putUint(1, body["session_id"] as bigint);
      putString(2, body["lock"] as string);
      putUint(3, body["wait"] as boolean);
      if (body["timeout_ms"] !== undefined) putUint(4, body["timeout_ms"] as number, true);
      putUint(5, body["attempt"] as bigint | undefined);
      putString(7, body["session_secret"] as string);
      putString(8, body["mode"] as string | undefined);
    }, id, 2);
  }
  if (path === "/v1/lock/release") {
    return framed(() => {
      putUint(1, body["session_id"] as bigint);
      putString(2, body["lock"] as string);
      putUint(3, body["token"] as bigint);
      putString(4, body["session_secret"] as string);
    }, id, 3);
  }
  return framed(() => {
    putUint(1, body["session_id"] as bigint);
    putString(2, body["session_secret"] as string);
  }, id, 4);
}

/**
 * A `CallResponse`'s answer as the HTTP/JSON API gives it (integers as
 * their digits, as `decodeJson` reads them), so that one parser reads
 * both; a `CallError` thrown as its error.
 */
function answerOf(fields: Map<number, bigint | Uint8Array>): Record<string, Json> {
  const acquire = fields.get(2);
  if (acquire instanceof Uint8Array) return { token: fieldUint(readFields(acquire), 1).toString() };
  if (fields.get(3) instanceof Uint8Array) return {};
  const keepAlive = fields.get(4);
  if (keepAlive instanceof Uint8Array) return { ttl_ms: fieldUint(readFields(keepAlive), 1).toString() };
  const error = fields.get(5);
  if (error instanceof Uint8Array) throw callError(error);
  throw errorFor("internal", "the server answered a framed call with nothing this client asked for");
}

function callError(bytes: Uint8Array): Error {
  const error = readFields(bytes);
  const leader = fieldText(error, 3);
  return errorFor(fieldText(error, 1) || "internal", fieldText(error, 2), { leader: leader || undefined });
}

// ---- connections ---------------------------------------------------------------

/** The server will not serve framed calls here (a follower, an older server, a proxy): use HTTP/2. */
export class FramedRefused extends Error {}

interface Pending {
  resolve: (answer: Record<string, Json>) => void;
  reject: (error: unknown) => void;
}

/** One framed connection to one endpoint, with the calls in flight on it. */
class Connection {
  private readonly socket: net.Socket;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private buffered: Buffer = Buffer.alloc(0);
  /** Resolves once the server has welcomed the connection. */
  readonly ready: Promise<void>;
  private welcome: { resolve: () => void; reject: (error: unknown) => void } | undefined;
  welcomed = false;
  closed = false;
  private lastHeard = 0;
  private probing = false;
  private corked = false;
  private readonly connecting: ReturnType<typeof setTimeout>;
  private readonly watchdog: ReturnType<typeof setInterval>;

  constructor(
    readonly base: string,
    authorization: string,
    connectTimeout: number,
    private readonly probe: () => Promise<void>,
    private readonly now: () => number,
    private readonly onRefused: () => void,
  ) {
    const url = new URL(base);
    // Held open (referenced) until welcomed: callers wait for it.
    this.socket = net.connect({ host: url.hostname.replace(/^\[|\]$/g, ""), port: Number(url.port), noDelay: true });
    this.ready = new Promise((resolve, reject) => (this.welcome = { resolve, reject }));
    this.ready.catch(() => {}); // a connection nobody waited for may fail unobserved
    let connected = false;
    // Connected but not welcomed in time (a proxy waiting for an HTTP
    // request, a frozen server): HTTP/2, with its pings, is left to tell.
    this.connecting = setTimeout(() => {
      if (connected) this.refuse(`no framed-calls welcome from ${base} within ${connectTimeout}ms`);
      else this.destroy(new TransportError(`could not connect to ${base} within ${connectTimeout}ms`, true));
    }, connectTimeout);
    this.connecting.unref();
    this.socket.once("connect", () => {
      connected = true;
      this.socket.write(Buffer.concat([PREFACE, framed(() => putString(1, authorization))]));
    });
    this.socket.on("data", (chunk: Buffer) => {
      this.lastHeard = this.now();
      this.buffered = this.buffered.length === 0 ? chunk : Buffer.concat([this.buffered, chunk]);
      try {
        while (this.buffered.length >= 4) {
          const length = this.buffered.readUInt32BE(0);
          if (length > (this.welcomed ? MAX_FRAME_BYTES : MAX_WELCOME_BYTES)) throw new TransportError(`a frame of ${length} bytes from ${base}`);
          if (this.buffered.length < 4 + length) break;
          const message = this.buffered.subarray(4, 4 + length);
          this.buffered = this.buffered.subarray(4 + length);
          if (!this.welcomed) {
            clearTimeout(this.connecting);
            const welcome = readFields(message);
            if ([...welcome.keys()].some((field) => field !== 1)) throw new TransportError("not a welcome");
            const refused = welcome.get(1);
            if (refused instanceof Uint8Array) {
              this.refuse(callError(refused).message);
              return;
            }
            this.welcomed = true;
            if (this.pending.size === 0) this.socket.unref();
            this.welcome?.resolve();
          } else {
            this.answer(readFields(message));
          }
        }
      } catch (error) {
        // Not frames before a welcome (an older server's HTTP answer to the
        // preface): not a framed-calls server.
        if (this.welcomed) this.destroy(error);
        else this.refuse(`${base} answered the framed-calls preface with something else`);
      }
    });
    // Ended after connecting, before a welcome: not a framed-calls server
    // (an older one, a proxy that speaks only HTTP).
    const ended = (error?: Error): void => {
      if (connected && !this.welcomed) this.refuse(`${base} ended a framed-calls connection before its welcome`);
      else this.destroy(error ?? new TransportError(`${base} closed the connection`));
    };
    this.socket.on("error", ended);
    this.socket.on("close", () => ended());
    this.watchdog = setInterval(() => this.checkAlive(), SILENCE);
    this.watchdog.unref();
  }

  private answer(fields: Map<number, bigint | Uint8Array>): void {
    const id = Number(fieldUint(fields, 1));
    if (id === 0) {
      const error = fields.get(5);
      this.destroy(error instanceof Uint8Array ? callError(error) : new TransportError("the server ended the connection"));
      return;
    }
    const call = this.take(id);
    if (!call) return; // cancelled meanwhile
    try {
      call.resolve(answerOf(fields));
    } catch (error) {
      call.reject(error);
    }
  }

  /** The endpoint does not serve framed calls: remembered, and the callers waiting go by HTTP/2. */
  private refuse(why: string): void {
    if (this.closed) return;
    this.onRefused();
    this.destroy(new FramedRefused(why));
  }

  /** The call `id` out of those in flight; the connection stops holding the process open with the last. */
  private take(id: number): Pending | undefined {
    const call = this.pending.get(id);
    if (!call) return undefined;
    this.pending.delete(id);
    if (this.pending.size === 0) this.socket.unref();
    return call;
  }

  /** While calls are in flight and nothing came for `SILENCE`: is the server still there? */
  private checkAlive(): void {
    if (this.closed || this.probing || this.pending.size === 0 || this.now() - this.lastHeard < SILENCE) return;
    this.probing = true;
    this.probe().then(
      () => {
        this.probing = false;
        this.lastHeard = this.now();
      },
      (error: unknown) => this.destroy(new TransportError(`${this.base}: ${error instanceof Error ? error.message : String(error)}`)),
    );
  }

  /**
   * Sends one call and resolves with its answer. `timeout`: the most to
   * wait for it (`undefined`: as long as it takes), after which a call
   * (`dropOnTimeout`) drops the connection as presumed dead and a wait is
   * cancelled; `signal` cancels it (the server gives a waiting acquire's
   * place back).
   */
  call(path: string, body: Body, timeout: number | undefined, deadlines: Deadlines, signal: AbortSignal | undefined, dropOnTimeout: boolean): Promise<Record<string, Json>> {
    return new Promise((resolve, reject) => {
      if (this.closed) {
        reject(new TransportError(`the framed-calls connection to ${this.base} closed`, true));
        return;
      }
      const id = this.nextId++;
      let deadline: Deadline | undefined;
      const settle = (): void => {
        if (deadline) deadlines.delete(deadline);
        signal?.removeEventListener("abort", onAbort);
      };
      const onAbort = (): void => {
        if (!this.take(id)) return;
        settle();
        this.write(encodeCancel(id));
        reject(signal?.reason);
      };
      this.pending.set(id, {
        resolve: (answer) => {
          settle();
          resolve(answer);
        },
        reject: (error) => {
          settle();
          reject(error);
        },
      });
      if (this.pending.size === 1) {
        this.socket.ref();
        this.lastHeard = this.now();
      }
      if (timeout !== undefined) {
        deadline = deadlines.add(this.now() + timeout, () => {
          if (!this.take(id)) return;
          signal?.removeEventListener("abort", onAbort);
          reject(new TransportError(`no answer within ${Math.round(timeout)}ms`));
          // As on HTTP/2: a connection that answers a call nothing in time
          // is presumed dead; a wait running out of its time says nothing.
          if (dropOnTimeout) this.destroy(new TransportError(`${this.base} answered nothing in ${Math.round(timeout)}ms`));
          else this.write(encodeCancel(id));
        });
      }
      signal?.addEventListener("abort", onAbort, { once: true });
      this.write(encodeCall(id, path, body));
    });
  }

  /** Writes `data`, gathering what the same turn writes into one write. */
  private write(data: Buffer): void {
    if (this.closed) return;
    if (!this.corked) {
      this.corked = true;
      this.socket.cork();
      process.nextTick(() => {
        this.corked = false;
        this.socket.uncork();
      });
    }
    this.socket.write(data);
  }

  /** Ends the connection; every call in flight fails with `error` (as a `TransportError` unless the server said why). */
  destroy(error: unknown): void {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.connecting);
    clearInterval(this.watchdog);
    const failure =
      error instanceof TransportError || error instanceof FramedRefused || error instanceof DeadboltError
        ? error
        : new TransportError(error instanceof Error ? error.message || error.name : String(error), false, { cause: error });
    this.welcome?.reject(failure);
    this.socket.destroy();
    const calls = [...this.pending.values()];
    this.pending.clear();
    for (const call of calls) call.reject(failure);
  }
}

function encodeCancel(id: number): Buffer {
  return framed(() => {}, id, 5);
}

/**
 * The framed connections of a client, one per endpoint that serves them,
 * and the endpoints that refused, remembered for `REFUSAL_MEMORY`.
 */
export class FramedCalls {
  private readonly connections = new Map<string, Connection>();
  private readonly refusedUntil = new Map<string, number>();

  constructor(
    private readonly authorization: string,
    private readonly connectTimeout: number,
    private readonly deadlines: Deadlines,
    private readonly probe: (base: string) => Promise<void>,
    private readonly now: () => number,
  ) {}

  /** Whether the call at `path` to `base` goes framed. */
  serves(base: string, path: string): boolean {
    if (!FRAMED_PATHS.has(path) || !base.startsWith("http://")) return false;
    const until = this.refusedUntil.get(base);
    if (until === undefined) return true;
    if (this.now() < until) return false;
    this.refusedUntil.delete(base);
    return true;
  }

  /**
   * One call to `base`. Throws `FramedRefused` (nothing was sent: send it
   * over HTTP/2) if the endpoint does not serve framed calls, and
   * `TransportError` for no answer, as `Transport.request` does.
   */
  async request(base: string, path: string, body: Body, timeout: number | undefined, signal: AbortSignal | undefined, dropOnTimeout: boolean): Promise<Record<string, Json>> {
    signal?.throwIfAborted();
    let connection = this.connections.get(base);
    if (!connection || connection.closed) {
      connection = new Connection(base, this.authorization, this.connectTimeout, () => this.probe(base), this.now, () => {
        this.refusedUntil.set(base, this.now() + REFUSAL_MEMORY);
      });
      this.connections.set(base, connection);
    }
    if (!connection.welcomed) {
      try {
        await connection.ready;
      } catch (error) {
        // Nothing was sent on a connection that was never welcomed.
        if (error instanceof TransportError) throw new TransportError(error.message, true, { cause: error });
        throw error;
      }
    }
    return connection.call(path, body, timeout, this.deadlines, signal, dropOnTimeout);
  }

  close(): void {
    for (const connection of this.connections.values()) connection.destroy(new TransportError("the client was closed"));
    this.connections.clear();
  }
}
