/**
 * HTTP/2 through `node:http2`: one connection per endpoint, every request
 * a stream on it. No runtime dependency; client certificates for mutual TLS
 * (which the global `fetch` cannot present without undici's own API); and
 * a cancelled request resets its stream, which the server reads as its
 * caller leaving (a waiting acquire's queue place is given back).
 *
 * Why HTTP/2 and not `node:http`: measured against one node with 16
 * concurrent requests, a request cost 48 µs of client CPU over `node:http2`,
 * 72 µs over `node:http` with a keep-alive pool, and 225 µs through `fetch`;
 * Node runs the client on one thread, so that is its throughput. The calls
 * of a held lock's hot path (acquire, release, keepalive) go cheaper still
 * where the endpoint serves them: framed, on a connection of their own
 * (`framed.ts`). Every other call, and those where framed calls are not
 * served, come here.
 */

import http2 from "node:http2";
import { readFileSync } from "node:fs";
import { now } from "./protocol.js";

export interface TlsFiles {
  /** PEM file of the CA that signed the servers' certificates. */
  ca?: string | undefined;
  /** PEM files of a client certificate and its key, for mutual TLS. */
  cert?: string | undefined;
  key?: string | undefined;
}

export interface RawAnswer {
  status: number;
  text: string;
  retryAfter: string | undefined;
}

