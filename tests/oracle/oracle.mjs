// llama.cpp (through node-llama-cpp) as the reference for bmoe's conformance tests and the peer
// in benchmarks. One process answers a whole job so the model loads once.
//
//   node tests/oracle/oracle.mjs tokenize MODEL TEXTS.json       -> [[ids], ...]
//   node tests/oracle/oracle.mjs tokenize-models _ JOBS.json     -> [[[ids], ...] per job]: JOBS a list of
//                                                                   {"model": path, "texts": [...]}
//   node tests/oracle/oracle.mjs greedy   MODEL PROMPTS.json N T  -> [{prompt, tokens, top2}, ...]
//                                                                   (top2 empty with ORACLE_TOP2=0)
//   node tests/oracle/oracle.mjs bench    MODEL PROMPT N T        -> {tokens, seconds, tok_s, ...}
//   node tests/oracle/oracle.mjs probs    MODEL PROMPT            -> {prompt, probs} (diagnostics)
//   node tests/oracle/oracle.mjs prefill  MODEL IDS.json _ T      -> {tokens, seconds} (prompt of token ids
//                                                                   to its first generated token)
//   node tests/oracle/oracle.mjs nll      MODEL IDS.json CTX T    -> {count, nll, nll2, running_ppl}: llama-perplexity's
//                                                                   sums over chunks of CTX of the given ids (each chunk
//                                                                   from an empty context, its first token BOS where the
//                                                                   model adds one, its second half scored)
//   node tests/oracle/oracle.mjs kld      MODEL BASE.logits _ T   -> {count, kld, same_top}: llama.cpp's distributions
//                                                                   against a base-logits file (llama-perplexity's format,
//                                                                   as bmoe-perplexity --kl-divergence-base writes it)
//                                                                   (nll, kld: ORACLE_ROWS=N scores N rows per evaluation,
//                                                                   for a large vocabulary; see scoredRows)
//   node tests/oracle/oracle.mjs decode   MODEL IDS.json N T      -> {tokens, seconds, tok_s, depth} (N tokens
//                                                                   generated after a prompt of token ids)
//   node tests/oracle/oracle.mjs jobs     MODEL JOBS.json _ T     -> [answer, ...], one per job, one model load:
//     {"op": "tokenize", "texts": [...]}                             -> [[ids], ...]
//     {"op": "greedy", "texts": [...], "n": 32, "kv": "f16"|"f32", "flash": true|false,
//      "batch": 1 (token by token; default: whole prompt), "top2": true|false,
//      "ctx": context size (default 2048)}
//                                                                   -> [{prompt, tokens, top2}, ...]
//     {"op": "compare", "texts": [...], "n": 32, "kv", "flash", "ctx" as for greedy,
//      "candidates": [[ids, ...] per text]}                         -> {ref: [{prompt, tokens, top2}, ...],
//                                                                       alt: [{prompt, tokens}, ...]}
//       ref: the default (whole-prompt) run; alt: the same prompts token by token; ref's top2 is
//       null except at each step where alt or a candidate first leaves ref's tokens.
//   (the greedy job's settings replace the ORACLE_* variables, which apply to the other modes)
//
// Texts are tokenized with special tokens parsed, and a BOS first where the model asks for one
// (tokenizer.ggml.add_bos_token; llama.cpp forces it for Gemma 4), as llama-cli does.
// top2[i] = [best id, p, second id, p] at step i, to recognise true near-ties.
import fs from "node:fs";
import {getLlama} from "node-llama-cpp";

const [mode, modelPath, arg, nStr, threadsStr] = process.argv.slice(2);
if (!mode || !modelPath) {
  console.error("usage: oracle.mjs tokenize|tokenize-models|greedy|bench|probs|prefill|nll|kld|decode|jobs MODEL ...");
  process.exit(2);
}
// Synchronous, complete write: process.exit() right after console.log can cut a piped stdout
// at 64 KiB, and a non-blocking pipe may take only part of a write.
function emit(text) {
  const buffer = Buffer.from(text + "\n");
  for (let off = 0; off < buffer.length;) {
    try {
      off += fs.writeSync(1, buffer, off);
    } catch (e) {
      if (e.code !== "EAGAIN") throw e;
    }
  }
}

const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
// A text's ids in one model's vocabulary.
function tokenizeWith(vocab, text) {
  const ids = Array.from(vocab.tokenize(text, true));
  const bos = vocab.tokens.bos;
  if (vocab.tokens.shouldPrependBosToken && bos != null && ids[0] !== bos) ids.unshift(bos);
  return ids;
}

