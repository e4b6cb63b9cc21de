/**
 * The protocol rules every Deadbolt client keeps, free of I/O: durations as
 * people write them, the lease clock and the conservative deadline, acquire
 * `attempt` ids, backoff with full jitter, following `not_leader`, and
 * reading answers whose integers may not fit a JavaScript number.
 */

import { DeadboltError, InvalidArgumentError, NotLeaderError, OverloadedError, UnavailableError, errorFor } from "./errors.js";

/** A duration: milliseconds as a number, or text such as `"30s"`, `"500ms"`, `"1m30s"`, `"2h"`. */
export type Duration = number | string;

const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };
const PART = /(\d+(?:\.\d+)?)(ms|s|m|h|d)/gy;

/** A duration in milliseconds; an `InvalidArgumentError` saying how to write one otherwise. */
export function millis(duration: Duration, what = "duration"): number {
  if (typeof duration === "number") {
    if (!Number.isFinite(duration) || duration < 0) {
      throw new InvalidArgumentError("invalid_argument", `${what} ${duration} is not a duration of 0 ms or more`);
    }
    return duration;
  }
  if (typeof duration !== "string") {
    throw new InvalidArgumentError("invalid_argument", `${what} must be a duration, not ${typeof duration}`);
  }
  const text = duration.replace(/\s+/g, "");
  let total = 0;
  let consumed = 0;
  PART.lastIndex = 0;
  for (let match = PART.exec(text); match; match = PART.exec(text)) {
    total += Number(match[1]) * (UNIT_MS[match[2] ?? "ms"] ?? 1);
    consumed = PART.lastIndex;
  }
  if (text === "" || consumed !== text.length) {
    throw new InvalidArgumentError(
      "invalid_argument",
      `${what} ${JSON.stringify(duration)} is not a duration: write it like 30s, 500ms, 1m30s or 2h`,
    );
  }
  return total;
}

/**
 * Milliseconds on the clock lease deadlines are kept on. Node has no
 * CLOCK_BOOTTIME, and its monotonic clock stops while the machine is
 * suspended (the server's does not stop for our suspend); the wall clock
 * keeps going through a suspend but can be stepped. So this advances by the
 * larger of the two, never less than either: a suspend or a forward step
 * makes the lease look shorter, which is safe, and a backward step is
 * ignored.
 */
export const now: () => number = (() => {
  let last = performance.now();
  let lastWall = Date.now();
  let reading = last;
  return () => {
    const mono = performance.now();
    const wall = Date.now();
    reading += Math.max(mono - last, wall - lastWall, 0);
    last = mono;
    lastWall = wall;
    return reading;
  };
})();

/**
 * What a client knows of its session's lease: the latest instant (on `now()`)
 * it is certain to last until, and why it ended, once it has.
 */
export class Lease {
  ended: DeadboltError | undefined;

  constructor(
    readonly sessionId: bigint,
    public deadline: number,
  ) {}

  /** Why the lease cannot be trusted `margin` ms ahead, or `undefined`. */
  lostReason(margin = 0): DeadboltError | undefined {
    if (this.ended) return this.ended;
    if (now() >= this.deadline - margin) return this.expired();
    return undefined;
  }

  expired(cause?: unknown): DeadboltError {
    const because = cause instanceof Error ? ` (${cause.message})` : "";
    return errorFor(
      "session_expiring",
      `session ${this.sessionId} lost its lease: it could not be renewed in time${because}`,
    );
  }

  /**
   * After a keepalive sent at `sent` was granted `granted` ms; whether the
   * lease still holds. The server counts from when it received it, no
   * earlier than `sent`, and never shortens a lease; neither does this. An
   * answer that arrives once the lease is within `margin` of its end cannot
   * revive it: the client has counted it lost (`signal` aborted, work
   * stopped), and a lease renewed behind its back would keep the lock from
   * everyone while nobody uses it (the conformance suite's frozen server
   * found this past the deadline; the Go client's, within the margin).
   */
  renewed(sent: number, granted: number, margin: number): boolean {
    if (this.lostReason(margin)) return false;
    this.deadline = Math.max(this.deadline, sent + granted);
    return true;
  }

  /** Ends the lease for `reason` unless it has ended; whether this call did. */
  end(reason: DeadboltError): boolean {
    if (this.ended) return false;
    this.ended = reason;
    return true;
  }
}

let lastAttempt = 0n;

/**
 * A fresh acquire attempt id: microseconds of wall-clock time, strictly
 * increasing within the process, so the server can tell a retry from the
 * older request it replaces.
 */
export function nextAttempt(): bigint {
  const micros = BigInt(Date.now()) * 1000n;
  lastAttempt = micros > lastAttempt ? micros : lastAttempt + 1n;
  return lastAttempt;
}

