/**
 * Deadbolt: a distributed lock whose every grant carries a fencing token.
 *
 * ```ts
 * import { Client } from "deadbolt-client";
 * const client = new Client("http://10.0.0.1:7070,http://10.0.0.2:7070,http://10.0.0.3:7070");
 * await using guard = await client.lock("invoice-981", { ttl: "30s", timeout: "5s" });
 * await writeInvoice({ fencingToken: guard.token, signal: guard.signal });
 * ```
 */

export { Client, Guard, Session, type ClientOptions, type ConnectOptions, type Endpoints, type LockOptions, type SessionOptions, type TryLockOptions, type WaitOptions } from "./client.js";
export { SessionHandle, type AuditEntry, type Leader, type LockStatus, type Permit, type SemaphoreStatus, type Stored, type WatchEvent } from "./calls.js";
export * from "./errors.js";
export { type Duration, millis, decodeJson } from "./protocol.js";
export type { TlsFiles } from "./transport.js";