// Several models' vocabularies in one process (starting node and llama.cpp's backend is most of
// a tokenize run): ARG is a JSON list of {"model": path, "texts": [...]}; MODEL is ignored.
if (mode === "tokenize-models") {
  const answers = [];
  for (const job of JSON.parse(fs.readFileSync(arg, "utf8"))) {
    const vocab = await llama.loadModel({modelPath: job.model, useMmap: true, vocabOnly: true});
    answers.push(job.texts.map((t) => tokenizeWith(vocab, t)));
    await vocab.dispose();
  }
  emit(JSON.stringify(answers));
  process.exit(0);
}

// Tokenizing needs only the vocabulary: loading the weights too cost 7 s on a 1.7 GB cut.
const model = await llama.loadModel({modelPath, useMmap: true, vocabOnly: mode === "tokenize"});
const n = parseInt(nStr ?? "32", 10);
const tokenize = (text) => tokenizeWith(model, text);
// ORACLE_KV=f32 runs llama.cpp with an f32 KV cache (bmoe: --kv-type f32).
const kv = (process.env.ORACLE_KV ?? "f16").toUpperCase();
const flash = process.env.ORACLE_FA === "0" ? false : "auto";  // llama.cpp's default: flash attention on the CPU
// ORACLE_BATCH=N evaluates the prompt N tokens at a time (1: token by token, like decode).
const batchSize = process.env.ORACLE_BATCH ? parseInt(process.env.ORACLE_BATCH, 10) : undefined;
const contextOptions = (contextSize, numerics = {kv, flash, batchSize}) => ({
  contextSize, threads, flashAttention: numerics.flash, batchSize: numerics.batchSize,
  experimentalKvCacheKeyType: numerics.kv, experimentalKvCacheValueType: numerics.kv});
const threads = parseInt(threadsStr ?? "2", 10);

if (mode === "tokenize") {
  const texts = JSON.parse(fs.readFileSync(arg, "utf8"));
  emit(JSON.stringify(texts.map((t) => tokenize(t))));
  process.exit(0);
}

// [best id, p, second id, p] of a node-llama-cpp probabilities map.
function bestTwo(probabilities) {
  let best = [-1, -1], second = [-1, -1];
  for (const [id, p] of probabilities) {
    if (p > best[1]) { second = best; best = [id, p]; }
    else if (p > second[1]) second = [id, p];
  }
  return [best[0], best[1], second[0], second[1]];
}

// progress: one stderr line per generated token (bench), so that a run stopped by a timeout
// still tells how far it got.
async function greedy(ctx, text, withTop2, count = n, progress = false) {
  const seq = ctx.getSequence();
  const prompt = tokenize(text);
  const tokens = [];
  const top2 = [];
  const stamps = [];  // ns timestamp of each generated token
  const t0 = process.hrtime.bigint();
  let tFirst = null;
  const steps = withTop2
    ? seq.evaluateWithMetadata(prompt, {probabilities: true}, {temperature: 0})
    : seq.evaluate(prompt, {temperature: 0});
  for await (const step of steps) {
    const now = process.hrtime.bigint();
    stamps.push(now);
    if (tFirst === null) tFirst = now;
    if (withTop2) {
      tokens.push(step.token);
      top2.push(bestTwo(step.probabilities));
    } else {
      tokens.push(step);
    }
    if (progress) console.error(`llama.cpp: token ${tokens.length} at ${(Number(now - t0) / 1e9).toFixed(3)} s`);
    if (tokens.length >= count) break;
  }
  const t1 = process.hrtime.bigint();
  seq.dispose();
  const token_ms = [];
  for (let i = 1; i < stamps.length; ++i) token_ms.push(Number(stamps[i] - stamps[i - 1]) / 1e6);
  return {prompt: Array.from(prompt), tokens, top2, first_token_s: Number(tFirst - t0) / 1e9,
          decode_s: Number(t1 - tFirst) / 1e9, token_ms};
}

// A fresh context per prompt: nothing carries over between prompts, and every context has its
// own KV type, attention path and batch size on the one loaded model. withTop2 false leaves out
// the top-2 probabilities (tokens only): node-llama-cpp sorts and hands over the whole
// vocabulary's distribution at every step for them, 115 ms a step on a 151k vocabulary against
// 25 ms for the step itself.
async function greedyAll(prompts, withTop2, count = n, numerics = undefined, contextSize = 2048) {
  const results = [];
  for (const p of prompts) {
    const ctx = await model.createContext(contextOptions(contextSize, numerics));
    results.push(await greedy(ctx, p, withTop2, count));
    await ctx.dispose();
  }
  return results;
}