/**
 * Longest pause between retries while the cluster fails over (`unavailable`,
 * `not_leader`): an election takes 0.2-0.6 s at the default timeouts, and a
 * pause of up to a second after it would make the caller wait for nothing
 * (issue 59). A node that cannot serve answers such a retry at once and
 * cheaply; the jitter still spreads a dead leader's callers over a quarter
 * of a second. The Rust, Python and Go clients use the same two caps.
 */
export const FAILOVER_CAP = 250;
/** Longest pause between retries of an overloaded call: recovery is noticed within a second, the refused callers stay spread out. */
export const OVERLOAD_CAP = 1000;

/** Exponential backoff with full jitter: 50 ms doubling to a cap. */
class Backoff {
  private attempt = 0;

  constructor(
    private readonly base = 50,
    private readonly cap = OVERLOAD_CAP,
  ) {}

  nextDelay(): number {
    const ceiling = Math.min(this.cap, this.base * 2 ** Math.min(this.attempt, 32));
    this.attempt += 1;
    return Math.random() * ceiling;
  }
}

/** The pauses of one retried call: a failover's (another node, or the next leader, may answer soon) and an overloaded leader's (still the leader, and it needs time). */
export class RetryPause {
  private readonly failover = new Backoff(50, FAILOVER_CAP);
  private readonly overload = new Backoff(50, OVERLOAD_CAP);

  /** The pause before retrying `error`: for an overloaded server, up to its Retry-After if longer. */
  after(error: DeadboltError): number {
    if (error.kind === "unavailable" || error.kind === "not_leader") return this.failover.nextDelay();
    const delay = this.overload.nextDelay();
    if (error instanceof OverloadedError && error.retryAfter) {
      return Math.max(delay, Math.random() * error.retryAfter * 1000);
    }
    return delay;
  }
}

/** Worth repeating after a backoff: unreachable, not the leader, or overloaded. */
export function isTransient(error: unknown): error is DeadboltError {
  return error instanceof DeadboltError && ["unavailable", "not_leader", "overloaded"].includes(error.kind);
}

/** The server has no live session by that id: every lock it held is gone. */
export function endsSession(error: unknown): boolean {
  return error instanceof DeadboltError && ["unknown_session", "session_expiring"].includes(error.kind);
}

/** `host:port` means `http://host:port` (`https` with TLS); a bare host port 7070. */
export function normalize(endpoint: string, tls: boolean): string {
  let url = endpoint.trim().replace(/\/+$/, "");
  if (!url.includes("://")) url = `${tls ? "https" : "http"}://${url}`;
  const parsed = new URL(url);
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new InvalidArgumentError("invalid_argument", `endpoint ${JSON.stringify(endpoint)}: use http:// or https://`);
  }
  return `${parsed.protocol}//${parsed.hostname.includes(":") ? `[${parsed.hostname}]` : parsed.hostname}:${parsed.port || "7070"}`;
}

/**
 * The servers a client knows, and the one it talks to. A follower names
 * the leader in its `not_leader` answer: the client goes there.
 */
export class Endpoints {
  readonly urls: string[];
  private current = 0;

  constructor(endpoints: string | readonly string[], tls: boolean) {
    const items = typeof endpoints === "string" ? endpoints.split(",") : [...endpoints];
    this.urls = items.filter((item) => item.trim() !== "").map((item) => normalize(item, tls));
    if (this.urls.length === 0) throw new InvalidArgumentError("invalid_argument", "no Deadbolt server endpoint given");
  }

  url(): string {
    return this.urls[this.current] ?? (this.urls[0] as string);
  }

  /** Moves on after `error` from `url`: to the leader it names, or to the next endpoint. */
  failed(url: string, error: DeadboltError): void {
    if (this.url() !== url) return;
    if (error instanceof NotLeaderError && error.leader) {
      const leader = `${url.split("://")[0]}://${error.leader}`;
      if (!this.urls.includes(leader)) this.urls.push(leader);
      this.current = this.urls.indexOf(leader);
    } else if (error.kind === "unavailable" || error.kind === "not_leader") {
      this.current = (this.current + 1) % this.urls.length;
    }
  }
}

/** A JSON value as answers carry it: every integer read as its digits (see `decodeJson`). */
export type Json = string | number | boolean | null | Json[] | { [key: string]: Json };

/**
 * Parses JSON whose integers may exceed 2^53 (tokens track microseconds):
 * every integer literal outside a string is read as a string of its digits,
 * and the typed readers below turn each into the `bigint` or `number` its
 * field is. Nothing is ever rounded.
 */
