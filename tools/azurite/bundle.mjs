#!/usr/bin/env node
// Bundles the pinned Azurite's three programs (`azurite`, `azurite-blob`,
// `azurite-queue`) into one file each, in tools/azurite/bundle/, for the
// test suites: scripts/test.sh runs this after `npm ci` and points
// AZURITE_BIN at bundle/azurite.
//
// Why: the suites start Azurite about 190 times in a full run, and each
// start cost 2.3 CPU-seconds, most of it Node resolving and reading some
// thousand modules one by one (a CPU profile of one start: the CommonJS
// loader, stat and package.json reads). One file starts in 1.1 CPU-seconds:
// about 220 CPU-seconds fewer on CI's 2 cores (docs/testing.md, "CI time").
// The code is the pinned package's, unchanged; esbuild only joins it (the
// VS Code extension Azurite ships is bundled the same way). Requires it
// resolves only at run time (sequelize's optional SQL drivers, for a
// database Azurite is not given here) are left to Node, which finds them
// from here in tools/azurite/node_modules.
//
// usage: node tools/azurite/bundle.mjs

import { build } from "esbuild";
import { chmodSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const dist = join(here, "node_modules/azurite/dist/src");
const out = join(here, "bundle");

// The package's "bin" entries the harness runs (crates/local/src/azurite).
const programs = {
  azurite: "azurite.js",
  "azurite-blob": "blob/main.js",
  "azurite-queue": "queue/main.js",
};

mkdirSync(out, { recursive: true });
for (const [name, entry] of Object.entries(programs)) {
  const outfile = join(out, name);
  await build({
    entryPoints: [join(dist, entry)],
    outfile,
    bundle: true,
    platform: "node",
    target: "node22",
    // Postgres's hstore for sequelize: not installed, never loaded.
    external: ["pg-hstore"],
    logLevel: "error",
  });
  chmodSync(outfile, 0o755);
}
console.log(`bundled ${Object.keys(programs).join(", ")} into ${out}`);
