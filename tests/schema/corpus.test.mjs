// The JSON Schema corpus (corpus.json: schemas as schema libraries write them) checked by an
// independent validator: test_grammar's JsonSchema.CorpusConvertsAndWalksToJson walks each
// schema's grammar 50 times with fixed seeds and writes the texts; every one must be valid under
// ajv (JSON Schema 2020-12) with ajv-formats' full format checks.
// Run: BMOE_BUILD=build node --test tests/schema/corpus.test.mjs (CTest: schema.corpus).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const build = process.env.BMOE_BUILD ?? path.join(repo, "build");

function walks() {
  const dir = mkdtempSync(path.join(os.tmpdir(), "bmoe-schema-"));
  const file = path.join(dir, "samples.jsonl");
  try {
    execFileSync(path.join(build, "tests", "test_grammar"), ["--gtest_filter=JsonSchema.CorpusConvertsAndWalksToJson"], {
      env: { ...process.env, BMOE_SCHEMA_SAMPLES: file },
      stdio: "pipe",
    });
    return readFileSync(file, "utf8").trim().split("\n").map((line) => JSON.parse(line));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const entries = walks();
const corpus = JSON.parse(readFileSync(path.join(repo, "tests", "schema", "corpus.json"), "utf8"));

test("every corpus schema was walked 50 times", () => {
  assert.equal(entries.length, corpus.length);
  for (const e of entries) assert.equal(e.samples.length, 50, e.name);
});

for (const entry of entries) {
  test(`valid under ajv: ${entry.name}`, () => {
    const ajv = new Ajv2020({ strict: false, allErrors: true });
    addFormats(ajv);
    const validate = ajv.compile(entry.schema);
    for (const text of entry.samples) {
      const value = JSON.parse(text);
      assert.ok(validate(value), `${text}\n${JSON.stringify(validate.errors)}`);
    }
  });
}