// The first step where two token lists differ (the shorter one's length where one is a prefix
// of the other), or null where they are equal.
function departure(a, b) {
  const common = Math.min(a.length, b.length);
  for (let i = 0; i < common; ++i) if (a[i] !== b[i]) return i;
  return a.length === b.length ? null : common;
}

// greedy() again for the first `count` tokens of `text`, with the top-2 probabilities only at
// the steps in `wanted` (a Set): the prompt in the context's batches and then one decode per
// step, as evaluate() runs them, so the numerics are the same.
async function greedyTop2At(ctx, text, wanted, count) {
  const seq = ctx.getSequence();
  const prompt = tokenize(text);
  const ask = (step) => ({generateNext: {token: true, probabilities: wanted.has(step)}});
  let input = prompt.map((t, i) => (i + 1 < prompt.length ? t : [t, ask(0)]));
  const tokens = [], top2 = new Map();
  for (let step = 0; step < count; ++step) {
    const results = await seq.controlledEvaluate(input);
    const next = results[results.length - 1].next;
    tokens.push(next.token);
    if (wanted.has(step)) top2.set(step, bestTwo(next.probabilities));
    input = [[next.token, ask(step + 1)]];
  }
  seq.dispose();
  return {tokens, top2};
}

// The token-by-token run's context: the smallest multiple of 256 that holds every text and its
// answer (at most the reference's). With one-token batches and flash attention, llama.cpp's decode
// steps cost with the context's size, not the tokens in it (measured on the 1-layer Qwen3-30B cut,
// a 120-token prompt: 16 steps took 15 s at 2048 and 1.4 s at 512). This run is the baseline of
// llama.cpp's own spread (its one-token path against its batched one), not what bmoe is held to.
function altContextSize(ref, count, contextSize) {
  const longest = Math.max(...ref.map((r) => r.prompt.length)) + count + 1;
  return Math.min(contextSize, Math.ceil(longest / 256) * 256);
}

// The compare job. The top-2 probabilities are what cost (above): asking them at every step of
// every prompt made them 80 % of a real-shape conformance test. They are only read where another
// run leaves the reference path, so the reference runs without them, and a prompt with such a
// step runs again up to its last such step, asking them there only. The rerun must give the
// same tokens (one loaded model, same settings, same threads): a difference is an error, not a
// silent gap.
async function compare(job, numerics, count, contextSize) {
  const ref = await greedyAll(job.texts, false, count, numerics, contextSize);
  const alt = await greedyAll(job.texts, false, count, {...numerics, batchSize: 1}, altContextSize(ref, count, contextSize));
  const candidates = job.candidates ?? job.texts.map(() => []);
  for (let t = 0; t < job.texts.length; ++t) {
    const steps = [alt[t].tokens, ...candidates[t]].map((c) => departure(c, ref[t].tokens))
      .filter((d) => d !== null && d < ref[t].tokens.length);
    ref[t].top2 = ref[t].tokens.map(() => null);
    if (steps.length === 0) continue;
    const last = Math.max(...steps);
    const ctx = await model.createContext(contextOptions(contextSize, numerics));
    const again = await greedyTop2At(ctx, job.texts[t], new Set(steps), last + 1);
    await ctx.dispose();
    if (departure(again.tokens, ref[t].tokens.slice(0, last + 1)) !== null)
      throw new Error(`the rerun with probabilities left the first run's tokens on text ${t}`);
    for (const d of steps) ref[t].top2[d] = again.top2.get(d);
  }
  return {ref, alt: alt.map(({prompt, tokens}) => ({prompt, tokens}))};
}

if (mode === "greedy") {
  emit(JSON.stringify(await greedyAll(JSON.parse(fs.readFileSync(arg, "utf8")), process.env.ORACLE_TOP2 !== "0")));
  process.exit(0);
}

