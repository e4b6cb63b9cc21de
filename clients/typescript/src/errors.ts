/**
 * Errors: one class per kind the server (or the transport) reports, each
 * with the server's `kind` string and its message, which already names the
 * lock, session or token involved. Branch with `instanceof` or on `.kind`.
 */

/** A failed Deadbolt request. */
export class DeadboltError extends Error {
  /** The server's error kind: `busy`, `wait_timeout`, `stale_token`, ... */
  readonly kind: string;

  constructor(kind: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.kind = kind;
    this.name = new.target.name;
  }
}

/** Another session holds the lock (a non-waiting acquire). */
export class LockBusyError extends DeadboltError {}
/** A waiting acquire ran out of its timeout; it left no queue place behind. */
export class WaitTimeoutError extends DeadboltError {}
export class WaitCancelledError extends DeadboltError {}
/** The session does not hold that lock (released, or its lease ended). */
export class NotHolderError extends DeadboltError {}
/** The token is not the current grant's, or is below a key's fence. */
export class StaleTokenError extends DeadboltError {}
export class InvalidArgumentError extends DeadboltError {}
export class LimitReachedError extends DeadboltError {}
/**
 * The session's lease is gone, or can no longer be trusted: every lock it
 * held may now be someone else's.
 */
export class LeaseLostError extends DeadboltError {}
export class SessionExpiringError extends LeaseLostError {}
export class UnknownSessionError extends LeaseLostError {}
/** The node is not the leader; the client follows `leader` by itself. */
export class NotLeaderError extends DeadboltError {
  constructor(
    kind: string,
    message: string,
    readonly leader: string | undefined,
  ) {
    super(kind, message);
  }
}
/** No server could be reached, or none answered in time. */
export class UnavailableError extends DeadboltError {
  /** The request never left this process, so it certainly did nothing. */
  unsent = false;
  /**
   * A change whose first attempt was cut off (the connection broke after
   * it was sent, or a forwarding node said it may or may not have been
   * done) and whose repeat was refused: the refusal (say, a stale token,
   * because a newer holder wrote since) does not say whether the first
   * attempt was done, so neither can this error. Read the state again to
   * know.
   */
  outcomeUnknown = false;
}
/** The leader refused the request for now; nothing was done. */
export class OverloadedError extends DeadboltError {
  constructor(
    kind: string,
    message: string,
    /** Seconds, from the answer's `Retry-After`. */
    readonly retryAfter: number | undefined,
  ) {
    super(kind, message);
  }
}
export class InternalError extends DeadboltError {}
/** The identity lacks the permission, or the session is not its own. */
export class PermissionDeniedError extends DeadboltError {}
/** Access control is on and the call carried no valid credentials. */
export class UnauthenticatedError extends DeadboltError {}
/** The cluster version does not allow this yet; the message names the nodes to upgrade. */
export class NeedsUpgradeError extends DeadboltError {}
export class CompactedError extends DeadboltError {}

type Plain = new (kind: string, message: string) => DeadboltError;

const BY_KIND: Record<string, Plain> = {
  busy: LockBusyError,
  wait_timeout: WaitTimeoutError,
  wait_cancelled: WaitCancelledError,
  not_holder: NotHolderError,
  stale_token: StaleTokenError,
  invalid_argument: InvalidArgumentError,
  limit_reached: LimitReachedError,
  session_expiring: SessionExpiringError,
  unknown_session: UnknownSessionError,
  unavailable: UnavailableError,
  internal: InternalError,
  permission_denied: PermissionDeniedError,
  unauthenticated: UnauthenticatedError,
  needs_upgrade: NeedsUpgradeError,
  compacted: CompactedError,
};

/** Every kind the server reports, in the order of its `ErrorKind`. */
export const ERROR_KINDS = [...Object.keys(BY_KIND), "not_leader", "overloaded"].sort();

/** The error for a server answer of `kind`. */
export function errorFor(
  kind: string,
  message: string,
  extra: { leader?: string | undefined; retryAfter?: number | undefined } = {},
): DeadboltError {
  if (kind === "not_leader") return new NotLeaderError(kind, message, extra.leader);
  if (kind === "overloaded") return new OverloadedError(kind, message, extra.retryAfter);
  const Class = BY_KIND[kind];
  return Class ? new Class(kind, message) : new DeadboltError(kind, message);
}
