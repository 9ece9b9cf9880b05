// src/schema.ts from the repository's openapi.yaml, by the pinned openapi-typescript (package.json).
//
//   node scripts/generate.mjs           (npm run generate)      writes src/schema.ts
//   node scripts/generate.mjs --check   (npm run check-types)   regenerates into a temporary file and fails,
//                                                              naming the fix, when src/schema.ts differs
//
// The flags are the client's reading of the contract: `--empty-objects-unknown`, since a free-form object
// (metadata, a filter) holds anything, not nothing; `--default-non-nullable false`, since a field with a
// default (k, offset) may be left out of a request.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const spec = join(root, "..", "..", "openapi.yaml");
const committed = join(root, "src", "schema.ts");
const cli = join(root, "node_modules", "openapi-typescript", "bin", "cli.js");
const flags = ["--empty-objects-unknown", "--default-non-nullable", "false"];

function generate(out) {
  execFileSync(process.execPath, [cli, spec, ...flags, "--output", out], { cwd: root, stdio: ["ignore", "ignore", "inherit"] });
}

if (process.argv.includes("--check")) {
  const dir = mkdtempSync(join(tmpdir(), "jointspace-schema-"));
  try {
    const fresh = join(dir, "schema.ts");
    generate(fresh);
    const want = readFileSync(fresh, "utf8");
    let have = "";
    try {
      have = readFileSync(committed, "utf8");
    } catch {
      // missing: reported below as a difference
    }
    if (want !== have) {
      const a = have.split("\n");
      const b = want.split("\n");
      let i = 0;
      while (i < a.length && i < b.length && a[i] === b[i]) i++;
      console.error(
        `${relative(process.cwd(), committed)} is not what openapi-typescript makes of openapi.yaml ` +
          `(first difference at line ${i + 1}:\n  committed: ${JSON.stringify(a[i] ?? "<end of file>")}\n` +
          `  generated: ${JSON.stringify(b[i] ?? "<end of file>")}).\n` +
          `Regenerate it and commit the result: (cd clients/typescript && npm run generate)`,
      );
      process.exit(1);
    }
    console.log("src/schema.ts matches openapi.yaml");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
} else {
  generate(committed);
  console.log(`wrote ${relative(process.cwd(), committed)}`);
}
