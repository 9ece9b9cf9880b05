// The real server for the tests: $JOINTSPACE_BIN (default target/release/jointspace at the repository root)
// `serve` on a free port with the fixture bundle (models/fixture-tiny), a SQLite database in a scratch folder
// and ORT_DYLIB_PATH from the environment (or the repository's .venv, as scripts/lib.sh finds it), ready when
// /readyz answers 200. No mocks: every test talks HTTP to it.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root (this file runs from clients/typescript/dist/test/). */
export const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");

export const fixtures = join(repo, "tests", "fixtures", "images");

/** A fixture photo's bytes (fixture_0.png .. fixture_7.png: 96x64 to 640x480, PNG). */
export function photo(n: number): Uint8Array<ArrayBuffer> {
  return new Uint8Array(readFileSync(join(fixtures, `fixture_${n}.png`)));
}

function ortDylib(): string {
  const env = process.env.ORT_DYLIB_PATH;
  if (env) return env;
  const lib = join(repo, ".venv", "lib");
  if (existsSync(lib)) {
    for (const py of readdirSync(lib).filter((d) => d.startsWith("python3"))) {
      const capi = join(lib, py, "site-packages", "onnxruntime", "capi");
      if (!existsSync(capi)) continue;
      const so = readdirSync(capi).find((f) => f.startsWith("libonnxruntime.so."));
      if (so) return join(capi, so);
    }
  }
  throw new Error("no onnxruntime library: set ORT_DYLIB_PATH (scripts/lib.sh ort_dylib finds it)");
}

export async function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.once("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const a = s.address();
      const port = typeof a === "object" && a ? a.port : 0;
      s.close(() => ok(port));
    });
  });
}

export interface KeySpec {
  name: string;
  key: string;
  role: "admin" | "write" | "read";
  collections?: string[];
  requests_per_second?: number;
  burst?: number;
}

export interface Server {
  base: string;
  dir: string;
  /** The server's log so far. */
  log(): string;
  stop(): Promise<void>;
}

function toml(keys: KeySpec[]): string {
  return keys
    .map((k) =>
      [
        "[[key]]",
        ...Object.entries(k).map(([f, v]) => `${f} = ${JSON.stringify(v)}`),
      ].join("\n"),
    )
    .join("\n\n");
}

/** Starts a server with these serve flags (and a keys file, when keys are given), and waits until it is ready. */
export async function startServer(opts: { keys?: KeySpec[]; args?: string[] } = {}): Promise<Server> {
  const bin = process.env.JOINTSPACE_BIN ?? join(repo, "target", "release", "jointspace");
  if (!existsSync(bin)) throw new Error(`no server binary at ${bin}: build it (cargo build --release) or set JOINTSPACE_BIN`);
  const dir = mkdtempSync(join(tmpdir(), "jointspace-ts-"));
  const port = await freePort();
  const args = [
    "serve",
    "--addr", `127.0.0.1:${port}`,
    "--bundle", join(repo, "models", "fixture-tiny"),
    "--database-url", `sqlite://${join(dir, "js.db")}`,
    "--snapshot-interval", "0",
    ...(opts.args ?? []),
  ];
  if (opts.keys) {
    writeFileSync(join(dir, "keys.toml"), toml(opts.keys));
    args.push("--keys-file", join(dir, "keys.toml"));
  }
  const env: NodeJS.ProcessEnv = { ...process.env, ORT_DYLIB_PATH: ortDylib(), RUST_LOG: "info,ort=warn" };
  for (const v of ["JOINTSPACE_ADMIN_KEY", "JOINTSPACE_READ_KEY", "JOINTSPACE_KEYS_FILE", "JOINTSPACE_MAX_REQUEST_BYTES"]) {
    delete env[v];
  }
  let out = "";
  const child: ChildProcess = spawn(bin, args, { env, stdio: ["ignore", "pipe", "pipe"] });
  child.stdout!.on("data", (b: Buffer) => (out += b.toString()));
  child.stderr!.on("data", (b: Buffer) => (out += b.toString()));
  let exited: number | null | undefined;
  const exit = new Promise<void>((ok) => child.once("exit", (code) => ((exited = code), ok())));
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (exited !== undefined) throw new Error(`the server stopped (exit ${exited}) before it was ready:\n${out.slice(-3000)}`);
    try {
      const r = await fetch(`${base}/readyz`);
      if (r.status === 200) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`${base}/readyz not ready after 60 s:\n${out.slice(-3000)}`);
    }
    await new Promise((ok) => setTimeout(ok, 50));
  }
  return {
    base,
    dir,
    log: () => out,
    async stop() {
      if (exited === undefined) {
        child.kill("SIGTERM");
        let timer: NodeJS.Timeout | undefined;
        await Promise.race([exit, new Promise((ok) => (timer = setTimeout(ok, 10_000)))]);
        clearTimeout(timer);
        if (exited === undefined) child.kill("SIGKILL");
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

let n = 0;
/** A collection name no other test uses. */
export function uniqueName(prefix: string): string {
  return `${prefix}-${process.pid}-${++n}`;
}
