// Unknown-property check for KEDA objects. KEDA's generated JSON schemas do
// not forbid extra properties, so `minReplicas` (for minReplicaCount) or
// `identityID` would pass validation and be silently ignored by the cluster.
// The package's TypeScript declarations list every property of every type:
// this walks an object along them and reports each key no type declares.

import { readFileSync, existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const root = dirname(require.resolve("@kubernetes-models/keda/package.json"));
const nodeModules = dirname(dirname(root));

/** The .d.ts file a module specifier of `from` points at, if installed. */
function resolve(spec, from) {
  const base = spec.startsWith(".") ? join(dirname(from), spec) : join(nodeModules, spec);
  const file = base.replace(/\.js$/, "") + ".d.ts";
  return existsSync(file) ? file : null;
}

const cache = new Map();

/** The main interface of a .d.ts file: its properties and their type texts, plus its imports. */
function declarations(file) {
  if (cache.has(file)) return cache.get(file);
  const text = readFileSync(file, "utf8");
  const imports = new Map();
  for (const m of text.matchAll(/import \{ ([^}]+) \} from "([^"]+)"/g)) {
    for (const name of m[1].split(",").map((s) => s.trim())) imports.set(name, m[2]);
  }
  const properties = new Map();
  const body = text.match(/export interface \w+(?: extends [\w, ]+)? \{\n([\s\S]*?)\n\}/);
  if (body) {
    for (const m of body[1].matchAll(/^ {4}"([^"]+)"\??: (.+?);?$/gm)) properties.set(m[1], m[2]);
  }
  const found = { file, imports, properties, declared: Boolean(body) };
  cache.set(file, found);
  return found;
}

/** The declarations a type text names, or null when it is a leaf or opaque. */
function typeOf(typeText, owner) {
  const array = typeText.match(/^Array<(\w+)>$/);
  const name = array ? array[1] : typeText;
  const spec = owner.imports.get(name);
  if (!spec) return null;
  const file = resolve(spec, owner.file);
  if (!file) return null;
  const found = declarations(file);
  return found.declared ? { decl: found, array: Boolean(array) } : null;
}

function walk(value, decl, path, findings) {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return;
  for (const [key, child] of Object.entries(value)) {
    const typeText = decl.properties.get(key);
    if (typeText === undefined) {
      const known = [...decl.properties.keys()].join(", ");
      findings.push(`${path}/${key}: not a property here (known: ${known})`);
      continue;
    }
    const nested = typeOf(typeText, decl);
    if (!nested) continue;
    if (nested.array && Array.isArray(child)) {
      child.forEach((item, i) => walk(item, nested.decl, `${path}/${key}/${i}`, findings));
    } else if (!nested.array) {
      walk(child, nested.decl, `${path}/${key}`, findings);
    }
  }
}

/** Every key of `object` (a KEDA kind of keda.sh/v1alpha1) that its types do not declare. */
export function unknownProperties(object) {
  const file = join(root, "keda.sh", "v1alpha1", `${object.kind}.d.ts`);
  if (!existsSync(file)) return [];
  const findings = [];
  walk(object, declarations(file), "", findings);
  return findings;
}