/** No answer: no connection, a reset, a timeout. `unsent`: the request never left this process. */
export class TransportError extends Error {
  constructor(
    message: string,
    readonly unsent = false,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/**
 * Calls that wait on the server (blocking acquires) get a connection of
 * their own, so that keepalives never queue behind them for one of the
 * server's streams per connection.
 */
export type Lane = "calls" | "waits";

/**
 * While requests are in flight on a connection, it is pinged this often
 * (HTTP/2 PING), and closed if the server does not answer a ping within
 * `PING_TIMEOUT`: a server that stopped without closing its connections (a
 * paused leader, a VM stall, a peer cut off by a partition) answers no
 * ping, and its calls go elsewhere after 1-1.5 s instead of waiting out
 * their own timeouts. Any live server answers pings at once, however long
 * its answer to a call (a lock wait) takes.
 */
export const PING_INTERVAL = 500;
const PING_TIMEOUT = 1000;

/** How often `Deadlines` looks for a request past its time: how late a timeout may fire. */
const SWEEP_INTERVAL = 50;

export interface Deadline {
  at: number;
  expire: () => void;
}

/**
 * Requests' deadlines, looked at by one timer every `SWEEP_INTERVAL`
 * rather than a timer per request: Node keeps a list of timers per
 * distinct duration, and the lease-bounded ones (a release, a wait) had a
 * fresh fractional duration each, so each request made and dropped a list
 * of its own. A timeout fires up to 50 ms late, which no lease relies on:
 * the lease clock (`Session`) ends a lease on its own.
 */
export class Deadlines {
  private readonly pending = new Set<Deadline>();
  private sweeper: ReturnType<typeof setInterval> | undefined;

  add(at: number, expire: () => void): Deadline {
    const deadline = { at, expire };
    this.pending.add(deadline);
    if (this.sweeper === undefined) {
      // Unreferenced: requests in flight hold the process open by their connection.
      this.sweeper = setInterval(() => this.sweep(), SWEEP_INTERVAL);
      this.sweeper.unref();
    }
    return deadline;
  }

  delete(deadline: Deadline): void {
    this.pending.delete(deadline);
  }

  private sweep(): void {
    const time = now();
    for (const deadline of this.pending) {
      if (deadline.at > time) continue;
      this.pending.delete(deadline);
      deadline.expire();
    }
    if (this.pending.size === 0) {
      clearInterval(this.sweeper);
      this.sweeper = undefined;
    }
  }
}

export class Transport {
  private readonly sessions = new Map<string, http2.ClientHttp2Session>();
  /** Connections that came up: a request on one that did not was never sent. */
  private readonly connected = new WeakSet<http2.ClientHttp2Session>();
  /** Requests in flight per connection: a connection keeps the process alive only while it has some. */
  private readonly inFlight = new WeakMap<http2.ClientHttp2Session, number>();
  private readonly tls: { ca?: Buffer; cert?: Buffer; key?: Buffer };

  constructor(
    private readonly headers: Record<string, string>,
    tls: TlsFiles,
    private readonly connectTimeout: number,
    private readonly deadlines: Deadlines,
  ) {
    this.tls = {
      ...(tls.ca ? { ca: readFileSync(tls.ca) } : {}),
      ...(tls.cert ? { cert: readFileSync(tls.cert) } : {}),
      ...(tls.key ? { key: readFileSync(tls.key) } : {}),
    };
  }

  /** The connection to `base` for `lane`, made (or made again) as needed. */
  private session(base: string, lane: Lane): http2.ClientHttp2Session {
    const key = `${lane} ${base}`;
    const open = this.sessions.get(key);
    if (open && !open.closed && !open.destroyed) return open;
    const session = http2.connect(base, this.tls);
    // A connection must not keep the process alive by itself; requests in
    // flight do (see `hold`).
    session.unref();
    const forget = (): void => {
      if (this.sessions.get(key) === session) this.sessions.delete(key);
    };
    const connecting = setTimeout(() => {
      if (session.connecting) session.destroy(new TransportError(`could not connect to ${base} within ${this.connectTimeout}ms`, true));
    }, this.connectTimeout);
    connecting.unref();
    session.once("connect", () => {
      clearTimeout(connecting);
      this.connected.add(session);
    });
    session.on("close", forget);
    session.on("goaway", forget);
    session.on("error", forget);
    this.watch(session, base);
    this.sessions.set(key, session);
    return session;
  }

  /** Pings `session` while it has requests in flight; closes it when a ping goes unanswered. */
  private watch(session: http2.ClientHttp2Session, base: string): void {
    let pinging = false;
    const pinger = setInterval(() => {
      if (pinging || !this.connected.has(session) || (this.inFlight.get(session) ?? 0) === 0) return;
      if (session.closed || session.destroyed) return;
      const silent = setTimeout(() => {
        // After the I/O the loop has waiting: an answer that came while this
        // process was busy (a timer can fire late, before it) counts.
        setImmediate(() => {
          if (pinging) session.destroy(new TransportError(`${base} answered no ping within ${PING_TIMEOUT}ms (stopped or cut off?)`));
        });
      }, PING_TIMEOUT);
      silent.unref();
      pinging = session.ping(() => {
        // An error here means the connection is closing: its streams say why.
        pinging = false;
        clearTimeout(silent);
      });
      if (!pinging) clearTimeout(silent);
    }, PING_INTERVAL);
    pinger.unref();
    session.once("close", () => clearInterval(pinger));
  }

  /** Counts a request in or out of `session`, which holds the process open while any is in flight. */
  private hold(session: http2.ClientHttp2Session, change: 1 | -1): void {
    const count = (this.inFlight.get(session) ?? 0) + change;
    this.inFlight.set(session, count);
    if (count === 1 && change === 1) session.ref();
    if (count === 0 && !session.destroyed) session.unref();
  }

  /**
   * One request to `base` (`scheme://host:port`). `timeout`: the most to
   * wait for the answer (undefined: as long as it takes); `signal` cancels
   * it, resetting its stream.
   */
  request(
    base: string,
    method: string,
    path: string,
    body: string | undefined,
    timeout: number | undefined,
    signal?: AbortSignal,
    lane: Lane = "calls",
  ): Promise<RawAnswer> {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) {
        reject(signal.reason);
        return;
      }
      let session: http2.ClientHttp2Session;
      try {
        session = this.session(base, lane);
      } catch (error) {
        reject(new TransportError(error instanceof Error ? error.message : String(error), true));
        return;
      }
      const stream = session.request({
        ...this.headers,
        ":method": method,
        ":path": path,
        ...(body === undefined ? {} : { "content-length": Buffer.byteLength(body) }),
      });
      this.hold(session, 1);
      let status = 0;
      let retryAfter: string | undefined;
      const chunks: Buffer[] = [];
      // The caller's whole budget, connecting included: a keepalive must
      // not outlive the lease it renews.
      const limit = timeout;
      const deadline =
        limit === undefined
          ? undefined
          : this.deadlines.add(now() + limit, () => {
              finish(new TransportError(`no answer within ${Math.round(limit)}ms`));
              // A connection that answers a call nothing in time is presumed
              // dead (a dropped NAT entry, a frozen peer): the next call makes
              // a new one instead of queueing on it. (A wait running out of
              // its time is routine, and says nothing about the connection.)
              if (lane === "calls") session.destroy();
            });
      const onAbort = (): void => finish(signal?.reason ?? new Error("aborted"));
      signal?.addEventListener("abort", onAbort, { once: true });
      let done = false;
      const finish = (error?: unknown): void => {
        if (done) return;
        done = true;
        if (deadline) this.deadlines.delete(deadline);
        signal?.removeEventListener("abort", onAbort);
        this.hold(session, -1);
        if (error === undefined) {
          resolve({ status, text: Buffer.concat(chunks).toString("utf8"), retryAfter });
          return;
        }
        if (!stream.closed) stream.close(http2.constants.NGHTTP2_CANCEL);
        if (error instanceof TransportError || signal?.aborted) reject(error);
        else {
          // A connection that never came up never carried the request.
          const unsent = !this.connected.has(session);
          reject(new TransportError(error instanceof Error ? error.message || error.name : String(error), unsent, { cause: error }));
        }
      };
      stream.on("response", (headers) => {
        status = Number(headers[":status"] ?? 0);
        const after = headers["retry-after"];
        retryAfter = typeof after === "string" ? after : undefined;
      });
      stream.on("data", (chunk: Buffer) => chunks.push(chunk));
      // A stream of a connection that went away can end without an answer.
      stream.on("end", () => finish(status === 0 ? new TransportError("the connection closed before the answer") : undefined));
      stream.on("error", (error) => finish(error));
      stream.on("close", () => {
        if (!done) finish(new TransportError(`the stream closed before the answer (code ${stream.rstCode})`));
      });
      stream.end(body);
    });
  }

  /**
   * Resolves once `base` answers an HTTP/2 ping on its connection for
   * calls (made if need be); rejects if it does not within `PING_TIMEOUT`.
   * Framed calls, which have no ping of their own, ask this of the server.
   */
  ping(base: string): Promise<void> {
    return new Promise((resolve, reject) => {
      const session = this.session(base, "calls");
      const silent = setTimeout(() => {
        setImmediate(() => reject(new TransportError(`${base} answered no ping within ${PING_TIMEOUT}ms (stopped or cut off?)`)));
      }, PING_TIMEOUT);
      silent.unref();
      const send = (): void => {
        let sent = false;
        try {
          sent = session.ping((error) => {
            clearTimeout(silent);
            if (error) reject(error);
            else resolve();
          });
        } catch {
          // A connection torn down meanwhile: as good as no answer.
        }
        if (!sent) {
          clearTimeout(silent);
          reject(new TransportError(`${base}: the connection is closing`));
        }
      };
      if (session.connecting) session.once("connect", send);
      else send();
    });
  }

  close(): void {
    for (const session of this.sessions.values()) session.close();
    this.sessions.clear();
  }
}
