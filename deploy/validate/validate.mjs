// Validates every object in deploy/k8s against the Kubernetes API's own JSON schemas (kubernetes-models'
// classes carry them), offline, and checks that kustomization.yaml names files that exist. Exits non-zero
// naming the file, the object and what is wrong. `--self-test` first proves that a broken object is refused.
//   node deploy/validate/validate.mjs deploy/k8s [--self-test]
import { readFileSync, readdirSync, existsSync } from "node:fs";
import { join } from "node:path";
import { parseAllDocuments } from "yaml";

// apiVersion "apps/v1" -> kubernetes-models/apps/v1; the core group "v1" -> kubernetes-models/v1.
async function classOf(apiVersion, kind) {
  let mod;
  try {
    mod = await import(`kubernetes-models/${apiVersion}`);
  } catch {
    throw new Error(`unknown apiVersion ${apiVersion}`);
  }
  if (!mod[kind]) throw new Error(`${apiVersion} has no kind ${kind}`);
  return mod[kind];
}

async function validate(obj) {
  if (!obj || typeof obj !== "object") throw new Error("not an object");
  const Cls = await classOf(obj.apiVersion, obj.kind);
  new Cls(obj).validate(); // throws with the schema's complaint
}

async function checkDir(dir) {
  const failures = [];
  let objects = 0;
  for (const file of readdirSync(dir).filter((f) => /\.ya?ml$/.test(f)).sort()) {
    const docs = parseAllDocuments(readFileSync(join(dir, file), "utf8"));
    for (const doc of docs) {
      if (doc.errors.length) {
        failures.push(`${file}: YAML: ${doc.errors[0].message}`);
        continue;
      }
      const obj = doc.toJS();
      if (obj == null) continue;
      const name = `${file}: ${obj.kind}/${obj.metadata?.name ?? "?"}`;
      if (obj.kind === "Kustomization") {
        // kustomize's own config, not an API object: its resources must exist.
        for (const r of obj.resources ?? []) {
          if (!existsSync(join(dir, r))) failures.push(`${name}: resource ${r} does not exist`);
        }
        continue;
      }
      try {
        await validate(obj);
        objects += 1;
      } catch (e) {
        failures.push(`${name}: ${e.message}`);
      }
    }
  }
  return { failures, objects };
}

async function selfTest() {
  // A Deployment whose container lacks its required name and whose replicas is a string must be refused.
  const broken = {
    apiVersion: "apps/v1",
    kind: "Deployment",
    metadata: { name: "x" },
    spec: {
      replicas: "two",
      selector: { matchLabels: { a: "b" } },
      template: { metadata: { labels: { a: "b" } }, spec: { containers: [{ image: "x" }] } },
    },
  };
  try {
    await validate(broken);
  } catch {
    return;
  }
  throw new Error("self-test: a broken Deployment passed validation");
}

const args = process.argv.slice(2);
const dir = args.find((a) => !a.startsWith("--")) ?? "deploy/k8s";
if (args.includes("--self-test")) await selfTest();
const { failures, objects } = await checkDir(dir);
if (failures.length) {
  for (const f of failures) console.error(`k8s: ${f}`);
  process.exit(1);
}
console.log(`k8s: ${objects} objects in ${dir} valid against the Kubernetes API schemas (kubernetes-models 5.1.0)`);
