// The ```ts examples of docs/api.md, type-checked against the built client: they are joined into one module
// (imports first; `file` declared as the File a page would have) and compiled with tsc --noEmit, so an
// example that no longer matches the client fails the test run. Run after `npm run build`.
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const doc = join(root, "..", "..", "docs", "api.md");
const blocks = [...readFileSync(doc, "utf8").matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((m) => m[1]);
if (blocks.length === 0) throw new Error("docs/api.md has no ```ts examples");
const lines = blocks.join("\n").split("\n");
const imports = lines.filter((l) => /^import /.test(l));
const body = lines.filter((l) => !/^import /.test(l));
const dir = join(root, "dist", "docs-check");
rmSync(dir, { recursive: true, force: true });
mkdirSync(dir, { recursive: true });
writeFileSync(
  join(dir, "api-md.ts"),
  [...imports, "declare const file: File;", ...body, "export {};", ""].join("\n"),
);
try {
  execFileSync(
    process.execPath,
    [
      join(root, "node_modules", "typescript", "bin", "tsc"),
      "--noEmit", "--strict", "--target", "ES2022", "--module", "NodeNext", "--moduleResolution", "NodeNext",
      "--lib", "ES2022,DOM,DOM.Iterable", "--types", "node", "--skipLibCheck",
      join(dir, "api-md.ts"),
    ],
    { cwd: root, stdio: "inherit" },
  );
} catch {
  console.error(`docs/api.md: its TypeScript examples (${blocks.length} blocks, joined in ${join(dir, "api-md.ts")}) do not compile`);
  process.exit(1);
}
console.log(`docs/api.md: ${blocks.length} TypeScript examples compile`);
