// Compiles a small consumer project against the built package under each
// module resolution users have: node16, nodenext and bundler. node-redlock's
// types did not resolve under the last two; this keeps ours from doing the
// same. Run after `npm run build`: `node consumers/check.mjs`.
import { execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const pkg = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(pkg, "node_modules", "typescript", "bin", "tsc");

const consumer = `
import { Client, LeaseLostError, type Guard } from "deadbolt-client";
import { startServer } from "deadbolt-client/testing";

export async function nightly(): Promise<bigint> {
  await using server = await startServer();
  const client = new Client({ endpoints: server.endpoint });
  await using guard: Guard = await client.lock("cron/nightly", { ttl: "30s", timeout: "5s" });
  guard.signal.addEventListener("abort", () => console.log(guard.signal.reason instanceof LeaseLostError));
  const token: bigint = guard.token;
  return token;
}
`;

const settings = {
  node16: { module: "Node16", moduleResolution: "Node16" },
  nodenext: { module: "NodeNext", moduleResolution: "NodeNext" },
  bundler: { module: "ESNext", moduleResolution: "Bundler" },
};

let failed = false;
for (const [name, options] of Object.entries(settings)) {
  const dir = mkdtempSync(join(tmpdir(), `deadbolt-consumer-${name}-`));
  try {
    mkdirSync(join(dir, "node_modules"));
    symlinkSync(pkg, join(dir, "node_modules", "deadbolt-client"), "dir");
    symlinkSync(join(pkg, "node_modules", "@types"), join(dir, "node_modules", "@types"), "dir");
    writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "consumer", type: "module", private: true }));
    writeFileSync(
      join(dir, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: { ...options, target: "ES2022", lib: ["ES2022", "ESNext.Disposable"], strict: true, noEmit: true, types: ["node"] },
        include: ["index.ts"],
      }),
    );
    writeFileSync(join(dir, "index.ts"), consumer);
    execFileSync(process.execPath, [tsc, "-p", dir], { stdio: "inherit" });
    console.log(`consumer with moduleResolution ${name}: types resolve`);
  } catch {
    console.error(`consumer with moduleResolution ${name}: FAILED (above)`);
    failed = true;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
process.exit(failed ? 1 : 0);
