/**
 * A real, throwaway `deadbolt server` for tests, which a test can freeze
 * past a lease to see its own lock-loss handling work:
 *
 * ```ts
 * import { startServer } from "deadbolt-client/testing";
 * await using server = await startServer();
 * const client = new Client({ endpoints: server.endpoint });
 * ```
 *
 * The binary is `$DEADBOLT_BIN`, or `deadbolt` on the `PATH`.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, openSync, closeSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import http from "node:http";

const STARTUP_LIMIT = 30_000;

/** A port below the kernel's ephemeral range (which `bind(0)` and outgoing connections draw on). */
async function freePort(): Promise<number> {
  for (let attempt = 0; attempt < 64; attempt++) {
    const port = 10_000 + Math.floor(Math.random() * 20_000);
    const free = await new Promise<boolean>((resolve) => {
      const probe = createServer();
      probe.once("error", () => resolve(false));
      probe.listen(port, "127.0.0.1", () => probe.close(() => resolve(true)));
    });
    if (free) return port;
  }
  throw new Error("no free port between 10000 and 30000");
}

function ready(endpoint: string): Promise<boolean> {
  return new Promise((resolve) => {
    const request = http.get(`${endpoint}/ready`, { timeout: 1000 }, (response) => {
      response.resume();
      resolve(response.statusCode === 200);
    });
    request.on("error", () => resolve(false));
    request.on("timeout", () => request.destroy());
  });
}

export class TestServer {
  private constructor(
    readonly endpoint: string,
    private readonly process: ChildProcess,
    private readonly directory: string,
  ) {}

  static async start(): Promise<TestServer> {
    const bin = process.env["DEADBOLT_BIN"] ?? "deadbolt";
    const directory = mkdtempSync(join(tmpdir(), "deadbolt-test-"));
    const port = await freePort();
    const log = openSync(join(directory, "server.log"), "w");
    const child = spawn(bin, ["server", "--listen", `127.0.0.1:${port}`, "--data-dir", join(directory, "data")], {
      stdio: ["ignore", "ignore", log],
    });
    closeSync(log);
    let failedToStart: Error | undefined;
    child.once("error", (error) => {
      failedToStart = error;
    });
    const server = new TestServer(`http://127.0.0.1:${port}`, child, directory);
    const started = Date.now();
    while (!(await ready(server.endpoint))) {
      if (failedToStart) {
        throw new Error(`cannot run ${bin} (set DEADBOLT_BIN, or put deadbolt on the PATH): ${failedToStart.message}`);
      }
      if (child.exitCode !== null || child.signalCode !== null) {
        throw new Error(`deadbolt server exited (${child.exitCode ?? child.signalCode}); see ${directory}/server.log`);
      }
      if (Date.now() - started > STARTUP_LIMIT) throw new Error(`deadbolt server not ready within ${STARTUP_LIMIT}ms`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    return server;
  }

  get pid(): number {
    return this.process.pid ?? 0;
  }

  /** Freezes the server (SIGSTOP): it answers nothing and renews no lease until `resume`. */
  pause(): void {
    this.process.kill("SIGSTOP");
  }

  resume(): void {
    this.process.kill("SIGCONT");
  }

  async stop(): Promise<void> {
    if (this.process.exitCode === null && this.process.signalCode === null) {
      const exited = new Promise((resolve) => this.process.once("exit", resolve));
      this.process.kill("SIGCONT");
      this.process.kill("SIGKILL");
      await exited;
    }
    rmSync(this.directory, { recursive: true, force: true });
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }
}

/** Starts a real single-node server with an empty data directory of its own. */
export function startServer(): Promise<TestServer> {
  return TestServer.start();
}