// One job of the jobs mode; a malformed job is an error line, not a crash.
async function runJob(job) {
  if (!job || !Array.isArray(job.texts)) throw new Error(`job without a texts list: ${JSON.stringify(job)}`);
  if (job.op === "tokenize") return job.texts.map((t) => tokenize(t));
  if (job.op !== "greedy" && job.op !== "compare") throw new Error(`unknown job op ${JSON.stringify(job.op)}`);
  const numerics = {kv: (job.kv ?? "f16").toUpperCase(), flash: job.flash === false ? false : "auto",
                    batchSize: job.batch ?? undefined};
  if (job.op === "compare") {
    if (job.candidates && (!Array.isArray(job.candidates) || job.candidates.length !== job.texts.length))
      throw new Error("compare job: candidates must hold one list per text");
    return compare(job, numerics, job.n ?? 32, job.ctx ?? 2048);
  }
  return greedyAll(job.texts, job.top2 !== false, job.n ?? 32, numerics, job.ctx ?? 2048);
}

if (mode === "jobs") {
  const jobs = JSON.parse(fs.readFileSync(arg, "utf8"));
  const answers = [];
  try {
    for (const job of jobs) answers.push(await runJob(job));
  } catch (e) {
    console.error(`oracle: ${e.message}`);
    process.exit(2);
  }
  emit(JSON.stringify(answers));
  process.exit(0);
}

// A chunk's scored rows (first .. its length - 2) in order: onRow(j, the distribution of the token
// after chunk[j]). By default the whole chunk is one evaluation, as llama-perplexity's batch.
// ORACLE_ROWS=N evaluates the unscored half, then the scored rows N at a time on the same
// sequence: node-llama-cpp hands each row over as a Map of the whole vocabulary, and 255 rows of
// a 151,936-token vocabulary overran node's 4 GB heap (the Qwen3-30B-A3B cut, chunks of 512).
const rowsPerEval = Number(process.env.ORACLE_ROWS || 0);
async function scoredRows(seq, chunk, first, onRow) {
  const end = chunk.length - 1;
  const want = (t) => [t, {generateNext: {probabilities: true}}];
  if (!(rowsPerEval > 0)) {
    const out = await seq.controlledEvaluate(chunk.map((t, j) => (j >= first && j < end ? want(t) : t)));
    for (let j = first; j < end; ++j) onRow(j, out[j].next.probabilities);
    return;
  }
  await seq.controlledEvaluate(chunk.slice(0, first));
  for (let start = first; start < end; start += rowsPerEval) {
    const stop = Math.min(start + rowsPerEval, end);
    const out = await seq.controlledEvaluate(chunk.slice(start, stop).map(want));
    for (let j = start; j < stop; ++j) onRow(j, out[j - start].next.probabilities);
  }
}

// llama-perplexity's sums, from llama.cpp's probabilities of each next token (bmoe-perplexity's
// method, engine/perplexity.h): the peer evaluates exactly the ids it is given.
async function perplexitySums(ids, nCtx) {
  const ctx = await model.createContext(contextOptions(nCtx, {kv, flash, batchSize: nCtx}));
  const seq = ctx.getSequence();
  const first = Math.floor(nCtx / 2);
  const bos = model.tokens.bos;
  const addBos = model.tokens.shouldPrependBosToken && bos != null;
  let count = 0, nll = 0, nll2 = 0;
  const runningPpl = [];
  for (let start = 0; start + nCtx <= ids.length; start += nCtx) {
    const chunk = ids.slice(start, start + nCtx);
    if (addBos) chunk[0] = bos;
    await seq.clearHistory();
    await scoredRows(seq, chunk, first, (j, probabilities) => {
      const x = -Math.log(probabilities.get(chunk[j + 1]));
      nll += x;
      nll2 += x * x;
      ++count;
    });
    runningPpl.push(Math.exp(nll / count));
  }
  seq.dispose();
  await ctx.dispose();
  return {count, nll, nll2, running_ppl: runningPpl};
}

if (mode === "nll") {
  emit(JSON.stringify(await perplexitySums(JSON.parse(fs.readFileSync(arg, "utf8")), n)));
  process.exit(0);
}

// A base-logits file: header, tokens, then per scored row a float scale, a float floor (the
// first 4 u16) and one u16 per token; log p = scale * q + floor.
function readBaseLogits(path) {
  const buf = fs.readFileSync(path);
  if (buf.toString("latin1", 0, 8) !== "_logits_") throw new Error(`${path}: not a base-logits file`);
  const nCtx = buf.readUInt32LE(8), nVocab = buf.readInt32LE(12), nChunk = buf.readInt32LE(16);
  const tokens = [];
  for (let i = 0; i < nCtx * nChunk; ++i) tokens.push(buf.readInt32LE(20 + 4 * i));
  const rowBytes = 2 * (2 * Math.floor((nVocab + 1) / 2) + 4);
  const rowsAt = 20 + 4 * nCtx * nChunk;
  const row = (r) => {
    const at = rowsAt + r * rowBytes;
    const scale = buf.readFloatLE(at), floor = buf.readFloatLE(at + 4);
    return (i) => scale * buf.readUInt16LE(at + 8 + 2 * i) + floor;
  };
  return {nCtx, nVocab, nChunk, tokens, row};
}

