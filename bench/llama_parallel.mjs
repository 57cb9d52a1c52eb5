// llama.cpp's batched decode of several sequences at once, the peer of `bmoe-cli --parallel B`:
// one node-llama-cpp context with B sequences, each fed its own prompt and decoded greedily
// side by side, so that node-llama-cpp packs every sequence's next token into one llama_decode
// (its default batching: items queued in the same event-loop cycle go in one batch).
//
//   node bench/llama_parallel.mjs MODEL PROMPTS.json B N T [CTX]
//     -> {sequences, tokens, seconds, tok_s, token_ms_p50, token_ms_p95, first_token_s, per_sequence}
//
// PROMPTS.json: an array of B texts (tokenized with special tokens, BOS where the model asks for
// one, as the oracle does). N tokens per sequence, T threads, CTX tokens of context per sequence.
// The aggregate rate counts, as bmoe-cli --parallel does, the decode steps only: the tokens every
// sequence generates after the last sequence's first token (that one comes from its prompt pass)
// over the time from then to the last token. token_ms: the gaps between one sequence's tokens in
// that window (one batched step each).
import fs from "node:fs";
import {getLlama} from "node-llama-cpp";

const [modelPath, promptsPath, bStr, nStr, threadsStr, ctxStr] = process.argv.slice(2);
if (!modelPath || !promptsPath) {
  console.error("usage: llama_parallel.mjs MODEL PROMPTS.json B N T [CTX]");
  process.exit(2);
}
const batch = parseInt(bStr ?? "1", 10);
const n = parseInt(nStr ?? "32", 10);
const threads = parseInt(threadsStr ?? "2", 10);
const contextSize = parseInt(ctxStr ?? "512", 10);
const prompts = JSON.parse(fs.readFileSync(promptsPath, "utf8"));
if (!Array.isArray(prompts) || prompts.length < batch) {
  console.error(`llama_parallel: ${promptsPath} needs at least ${batch} prompts`);
  process.exit(2);
}

const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath, useMmap: true});
const ctx = await model.createContext({contextSize, sequences: batch, threads, flashAttention: "auto"});

function tokenize(text) {
  const ids = Array.from(model.tokenize(text, true));
  const bos = model.tokens.bos;
  if (model.tokens.shouldPrependBosToken && bos != null && ids[0] !== bos) ids.unshift(bos);
  return ids;
}

// One sequence's greedy decode: every token's arrival time (ns).
async function decode(seq, ids) {
  const tokens = [], stamps = [];
  for await (const token of seq.evaluate(ids, {temperature: 0})) {
    stamps.push(process.hrtime.bigint());
    tokens.push(token);
    if (tokens.length >= n) break;
  }
  return {prompt: ids.length, tokens, stamps};
}

function percentile(values, p) {
  if (values.length === 0) return 0;
  const v = [...values].sort((a, b) => a - b);
  return v[Math.min(v.length - 1, Math.round(p * (v.length - 1)))];
}

const sequences = Array.from({length: batch}, () => ctx.getSequence());
const inputs = prompts.slice(0, batch).map(tokenize);
console.error(`llama.cpp: model loaded, ${batch} sequences decoding ${n} tokens each`);
const t0 = process.hrtime.bigint();
const runs = await Promise.all(sequences.map((seq, i) => decode(seq, inputs[i])));
const start = runs.reduce((m, r) => (r.stamps[0] > m ? r.stamps[0] : m), 0n);  // every prompt read
const end = runs.reduce((m, r) => (r.stamps.at(-1) > m ? r.stamps.at(-1) : m), 0n);
let tokens = 0;
const gaps = [];
for (const r of runs) {
  for (let i = 1; i < r.stamps.length; ++i) {
    if (r.stamps[i] <= start) continue;
    ++tokens;
    gaps.push(Number(r.stamps[i] - r.stamps[i - 1]) / 1e6);
  }
}
const seconds = Number(end - start) / 1e9;
console.log(JSON.stringify({
  sequences: batch, tokens, seconds, tok_s: tokens / seconds,
  token_ms_p50: percentile(gaps, 0.5), token_ms_p95: percentile(gaps, 0.95),
  first_token_s: Number(start - t0) / 1e9,
  per_sequence: runs.map((r) => ({prompt: r.prompt, tokens: r.tokens}))}));
process.exit(0);