export function decodeJson(text: string): Json {
  let out = "";
  let from = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++; // a backslash escapes the next character
      else if (c === 0x22) inString = false;
      continue;
    }
    if (c === 0x22) {
      inString = true;
    } else if (c === 0x2d || (c >= 0x30 && c <= 0x39)) {
      let end = i + 1;
      while (end < text.length && /[0-9.eE+-]/.test(text[end] as string)) end++;
      const literal = text.slice(i, end);
      if (/^-?\d+$/.test(literal)) {
        out += `${text.slice(from, i)}"${literal}"`;
        from = end;
      }
      i = end - 1;
    }
  }
  return JSON.parse(out + text.slice(from)) as Json;
}

/** Encodes a flat request body; `bigint`s as exact JSON integers. */
export function encodeBody(body: Record<string, string | number | bigint | boolean | undefined>): string {
  const fields: string[] = [];
  for (const [key, value] of Object.entries(body)) {
    if (value === undefined) continue;
    fields.push(`${JSON.stringify(key)}:${typeof value === "bigint" ? value.toString() : JSON.stringify(value)}`);
  }
  return `{${fields.join(",")}}`;
}

/** An answer's object, or the error it names. */
export function parseAnswer(status: number, text: string, retryAfter: string | undefined): Record<string, Json> {
  let answer: Json;
  try {
    answer = text === "" ? {} : decodeJson(text);
  } catch {
    answer = null;
  }
  if (answer === null || typeof answer !== "object" || Array.isArray(answer)) {
    const kind = [502, 503, 504].includes(status) ? "unavailable" : "internal";
    throw errorFor(kind, `unexpected reply (HTTP ${status}), not from a Deadbolt server? ${JSON.stringify(text.slice(0, 200))}`);
  }
  const error = answer["error"];
  if (error && typeof error === "object" && !Array.isArray(error)) {
    const kind = typeof error["kind"] === "string" ? error["kind"] : "internal";
    const message = typeof error["message"] === "string" ? error["message"] : kind;
    const leader = typeof error["leader"] === "string" ? error["leader"] : undefined;
    const after = retryAfter === undefined ? undefined : Number(retryAfter);
    throw errorFor(kind, message, { leader, retryAfter: Number.isFinite(after) ? after : undefined });
  }
  if (status >= 400) throw errorFor("internal", `HTTP ${status} without an error description`);
  return answer;
}

/** The error for a request that got no answer from `url`. */
export function unreachable(url: string, cause: unknown, unsent: boolean): UnavailableError {
  const reason = cause instanceof Error ? cause.message : String(cause);
  const error = new UnavailableError("unavailable", `could not reach the Deadbolt server at ${url}: ${reason}`, { cause });
  error.unsent = unsent;
  return error;
}

/**
 * No answer came, and the request may have reached the server: it may have
 * been done. A repeat that finds it done ("not holder" after a release,
 * "unknown session" after a close) is its success.
 */
export function mayHaveBeenDone(error: unknown): boolean {
  return error instanceof UnavailableError && !error.unsent;
}

/**
 * A change `cutOff` (its answer lost, so it may have been done), repeated
 * and then `refused`: the outcome is unknown, reported as `unavailable`
 * (as the Rust client's `Error::of_unknown_outcome` reports it), not as
 * the refusal, which says nothing of the first attempt.
 */
export function unknownOutcome(cutOff: DeadboltError, refused: DeadboltError): UnavailableError {
  const error = new UnavailableError(
    "unavailable",
    `${cutOff.message}; repeated, the call was refused (${refused.message}), which does not say whether the first attempt was done: it may have been, its outcome is unknown`,
    { cause: refused },
  );
  error.outcomeUnknown = true;
  return error;
}

// ---- typed readers of answer fields ----------------------------------------

// A field left out reads as 0, as in protobuf's JSON. Anything else that
// is not a whole number of the field's range is not an answer a Deadbolt
// server gives: it is refused, not read as 0.

const U64_LIMIT = 1n << 64n;

export function u64(value: Json | undefined): bigint {
  if (value === undefined || value === null) return 0n;
  if (typeof value === "string" && /^\d+$/.test(value) && BigInt(value) < U64_LIMIT) return BigInt(value);
  throw malformed(value, "an unsigned 64-bit integer");
}

export function int(value: Json | undefined): number {
  if (value === undefined || value === null) return 0;
  if (typeof value === "string" && /^-?\d+$/.test(value) && Number.isSafeInteger(Number(value))) return Number(value);
  throw malformed(value, "an integer");
}

function malformed(value: Json, what: string): DeadboltError {
  return errorFor("internal", `the server's answer has ${JSON.stringify(value)} where ${what} belongs: is it a Deadbolt server?`);
}

export function text(value: Json | undefined): string {
  return typeof value === "string" ? value : "";
}

export function list(value: Json | undefined): Json[] {
  return Array.isArray(value) ? value : [];
}

export function object(value: Json | undefined): Record<string, Json> | undefined {
  return value && typeof value === "object" && !Array.isArray(value) ? value : undefined;
}