// llama-perplexity's KLD sum for each scored row: sum over tokens with log p_base > -16 of
// p_base * (log p_base - log q), q being llama.cpp's probability.
async function kldAgainstBase(path) {
  const base = readBaseLogits(path);
  const ctx = await model.createContext(contextOptions(base.nCtx, {kv, flash, batchSize: base.nCtx}));
  const seq = ctx.getSequence();
  const first = Math.floor(base.nCtx / 2);
  const bos = model.tokens.bos;
  const addBos = model.tokens.shouldPrependBosToken && bos != null;
  let count = 0, kld = 0, sameTop = 0, r = 0;
  for (let c = 0; c < base.nChunk; ++c) {
    const chunk = base.tokens.slice(c * base.nCtx, (c + 1) * base.nCtx);
    if (addBos) chunk[0] = bos;
    await seq.clearHistory();
    await scoredRows(seq, chunk, first, (j, q) => {
      const logBase = base.row(r++);
      let sum = 0, topBase = 0, topQ = -1, bestQ = -1;
      for (let i = 0; i < base.nVocab; ++i) {
        const lb = logBase(i);
        if (lb > logBase(topBase)) topBase = i;
        const qi = q.get(i) ?? 0;
        if (qi > bestQ) { bestQ = qi; topQ = i; }
        if (lb > -16) sum += Math.exp(lb) * (lb - Math.log(Math.max(qi, 1e-45)));
      }
      kld += sum;
      sameTop += topBase === topQ;
      ++count;
    });
  }
  seq.dispose();
  await ctx.dispose();
  return {count, kld: kld / count, same_top: sameTop / count};
}

if (mode === "kld") {
  emit(JSON.stringify(await kldAgainstBase(arg)));
  process.exit(0);
}

if (mode === "probs") {
  // Full next-token distribution after the prompt (diagnostics).
  const ctx = await model.createContext(contextOptions(2048));
  const seq = ctx.getSequence();
  const prompt = tokenize(arg);
  for await (const step of seq.evaluateWithMetadata(prompt, {probabilities: true}, {temperature: 0})) {
    emit(JSON.stringify({prompt: Array.from(prompt), probs: Array.from(step.probabilities.entries())}));
    break;
  }
  process.exit(0);
}

if (mode === "bench") {
  const ctx = await model.createContext(contextOptions(4096));
  console.error(`llama.cpp: model loaded, decoding ${n} tokens`);
  const r = await greedy(ctx, arg ?? "", false, n, true);
  // Decode rate from the first generated token to the last (prefill excluded).
  emit(JSON.stringify({tokens: r.tokens.length - 1, seconds: r.decode_s,
                        tok_s: (r.tokens.length - 1) / r.decode_s, first_token_s: r.first_token_s,
                        token_ms: r.token_ms}));
  process.exit(0);
}
if (mode === "prefill") {
  // Prompt processing: the time from feeding the ids to the first generated token.
  const ids = JSON.parse(fs.readFileSync(arg, "utf8"));
  const ctx = await model.createContext(contextOptions(Math.max(4096, ids.length + 64)));
  const seq = ctx.getSequence();
  const t0 = process.hrtime.bigint();
  for await (const _ of seq.evaluate(ids, {temperature: 0})) break;
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  emit(JSON.stringify({tokens: ids.length, seconds, tok_s: ids.length / seconds}));
  process.exit(0);
}
if (mode === "decode") {
  // Decode at depth: the rate from the first generated token to the last, after the ids.
  const ids = JSON.parse(fs.readFileSync(arg, "utf8"));
  const ctx = await model.createContext(contextOptions(Math.max(4096, ids.length + n + 64)));
  const seq = ctx.getSequence();
  let count = 0, tFirst = null;
  for await (const _ of seq.evaluate(ids, {temperature: 0})) {
    if (tFirst === null) tFirst = process.hrtime.bigint();
    if (++count > n) break;
  }
  const seconds = Number(process.hrtime.bigint() - tFirst) / 1e9;
  emit(JSON.stringify({tokens: count - 1, seconds, tok_s: (count - 1) / seconds, depth: ids.length}));
  process.exit(0);
}
console.error(`unknown mode ${mode}`);
process.exit(2);
