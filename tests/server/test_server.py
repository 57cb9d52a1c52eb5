"""bmoe-server integration tests: a real server on a loopback port, driven over HTTP.

Greedy answers (streamed and not) must equal bmoe-cli's; bad requests get 4xx with an
OpenAI-style error body; a full queue answers 503; a client that disconnects cancels its
generation; a bounded load test loses no request and leaves the server alive with flat memory.
"""
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "conformance"))
from common import THREADS, run, synth, tool  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "templates"))
from templates import load_templates  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model, *flags):
        self.port = free_port()
        self.log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a full pipe would block the server
        self.proc = subprocess.Popen([tool("bmoe-server"), "-m", model, "--port", str(self.port), "-t", THREADS, *flags],
                                     stdout=subprocess.DEVNULL, stderr=self.log, text=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"bmoe-server exited: {self.log.read()}")
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("bmoe-server did not start")

    def request(self, method, path, body=None, headers=None, raw=None, timeout=120):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        text = resp.read().decode()
        conn.close()
        return resp.status, text

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        status, text = self.request("POST", path, body, **kw)
        return status, json.loads(text) if text.strip() else None

    def stream(self, path, body):
        """Returns the list of SSE data payloads (parsed JSON, '[DONE]' kept as a string)."""
        status, text = self.request("POST", path, {**body, "stream": True})
        assert status == 200, text
        events = []
        for block in text.split("\n\n"):
            for line in block.splitlines():
                if line.startswith("data: "):
                    payload = line[len("data: "):]
                    events.append(payload if payload == "[DONE]" else json.loads(payload))
        return events

    def metric(self, name):
        _, text = self.get("/metrics")
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == name:
                return float(parts[1])
        raise KeyError(name)

    def metric_labelled(self, name, label):
        _, text = self.get("/metrics")
        for line in text.splitlines():
            if line.startswith(f"{name}{{{label}}}"):
                return float(line.split()[-1])
        raise KeyError(name + label)

    def metrics(self):
        """One /metrics scrape: {'name' or 'name{labels}': value}."""
        status, text = self.get("/metrics")
        assert status == 200, text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def waiting_on_server(sock):
    """True while the server has neither answered on nor closed this connection."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)  # bytes, or b"" once closed
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def wait_until(condition, seconds):
    """Polls until condition() holds or `seconds` pass (generous: a loaded machine is slow, and a
    condition that holds returns at once); the caller asserts what it waited for."""
    deadline = time.time() + seconds
    while not condition() and time.time() < deadline:
        time.sleep(0.1)


def open_endless_stream(server, path, fields):
    """Starts a greedy streamed request that ignores EOS on a raw socket and returns the socket
    once the stream has begun, so a test can cut the client off mid-answer (close it)."""
    conn = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({**fields, "temperature": 0, "stream": True, "ignore_eos": True}).encode()
    conn.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    conn.recv(256)
    return conn


def cli_text(model, prompt, n, *flags):
    out = run([tool("bmoe-cli"), "-m", model, "-p", prompt, "-n", str(n), "-t", THREADS, "--json", *flags])
    return json.loads(out)["text"]


class ServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = synth("tiny-qwen3moe", "tiny-qwen3moe")
        cls.server = Server(cls.model, "-c", "512")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        if cls.server.proc.returncode != 0:
            raise AssertionError(f"server exit code {cls.server.proc.returncode}")

    def server_vocab(self):
        # The vocabulary size: the first id /detokenize refuses.
        lo, hi = 1, 1 << 20
        while lo < hi:
            mid = (lo + hi) // 2
            if self.server.post("/detokenize", {"tokens": [mid]})[0] == 200:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def assert_error(self, status, body, want_status, want_type=None):
        self.assertEqual(status, want_status, body)
        self.assertIn("error", body)
        self.assertIsInstance(body["error"]["message"], str)
        if want_type:
            self.assertEqual(body["error"]["type"], want_type)

    def test_health_models_metrics(self):
        self.assertEqual(self.server.get("/health"), (200, '{"status":"ok"}'))
        status, text = self.server.get("/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(text)["data"][0]["id"], "tiny-qwen3moe.gguf")
        for name in ("bmoe_queue_depth", "bmoe_generated_tokens_total", "bmoe_expert_cache_hit_ratio",
                     "bmoe_flash_read_mib_total", "bmoe_decode_tokens_per_second"):
            self.assertGreaterEqual(self.server.metric(name), 0.0, name)

    def test_chat_equals_cli_greedy_streamed_or_not(self):
        prompt = "The capital of France is"
        want = cli_text(self.model, prompt, 24, "--chat")
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 24, "temperature": 0}
        status, resp = self.server.post("/v1/chat/completions", body)
        self.assertEqual(status, 200, resp)
        self.assertEqual(resp["object"], "chat.completion")
        self.assertEqual(resp["choices"][0]["message"]["content"], want)
        self.assertEqual(resp["usage"]["completion_tokens"] + resp["usage"]["prompt_tokens"], resp["usage"]["total_tokens"])
        # llama-server's timings: prompt and generation speed of this request.
        timings = resp["timings"]
        self.assertEqual(timings["prompt_n"] + timings["cache_n"], resp["usage"]["prompt_tokens"])
        self.assertEqual(timings["predicted_n"], resp["usage"]["completion_tokens"])
        self.assertGreater(timings["prompt_per_second"], 0)
        self.assertGreater(timings["predicted_per_second"], 0)
        events = self.server.stream("/v1/chat/completions", body)
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(events[0]["choices"][0]["delta"]["role"], "assistant")
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
        self.assertEqual(text, want)
        self.assertIn(events[-2]["choices"][0]["finish_reason"], ("stop", "length"))
        self.assertEqual(events[-2]["timings"]["predicted_n"], events[-2]["usage"]["completion_tokens"])

    def test_completion_equals_cli_greedy_and_reuses_prefix(self):
        prompt = "def fibonacci(n):"
        want = cli_text(self.model, prompt, 20)
        body = {"prompt": prompt, "max_tokens": 20, "temperature": 0}
        status, first = self.server.post("/v1/completions", body)
        self.assertEqual(status, 200, first)
        self.assertEqual(first["choices"][0]["text"], want)
        status, second = self.server.post("/v1/completions", body)  # same prompt: KV prefix kept
        self.assertEqual(second["choices"][0]["text"], want)
        self.assertGreater(second["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        events = self.server.stream("/v1/completions", body)
        self.assertEqual("".join(e["choices"][0]["text"] for e in events[:-1]), want)

    def test_ignore_eos_runs_to_max_tokens(self):
        # llama-server's ignore_eos: an answer that ends with the model's end token (found among
        # a few seeds at temperature 1) runs on to max_tokens with the field set.
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 300, "temperature": 1}
        ended = None
        for seed in range(1, 21):
            _, resp = self.server.post("/v1/chat/completions", {**body, "seed": seed})
            if resp["choices"][0]["finish_reason"] == "stop":
                ended = seed
                break
        self.assertIsNotNone(ended, "no seed in 1..20 ended by itself within 300 tokens")
        self.assertLess(resp["usage"]["completion_tokens"], 300)
        status, resp = self.server.post("/v1/chat/completions", {**body, "seed": ended, "ignore_eos": True})
        self.assertEqual(status, 200, resp)
        self.assertEqual(resp["usage"]["completion_tokens"], 300)
        self.assertEqual(resp["choices"][0]["finish_reason"], "length")

    def test_logit_bias_favours_and_bans_tokens(self):
        s = self.server
        body = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
        _, pieces = s.post("/tokenize", {"content": " world", "with_pieces": True})
        self.assertEqual(len(pieces["tokens"]), 1)
        world = pieces["tokens"][0]["id"]
        for bias in ({str(world): 100}, [[world, 100]], [[" world", 100]]):
            status, out = s.post("/v1/completions", {**body, "logit_bias": bias})
            self.assertEqual(status, 200, out)
            self.assertEqual(out["choices"][0]["text"], " world" * 4)
        _, plain = s.post("/v1/completions", {**body, "max_tokens": 1, "logprobs": 0})
        first = plain["choices"][0]["logprobs"]["tokens"][0]
        _, ids = s.post("/tokenize", {"content": first})
        self.assertEqual(len(ids["tokens"]), 1)
        for ban in (False, -100):
            _, banned = s.post("/v1/completions", {**body, "max_tokens": 1, "logprobs": 0,
                                                    "logit_bias": {str(ids["tokens"][0]): ban}})
            self.assertNotEqual(banned["choices"][0]["logprobs"]["tokens"][0], first)

    def test_stop_strings_end_the_text(self):
        body = {"prompt": "The capital of France is", "max_tokens": 40, "temperature": 0}
        _, full = self.server.post("/v1/completions", body)
        text = full["choices"][0]["text"]
        self.assertGreater(len(text), 4)
        stop = text[len(text) // 2: len(text) // 2 + 2]
        _, cut = self.server.post("/v1/completions", {**body, "stop": [stop]})
        self.assertEqual(cut["choices"][0]["text"], text[: text.index(stop)])
        self.assertEqual(cut["choices"][0]["finish_reason"], "stop")

    def test_bad_requests_get_4xx_with_openai_errors(self):
        s = self.server
        status, text = s.request("POST", "/v1/chat/completions", raw="{not json")
        self.assert_error(status, json.loads(text), 400, "invalid_request_error")
        status, body = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "bogus": 1})
        self.assert_error(status, body, 400)
        self.assertEqual(body["error"]["param"], "bogus")
        for bad in ({"messages": []}, {"messages": "hi"}, {"messages": [{"role": "wizard", "content": "x"}]},
                    {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
                    {"messages": [{"role": "user", "content": "x"}], "temperature": 7},
                    {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
                    {"messages": [{"role": "user", "content": "x"}], "n": 0},
                    {"messages": [{"role": "user", "content": "x"}], "n": 129},
                    {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},  # without logprobs
                    {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
                    {"messages": [{"role": "user", "content": "x"}], "presence_penalty": 2.5},
                    {"messages": [{"role": "user", "content": "x"}], "stop": 5},
                    {"messages": [{"role": "user", "content": "x"}], "ignore_eos": "yes"},
                    {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"1": 500}},
                    {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"999999999": 1}},
                    {"messages": [{"role": "user", "content": "x"}], "logit_bias": [[1]]},
                    {"messages": [{"role": "user", "content": "x"}], "logit_bias": 3},
                    {"messages": [{"role": "user", "content": [{"type": 1, "text": "x"}]}]},
                    {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": 5}]},
                    {"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": 5}},
                    {"messages": [{"role": "user", "content": "x"}], "metadata": {"deep": json.loads("[" * 200 + "]" * 200)}},
                    {"messages": [{"role": "user", "content": "x"}], "grammar": "root ::= " + " | ".join(['"a"'] * 1100)},
                    {"messages": [{"role": "user", "content": "x"}],
                     "logit_bias": [[i, False] for i in range(self.server_vocab())]}):
            status, body = s.post("/v1/chat/completions", bad)
            self.assert_error(status, body, 400)
        status, body = s.post("/v1/completions", {"prompt": "word " * 2000, "max_tokens": 4})
        self.assert_error(status, body, 400)
        self.assertEqual(body["error"]["code"], "context_length_exceeded")
        status, body = s.post("/v1/completions", {"prompt": [10 ** 9]})
        self.assert_error(status, body, 400)
        status, text = s.get("/v1/nowhere")
        self.assert_error(status, json.loads(text), 404)
        status, text = s.request("POST", "/v1/completions", raw="[1, 2]")
        self.assert_error(status, json.loads(text), 400)
        # Found by fuzz_chat_request: a number too large for a double used to escape as a 500.
        status, text = s.request("POST", "/v1/completions", raw='{"prompt": "x", "max_tokens": 888e18888888888}')
        self.assert_error(status, json.loads(text), 400)
        self.assertEqual(s.get("/health")[0], 200)  # still alive

    def test_forced_tool_calls_on_a_template_without_tool_syntax(self):
        # The synthetic model's template writes no tool calls: "required" and a named function
        # still work (the tools described in a system message, the call grammar-constrained JSON);
        # "auto" is a 400 that says why.
        weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 10, "pattern": "^[A-Za-z ]+$"},
            "days": {"type": "integer", "minimum": 1, "maximum": 14}}, "required": ["city", "days"],
            "additionalProperties": False}}}
        clock = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
        base = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 120, "temperature": 1,
                "tools": [weather, clock]}
        for seed, choice in enumerate(("required", {"type": "function", "function": {"name": "get_weather"}})):
            status, resp = self.server.post("/v1/chat/completions", {**base, "tool_choice": choice, "seed": seed})
            self.assertEqual(status, 200, resp)
            self.assertEqual(resp["choices"][0]["finish_reason"], "tool_calls", resp)
            calls = resp["choices"][0]["message"]["tool_calls"]
            self.assertEqual(len(calls), 1)
            self.assertIn(calls[0]["function"]["name"], ("get_weather", "get_time"))
            args = json.loads(calls[0]["function"]["arguments"])
            if calls[0]["function"]["name"] == "get_weather":
                self.assertRegex(args["city"], r"^[A-Za-z ]{1,10}$")
                self.assertTrue(1 <= args["days"] <= 14)
        self.assertEqual(calls[0]["function"]["name"], "get_weather")  # the named one
        # The round trip: the call and its result go back; the model answers (here: called again).
        turn = {**base, "tools": [weather], "tool_choice": "required", "seed": 3, "messages": base["messages"] + [
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "{\"temp\": 20}"}]}
        status, resp = self.server.post("/v1/chat/completions", turn)
        self.assertEqual(status, 200, resp)
        self.assertEqual(resp["choices"][0]["finish_reason"], "tool_calls", resp)
        # The description reaches the prompt.
        _, plain = self.server.post("/v1/chat/completions", {**base, "tools": [], "max_tokens": 1})
        _, described = self.server.post("/v1/chat/completions", {**base, "tool_choice": "required", "max_tokens": 1})
        self.assertGreater(described["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"] + 40)
        status, resp = self.server.post("/v1/chat/completions", {**base, "tool_choice": "auto"})
        self.assert_error(status, resp, 400)
        self.assertEqual(resp["error"]["param"], "tools")
        self.assertIn("tool_choice \"required\" or a named function works with any template", resp["error"]["message"])

    def test_fields_clients_send_by_default_are_accepted(self):
        s = self.server
        base = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
        defaults = {"logprobs": False, "top_logprobs": 0, "response_format": {"type": "text"}, "store": False,
                    "metadata": {"k": "v"}, "parallel_tool_calls": True, "tools": [], "tool_choice": "auto",
                    "logit_bias": {}, "reasoning_effort": "low", "user": "u", "service_tier": "auto",
                    "modalities": ["text"], "n": 1, "presence_penalty": 0, "frequency_penalty": 0}
        status, body = s.post("/v1/chat/completions", {**base, **defaults})
        self.assertEqual(status, 200, body)
        status, plain = s.post("/v1/chat/completions", base)
        self.assertEqual(body["choices"][0]["message"]["content"], plain["choices"][0]["message"]["content"])
        status, body = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 2, "logit_bias": {}, "suffix": "",
                                                  "echo": False, "best_of": 1, "user": "u"})
        self.assertEqual(status, 200, body)
        # Asking for what bmoe does not do is refused, naming the field, never silently dropped.
        for field, value in (("modalities", ["text", "audio"]), ("audio", {"voice": "x"})):
            status, body = s.post("/v1/chat/completions", {**base, field: value})
            self.assert_error(status, body, 400)
            self.assertEqual(body["error"]["param"], field)

    def test_stream_usage_chunk(self):
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0}
        plain = self.server.stream("/v1/chat/completions", body)
        self.assertTrue(all(e == "[DONE]" or e["choices"] for e in plain))
        events = self.server.stream("/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(events[-2]["choices"], [])
        usage = events[-2]["usage"]
        self.assertEqual(usage["prompt_tokens"] + usage["completion_tokens"], usage["total_tokens"])
        # The same text (how it is split into chunks depends on timing), one more chunk.
        def text(evs):
            return "".join(e["choices"][0]["delta"].get("content", "") for e in evs if e != "[DONE]" and e["choices"])
        self.assertEqual(text(events), text(plain))
        self.assertEqual([e for e in events[:-2] if e["choices"] == []], [])
        status, err = self.server.post("/v1/chat/completions", {**body, "stream_options": 3})
        self.assert_error(status, err, 400)

    def test_model_by_id_tokenize_detokenize_props(self):
        s = self.server
        status, text = s.get("/v1/models/tiny-qwen3moe.gguf")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(text)["id"], "tiny-qwen3moe.gguf")
        status, text = s.get("/v1/models/gpt-4")
        self.assertEqual(status, 404)
        self.assertEqual(json.loads(text)["error"]["code"], "model_not_found")
        want = json.loads(run([tool("bmoe-cli"), "-m", self.model, "-p", "Hello world", "--tokenize"]))
        status, body = s.post("/tokenize", {"content": "Hello world", "add_special": True})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["tokens"], want)
        status, pieces = s.post("/tokenize", {"content": "Hello world", "with_pieces": True})
        self.assertEqual("".join(p["piece"] for p in pieces["tokens"]), "Hello world")
        status, body = s.post("/detokenize", {"tokens": [p["id"] for p in pieces["tokens"]]})
        self.assertEqual(body, {"content": "Hello world"})
        status, body = s.post("/detokenize", {"tokens": [-1]})
        self.assert_error(status, body, 400)
        status, body = s.post("/tokenize", {"text": "x"})
        self.assert_error(status, body, 400)
        status, text = s.get("/props")
        props = json.loads(text)
        self.assertEqual(props["total_slots"], 1)
        settings = props["default_generation_settings"]
        self.assertEqual(settings["n_ctx"], 512)
        self.assertAlmostEqual(settings["temperature"], 0.8, places=5)  # llama-server's default
        for key, value in (("min_p", 0), ("repeat_penalty", 1), ("repeat_last_n", 64), ("presence_penalty", 0),
                           ("ignore_eos", False)):
            self.assertEqual(settings[key], value, key)
        self.assertEqual(props["architecture"], "qwen3moe")
        # A tiny model fits in memory: the automatic mode keeps it resident and says why.
        self.assertFalse(props["mode"]["streaming"])
        self.assertIn("<=", props["mode"]["reason"])

    def test_habits_405_request_log_huge_numbers_and_prompts(self):
        # A GET on a POST route: 405 naming the method it takes, not 404.
        for path in ("/v1/chat/completions", "/v1/completions", "/tokenize"):
            conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
            conn.request("GET", path)
            resp = conn.getresponse()
            body = json.loads(resp.read())
            conn.close()
            self.assertEqual(resp.status, 405, path)
            self.assertEqual(resp.getheader("Allow"), "POST")
            self.assertIn("POST", body["error"]["message"])
        self.assertEqual(self.server.get("/v1/nowhere")[0], 404)
        # max_tokens 2^63 is reported as itself, not wrapped to a negative number.
        status, resp = self.server.post("/v1/completions", {"prompt": "x", "max_tokens": 2 ** 63})
        self.assertEqual(status, 400, resp)
        self.assertIn(str(2 ** 63), resp["error"]["message"])
        self.assertNotIn("-9223372036854775808", resp["error"]["message"])
        # A 12 MB prompt is refused before it is tokenized: the server's peak memory barely moves
        # (tokenized whole, it took about 1 GB).
        def peak_kib():
            with open(f"/proc/{self.server.proc.pid}/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        before = peak_kib()
        started = time.time()
        for endpoint, body in (("/v1/completions", {"prompt": "hello " * (2 << 20)}),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello " * (2 << 20)}]})):
            status, resp = self.server.post(endpoint, {**body, "max_tokens": 1})
            self.assertEqual(status, 400, endpoint)
            self.assertEqual(resp["error"]["code"], "context_length_exceeded")
            self.assertIn("bytes", resp["error"]["message"])
        # The memory bound is the proof; the time bound only catches a tokenizer run on 12 MB
        # (minutes), loose enough for a loaded 2-core machine (37 s seen at load 20).
        self.assertLess(time.time() - started, 120)
        self.assertLess(peak_kib() - before, 300 * 1024)
        # /stats names the prompt being read (none now).
        _, stats = self.server.get("/stats")
        self.assertEqual(json.loads(stats)["prompt"], {"done": 0, "total": 0})
        # One log line per request: method, path, client, status.
        deadline = time.time() + 5
        while time.time() < deadline:
            self.server.log.seek(0)
            log = self.server.log.read()
            if "request: GET /v1/nowhere" in log:
                break
            time.sleep(0.1)
        self.assertRegex(log, r"request: GET /v1/chat/completions 127\.0\.0\.1 405\n")
        self.assertRegex(log, r"request: POST /v1/completions 127\.0\.0\.1 400\n")
        self.assertRegex(log, r"request: GET /v1/nowhere 127\.0\.0\.1 404\n")

    def test_disconnect_cancels_the_generation(self):
        before = self.server.metric_labelled("bmoe_requests_total", 'outcome="cancelled"')
        conn = socket.create_connection(("127.0.0.1", self.server.port))
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 100000, "temperature": 0, "stream": True,
                           "top_k": 1}).encode()
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        conn.recv(256)  # the stream has started
        conn.close()
        # The worker counts the cancel and then, a moment later, clears bmoe_busy: wait for both
        # (a loaded machine can preempt it in between), then check both.
        def cancelled():
            return self.server.metric_labelled("bmoe_requests_total", 'outcome="cancelled"')
        wait_until(lambda: cancelled() > before and self.server.metric("bmoe_busy") == 0.0, 120)
        self.assertGreater(cancelled(), before)
        self.assertEqual(self.server.metric("bmoe_busy"), 0.0)


class ServerMtpTest(unittest.TestCase):
    """--mtp on bmoe-server: the model's MTP block drafts, verification keeps only what greedy
    decoding gives, so a completion equals the one of a server without it, and the timings and
    /metrics count the drafts (tiny-qwen35moe: a hybrid trunk, so rejected drafts roll the
    recurrent state back)."""

    def test_mtp_completion_equals_plain(self):
        model = synth("tiny-qwen35moe", "tiny-qwen35moe")
        body = {"prompt": "the harbour town woke slowly", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
        answers = {}
        for name, flags in (("plain", ()), ("mtp", ("--mtp", "--draft", "3"))):
            server = Server(model, "-c", "512", *flags)
            try:
                status, answers[name] = server.post("/v1/completions", body)
                self.assertEqual(status, 200, answers[name])
                status, metrics = server.get("/metrics")
                self.assertEqual(status, 200)
                answers[name + "-metrics"] = metrics
            finally:
                server.stop()
        plain, mtp = answers["plain"], answers["mtp"]
        self.assertEqual(mtp["choices"][0]["text"], plain["choices"][0]["text"])
        self.assertEqual(mtp["usage"]["completion_tokens"], 40)
        drafted = mtp["timings"]["draft_n"]
        self.assertGreater(drafted, 0, "the MTP head never drafted")
        counted = re.search(r"^bmoe_draft_tokens_total (\S+)$", answers["mtp-metrics"], re.M)
        self.assertIsNotNone(counted, answers["mtp-metrics"])
        self.assertEqual(float(counted.group(1)), drafted)
        self.assertNotIn("draft_n", plain["timings"])

    def test_mtp_drafts_per_slot_in_a_batch(self):
        """--parallel 2 --mtp: two requests decoded together, each slot's own head drafting and
        every draft verified in the shared steps; each answer equals a plain server's, and the
        timings and /metrics count each slot's drafts."""
        model = synth("tiny-qwen35moe", "tiny-qwen35moe")
        bodies = [{"prompt": p, "max_tokens": 32, "temperature": 0, "ignore_eos": True}
                  for p in ("the harbour town woke slowly", "1 2 3 4 1 2 3 4 1 2 3 4")]
        plain = Server(model, "-c", "512")
        try:
            want = [plain.post("/v1/completions", b)[1]["choices"][0]["text"] for b in bodies]
        finally:
            plain.stop()
        server = Server(model, "-c", "1024", "--parallel", "2", "--mtp", "--draft", "3")
        try:
            got = [None, None]

            def client(i):
                got[i] = server.post("/v1/completions", bodies[i])
            threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            status, metrics = server.get("/metrics")
        finally:
            server.stop()
        for i in range(2):
            self.assertEqual(got[i][0], 200, got[i][1])
            self.assertEqual(got[i][1]["choices"][0]["text"], want[i], f"request {i}")
            self.assertGreater(got[i][1]["timings"]["draft_n"], 0, f"request {i}: its slot's head never drafted")
        counted = re.search(r"^bmoe_draft_tokens_total (\S+)$", metrics, re.M)
        self.assertIsNotNone(counted, metrics)
        self.assertEqual(float(counted.group(1)), sum(g[1]["timings"]["draft_n"] for g in got))


class ServerParallelTest(unittest.TestCase):
    """--parallel N: concurrent requests decoded together, each answer identical to the same
    request alone (greedy, on a --parallel 1 server), a long prompt read in chunks inside the
    others' steps, /slots and per-slot /metrics, a cancelled stream that frees its slot, and the
    bounded queue's 503 + Retry-After beyond the slots."""

    LONG = " ".join(f"word{i}" for i in range(60))  # ~300 tokens: 19 chunks of -b 16
    PROMPTS = ["The capital of France is", "Once upon a time", "hi", LONG, "1 2 3 4 5 6 7 8", "Tell me a story"]

    @classmethod
    def setUpClass(cls):
        cls.model = synth("tiny-qwen3moe", "tiny-qwen3moe")

    def body(self, i):
        return {"prompt": self.PROMPTS[i % len(self.PROMPTS)], "max_tokens": 16 + 4 * (i % 5), "temperature": 0}

    def test_concurrent_requests_equal_each_alone(self):
        flags = ("--moe-stream", "--cache-mb", "0", "-b", "16")
        alone = Server(self.model, "-c", "512", *flags)
        try:
            want = [alone.post("/v1/completions", self.body(i))[1]["choices"][0]["text"] for i in range(12)]
        finally:
            alone.stop()
        s = Server(self.model, "-c", "1536", "--parallel", "3", "--queue", "16", *flags)
        try:
            slots = json.loads(s.get("/slots")[1])
            self.assertEqual([slot["id"] for slot in slots], [0, 1, 2])
            self.assertEqual({slot["n_ctx"] for slot in slots}, {512})
            got = [None] * 12
            busy_seen = []

            def client(k):
                for i in range(k, 12, 4):
                    status, answer = s.post("/v1/completions", self.body(i))
                    got[i] = answer["choices"][0]["text"] if status == 200 else status

            def watch():
                while any(g is None for g in got):
                    busy_seen.append(sum(slot["is_processing"] for slot in json.loads(s.get("/slots")[1])))
                    time.sleep(0.02)
            threads = [threading.Thread(target=client, args=(k,)) for k in range(4)] + [threading.Thread(target=watch)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(got, want)
            self.assertGreater(max(busy_seen), 1, "no two slots were ever busy at once")
            wait_until(lambda: all(not slot["is_processing"] for slot in json.loads(s.get("/slots")[1])), 30)
            slots = json.loads(s.get("/slots")[1])
            self.assertEqual(sum(slot["requests"] for slot in slots), 12)
            self.assertTrue(all(slot["state"] == "idle" for slot in slots), slots)
            for k in range(3):
                self.assertEqual(s.metric_labelled("bmoe_slot_busy", f'slot="{k}",state="idle"'), 0.0)
            self.assertEqual(s.metric_labelled("bmoe_requests_total", 'outcome="ok"'), 12)
        finally:
            s.stop()

    def test_slots_stream_progress_and_timings(self):
        # return_progress and timings_per_token per slot (llama-server's): a progress event when
        # the slot starts and after each -b chunk of the long prompt, before the first text; the
        # running timings with each piece.
        s = Server(self.model, "-c", "1024", "--parallel", "2", "-b", "16")
        try:
            body = {"prompt": self.LONG, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "stream": True,
                    "return_progress": True, "timings_per_token": True}
            events = s.stream("/v1/completions", body)
            self.assertEqual(events[-1], "[DONE]")
            total = events[-2]["usage"]["prompt_tokens"]
            progress = [e["prompt_progress"] for e in events[:-1] if "prompt_progress" in e]
            self.assertEqual({p["total"] for p in progress}, {total})
            self.assertEqual([p["processed"] for p in progress],
                             [0] + [min(k * 16, total) for k in range(1, (total + 15) // 16 + 1)])
            first_text = next(i for i, e in enumerate(events[:-1]) if e.get("choices") and e["choices"][0].get("text"))
            self.assertFalse([e for e in events[first_text:-1] if "prompt_progress" in e])
            # Pieces written together share one chunk, which carries the latest timings.
            counts = [e["timings"]["predicted_n"] for e in events[first_text:-2] if "timings" in e]
            self.assertTrue(counts, events)
            self.assertEqual(counts, sorted(counts))
            self.assertGreaterEqual(counts[0], 1)
            self.assertLessEqual(counts[-1], 6)
            self.assertEqual(events[-2]["timings"]["predicted_n"], 6)
            plain = s.stream("/v1/completions", {k: body[k] for k in ("prompt", "max_tokens", "stream")})
            self.assertFalse([e for e in plain[:-2] if "prompt_progress" in e or "timings" in e])
        finally:
            s.stop()

    def test_cancel_frees_the_slot_and_a_full_queue_answers_503(self):
        s = Server(self.model, "-c", "1024", "--parallel", "2", "--queue", "1")
        try:
            open_endless_stream(s, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 100000}).close()
            wait_until(lambda: s.metric_labelled("bmoe_requests_total", 'outcome="cancelled"') == 1 and
                       not any(slot["is_processing"] for slot in json.loads(s.get("/slots")[1])), 60)
            self.assertEqual(s.metric_labelled("bmoe_requests_total", 'outcome="cancelled"'), 1)
            self.assertFalse(any(slot["is_processing"] for slot in json.loads(s.get("/slots")[1])))
            # Two slots and one queue place: of six long requests at once, some must be refused.
            statuses, retry_after = [], []

            def client():
                conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
                conn.request("POST", "/v1/completions", body=json.dumps(
                    {"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "ignore_eos": True}),
                    headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                statuses.append(resp.status)
                retry_after.append(resp.getheader("Retry-After"))
                conn.close()
            threads = [threading.Thread(target=client) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertIn(503, statuses)
            self.assertGreaterEqual(statuses.count(200), 2)
            self.assertEqual(set(statuses), {200, 503})
            self.assertTrue(all(r == "1" for st, r in zip(statuses, retry_after) if st == 503))
        finally:
            s.stop()


    def test_free_slots_take_requests_with_no_queue(self):
        """--queue bounds the requests waiting beyond the free slots: with --queue 0 a request for
        a free slot is taken (the worker admits it at its next turn), not refused as a full queue."""
        s = Server(self.model, "-c", "512", "--parallel", "2", "--queue", "0")
        try:
            for _ in range(2):
                status, body = s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})
                self.assertEqual(status, 200, body)
        finally:
            s.stop()

    def test_metrics_report_the_shared_batch(self):
        """Two requests decoded together on --parallel 2 and a third queued behind them: /metrics
        (llama-server's llamacpp:* names, bmoe's per-slot and batch figures) counts every token
        once, per slot and in total, and reports the rows that shared the batch's steps."""
        s = Server(self.model, "-c", "2048", "--parallel", "2", "--queue", "4", "--moe-stream", "--cache-mb", "0", "-b", "16")
        try:
            bodies = [{"prompt": self.PROMPTS[i], "max_tokens": 300, "temperature": 0, "ignore_eos": True} for i in (0, 3)]
            bodies.append({"prompt": "hi", "max_tokens": 8, "temperature": 0, "ignore_eos": True})
            answers = [None] * 3
            seen = set()  # (requests processing, deferred) at each scrape

            def client(i):
                answers[i] = s.post("/completion", bodies[i])[1]

            def scrape():
                m = s.metrics()
                seen.add((m["llamacpp:requests_processing"], m["llamacpp:requests_deferred"]))
                return m
            threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
            for t in threads[:2]:
                t.start()
            wait_until(lambda: scrape()["llamacpp:requests_processing"] == 2 or answers[0] or answers[1], 30)
            self.assertIn(2, {processing for processing, _ in seen}, "the two long requests never ran together")
            threads[2].start()
            wait_until(lambda: (2, 1) in seen or scrape() and (2, 1) in seen or answers[2], 30)
            for t in threads:
                t.join()
            self.assertIn((2, 1), seen, "the third request never waited behind the two long ones")
            m = s.metrics()
            predicted = [a["tokens_predicted"] for a in answers]
            evaluated = [a["tokens_evaluated"] - a["tokens_cached"] for a in answers]
            # Totals and the per-slot counters agree with the answers.
            self.assertEqual(m["llamacpp:tokens_predicted_total"], sum(predicted))
            self.assertEqual(m["llamacpp:prompt_tokens_total"], sum(evaluated))
            self.assertEqual(m["llamacpp:prompt_tokens_cached_total"], sum(a["tokens_cached"] for a in answers))
            for name, total in (("bmoe_slot_tokens_predicted_total", sum(predicted)), ("bmoe_slot_requests_total", 3),
                                ("bmoe_slot_prompt_tokens_total", sum(evaluated))):
                self.assertEqual(sum(m[f'{name}{{slot="{k}"}}'] for k in range(2)), total, name)
            slots = [a["id_slot"] for a in answers]
            self.assertEqual(sorted(slots[:2]), [0, 1])
            for k in range(2):
                self.assertEqual(m[f'bmoe_slot_tokens_predicted_total{{slot="{k}"}}'],
                                 sum(p for p, slot in zip(predicted, slots) if slot == k))
            self.assertEqual((m["llamacpp:requests_processing"], m["llamacpp:requests_deferred"]), (0, 0))
            self.assertEqual(m["llamacpp:n_tokens_max"], max(a["tokens_evaluated"] + a["tokens_predicted"] for a in answers))
            # The batch: each answer's tokens but its last were fed as rows of shared steps, and
            # every forward pass is a step or one prompt chunk of -b 16 read alone: a chunk read
            # while an answer runs rides in that answer's step (one pass for both).
            steps, rows = m["bmoe_batch_steps_total"], m["bmoe_batch_rows_total"]
            self.assertEqual(rows, sum(p - 1 for p in predicted))
            self.assertGreater(rows, steps, "no step ran two rows")
            chunks, mixed = sum(-(-e // 16) for e in evaluated), m["bmoe_batch_chunk_steps_total"]
            self.assertGreater(mixed, 0, "no prompt chunk was read in a decode step")
            self.assertLess(mixed, chunks, "the first prompt, read while nothing ran, had its own pass")
            self.assertEqual(m["llamacpp:n_decode_total"], steps + chunks - mixed)
            self.assertGreater(m["llamacpp:n_busy_slots_per_decode"], 1.0)
            self.assertLessEqual(m["llamacpp:n_busy_slots_per_decode"], 2.0)
            self.assertEqual(m["bmoe_batch_rows_per_step"], rows / steps)
            routed, looked_up = m["bmoe_batch_routed_expert_slots_total"], m["bmoe_batch_expert_lookups_total"]
            self.assertGreater(looked_up, 0)
            self.assertLess(looked_up, routed, "rows never shared an expert")
            self.assertEqual(m["bmoe_batch_expert_lookups_saved_total"], routed - looked_up)
            self.assertAlmostEqual(m["bmoe_batch_expert_sharing_ratio"], looked_up / routed, places=5)
            self.assertLessEqual(looked_up, m["bmoe_expert_lookups_total"])
            # Server-side times: one per step, one per chunk, one gap per row after an answer's first.
            self.assertEqual(m["bmoe_batch_step_seconds_count"], steps)
            self.assertEqual(m['bmoe_batch_step_seconds_bucket{le="+Inf"}'], steps)
            self.assertEqual(m["bmoe_prompt_chunk_seconds_count"], sum(-(-e // 16) for e in evaluated))
            # A step that read a chunk is split by rows: the decode rows' share and the chunks'
            # sum to the passes (within the steps' time, never over it), and each request's
            # prompt time is its chunks' times, so the prompt seconds are the chunks' sum.
            decode_part, prompt_part = m["bmoe_batch_decode_seconds_total"], m["bmoe_batch_prompt_seconds_total"]
            self.assertGreater(prompt_part, 0)
            self.assertLessEqual(decode_part + prompt_part, m["bmoe_batch_step_seconds_sum"] * (1 + 1e-9))
            self.assertLessEqual(prompt_part, m["bmoe_prompt_chunk_seconds_sum"] * (1 + 1e-9))
            self.assertAlmostEqual(m["llamacpp:prompt_seconds_total"], m["bmoe_prompt_chunk_seconds_sum"], places=6)
            self.assertEqual(m["bmoe_token_gap_seconds_count"], rows)
            self.assertEqual(m["bmoe_token_gap_overhead_seconds_count"], rows)
            self.assertLessEqual(m["bmoe_token_gap_overhead_seconds_sum"], m["bmoe_token_gap_seconds_sum"])
            self.assertGreater(m["bmoe_token_gap_seconds_sum"], 0)
            self.assertGreaterEqual(m["bmoe_token_gap_seconds_max"], m["bmoe_token_gap_seconds_sum"] / rows)
            self.assertGreater(m["llamacpp:predicted_tokens_seconds"], 0)
            self.assertEqual(s.metrics()["llamacpp:predicted_tokens_seconds"], 0, "the rate's window is since the last scrape")
        finally:
            s.stop()

    def test_grammar_stop_and_a_disconnect_inside_a_batch_equal_each_alone(self):
        """Grammar-constrained (greedy and seeded) and stop-string requests decoded in one batch
        with a plain long one, while another stream is cut off by its client mid-batch: each
        answer's tokens equal the same request's alone (--parallel 1), the stop string ends its
        answer early while the others go on."""
        flags = ("--moe-stream", "--cache-mb", "0", "-b", "16")
        grammar = 'root ::= word (" " word)* "." | "yes" | "no"\nword ::= [a-z]+'
        bodies = [{"prompt": "The capital of France is", "n_predict": 40, "temperature": 0, "grammar": grammar},
                  {"prompt": "Once upon a time", "n_predict": 40, "temperature": 0.9, "seed": 7, "grammar": grammar},
                  {"prompt": "1 2 3 4 5 6 7 8", "n_predict": 60, "temperature": 0, "ignore_eos": True},
                  {"prompt": self.LONG, "n_predict": 400, "temperature": 0, "ignore_eos": True}]
        alone = Server(self.model, "-c", "1024", *flags)
        try:
            unstopped = alone.post("/completion", bodies[2])[1]["content"]
            self.assertGreaterEqual(len(unstopped), 6)
            bodies[2]["stop"] = [unstopped[len(unstopped) // 3:][:3]]
            want = [alone.post("/completion", {**b, "return_tokens": True})[1] for b in bodies]
        finally:
            alone.stop()
        self.assertEqual(want[2]["stop_type"], "word")
        self.assertLess(want[2]["tokens_predicted"], 60)
        # 2048 positions a slot: the "endless" stream runs until its slot's context is full.
        s = Server(self.model, "-c", "10240", "--parallel", "5", *flags)
        try:
            cut = open_endless_stream(s, "/completion", {"prompt": "Tell me a story", "n_predict": 100000})
            got = [None] * len(bodies)

            def client(i):
                got[i] = s.post("/completion", {**bodies[i], "return_tokens": True})[1]
            threads = [threading.Thread(target=client, args=(i,)) for i in range(len(bodies))]
            for t in threads:
                t.start()
            # The cut stream and the long answer (400 tokens) at least: the grammar and stop-string
            # answers can end within one poll (measured: three of them in the first 0.1 s).
            wait_until(lambda: s.metrics()["llamacpp:requests_processing"] >= 2, 30)
            running = s.metrics()["llamacpp:requests_processing"]
            cut.close()  # the client goes away mid-batch
            for t in threads:
                t.join()
            self.assertGreaterEqual(running, 2, "the cut stream never shared the batch")
            for i, (g, w) in enumerate(zip(got, want)):
                self.assertEqual((g["tokens"], g["content"], g["stop_type"]), (w["tokens"], w["content"], w["stop_type"]),
                                 f"request {i}")
            wait_until(lambda: s.metric_labelled("bmoe_requests_total", 'outcome="cancelled"') == 1, 30)
            m = s.metrics()
            self.assertEqual(m['bmoe_requests_total{outcome="cancelled"}'], 1)
            self.assertEqual(m['bmoe_requests_total{outcome="ok"}'], len(bodies))
            self.assertGreater(m["bmoe_batch_rows_total"], m["bmoe_batch_steps_total"])
        finally:
            s.stop()

    def test_embeddings_run_between_the_steps_of_running_answers(self):
        """--parallel 2: an embeddings request taken by the free slot while an answer streams is
        embedded one input per turn between the answer's steps; its vectors and the answer equal
        those of a --parallel 1 server."""
        flags = ("--moe-stream", "--cache-mb", "0", "-b", "16")
        # 480 tokens (each sequence's context holds 512): long enough that the answer still runs
        # when the three inputs are embedded on a loaded machine (200 ended first under a build).
        answer = {"prompt": "Once upon a time", "n_predict": 480, "temperature": 0, "ignore_eos": True, "return_tokens": True}
        inputs = {"input": ["The capital of France is", self.LONG, "hi"]}
        alone = Server(self.model, "-c", "512", *flags)
        try:
            want = (alone.post("/completion", answer)[1]["tokens"], alone.post("/v1/embeddings", inputs)[1]["data"])
        finally:
            alone.stop()
        s = Server(self.model, "-c", "1024", "--parallel", "2", *flags)
        try:
            got = {}
            t = threading.Thread(target=lambda: got.update(answer=s.post("/completion", answer)[1]))
            t.start()
            wait_until(lambda: s.metrics()["llamacpp:requests_processing"] == 1, 30)
            status, embedded = s.post("/v1/embeddings", inputs)
            running = t.is_alive()
            t.join()
            self.assertEqual(status, 200, embedded)
            self.assertTrue(running, "the answer ended before the embeddings were done")
            self.assertEqual((got["answer"]["tokens"], embedded["data"]), want)
            m = s.metrics()
            self.assertEqual(sum(m[f'bmoe_slot_requests_total{{slot="{k}"}}'] for k in range(2)), 2)
        finally:
            s.stop()


class ServerLimitsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = synth("tiny-qwen3moe", "tiny-qwen3moe")

    def test_api_key(self):
        s = Server(self.model, "--api-key", "sekrit")
        try:
            self.assertEqual(s.get("/health")[0], 200)
            status, text = s.get("/v1/models")
            self.assertEqual(status, 401)
            self.assertEqual(json.loads(text)["error"]["type"], "authentication_error")
            status, _ = s.get("/v1/models", headers={"Authorization": "Bearer sekrit"})
            self.assertEqual(status, 200)
        finally:
            s.stop()

    def test_sampling_flags_are_the_requests_defaults(self):
        body = {"prompt": "The capital of France is", "max_tokens": 24, "temperature": 0}
        plain = Server(self.model, "-c", "512")
        try:
            _, want = plain.post("/v1/completions", {**body, "repeat_penalty": 5, "repeat_last_n": -1})
            _, unpenalized = plain.post("/v1/completions", body)
        finally:
            plain.stop()
        self.assertNotEqual(want["choices"][0]["text"], unpenalized["choices"][0]["text"])
        s = Server(self.model, "-c", "512", "--repeat-penalty", "5", "--repeat-last-n", "-1", "--temp", "0")
        try:
            _, got = s.post("/v1/completions", body)
            self.assertEqual(got["choices"][0]["text"], want["choices"][0]["text"])
            _, props = s.request("GET", "/props")
            settings = json.loads(props)["default_generation_settings"]
            self.assertEqual((settings["repeat_penalty"], settings["repeat_last_n"], settings["temperature"]), (5, -1, 0))
        finally:
            s.stop()

    def test_full_queue_answers_503_and_load_loses_nothing(self):
        """8 clients x 20 requests against a queue of 2: every request is answered (200) or
        rejected (503), none lost; the server stays up and its memory stays flat."""
        s = Server(self.model, "--queue", "2", "-c", "512")
        try:
            warm = {"prompt": "hello world", "max_tokens": 8, "temperature": 0}
            for _ in range(3):
                s.post("/v1/completions", warm)
            rss_before = s.metric("bmoe_rss_bytes")
            results = []
            lock = threading.Lock()

            def client(k):
                for i in range(20):
                    body = {"prompt": f"request {k} {i} the quick brown fox", "max_tokens": 24, "temperature": 0.7,
                            "seed": k * 100 + i, "stream": i % 2 == 0}
                    try:
                        status, text = s.request("POST", "/v1/completions", body, timeout=300)
                    except OSError as e:
                        status, text = -1, str(e)
                    with lock:
                        results.append((status, text))

            t0 = time.time()
            threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            seconds = time.time() - t0
            statuses = [r[0] for r in results]
            self.assertEqual(len(results), 160)
            self.assertTrue(set(statuses) <= {200, 503}, set(statuses))
            ok, busy = statuses.count(200), statuses.count(503)
            self.assertGreater(ok, 0)
            self.assertGreater(busy, 0, "8 clients against a queue of 2 must see some 503s")
            for status, text in results:
                if status == 503:
                    self.assertEqual(json.loads(text)["error"]["type"], "server_busy")
            self.assertEqual(s.get("/health")[0], 200)
            self.assertEqual(s.metric("bmoe_queue_depth"), 0.0)
            rss_after = s.metric("bmoe_rss_bytes")
            print(f"\nload: 160 requests in {seconds:.1f} s: {ok} answered, {busy} rejected with 503, 0 lost; "
                  f"RSS {rss_before / 2**20:.1f} -> {rss_after / 2**20:.1f} MiB")
            self.assertLess(rss_after, rss_before * 1.25 + (16 << 20))
        finally:
            s.stop()


class ServerHardeningTest(unittest.TestCase):
    """What an exposed server meets: a busy port, slow and many clients, SIGTERM mid-stream,
    bytes that are not UTF-8, and clients that rely on seeds."""

    @classmethod
    def setUpClass(cls):
        cls.model = synth("tiny-qwen3moe", "tiny-qwen3moe")

    def test_busy_port_is_refused(self):
        s = Server(self.model)
        try:
            p = subprocess.run([tool("bmoe-server"), "-m", self.model, "--port", str(s.port), "-t", THREADS],
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(p.returncode, 0, p.stderr[-800:])
            self.assertIn("cannot listen", p.stderr)
            self.assertEqual(s.get("/health")[0], 200)  # the first one is unaffected
        finally:
            s.stop()

    def test_slow_and_many_clients(self):
        s = Server(self.model)
        slow = []
        stop = threading.Event()
        try:
            # 24 clients that trickle their headers hold a connection each...
            for _ in range(24):
                c = socket.create_connection(("127.0.0.1", s.port))
                c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
                slow.append(c)

            def trickle():
                while not stop.wait(0.5):
                    for c in slow:
                        try:
                            c.sendall(b"X")
                        except OSError:
                            pass
            t = threading.Thread(target=trickle)
            t.start()
            # ...and /health still answers while they hold them. The server accepts connections
            # in the order they came, so the slow ones have their threads before /health comes;
            # their headers do not end (a byte per 0.5 s keeps them inside the 10 s read
            # timeout), so a server with no thread left for /health would not answer it within
            # the 60 s. That is the check; a wall-clock bound (it was 1 s) measured the load on
            # the machine as much as the server.
            for _ in range(3):
                self.assertEqual(s.get("/health", timeout=60)[0], 200)
            for c in slow:
                self.assertTrue(waiting_on_server(c), "a slow client was answered or dropped")
            # 32 clients at once: every connection is answered, none reset.
            results = []
            lock = threading.Lock()
            barrier = threading.Barrier(32)

            def client():
                barrier.wait()
                try:
                    status, _ = s.get("/v1/models", timeout=30)
                except OSError as e:
                    status = str(e)
                with lock:
                    results.append(status)
            clients = [threading.Thread(target=client) for _ in range(32)]
            for c in clients:
                c.start()
            for c in clients:
                c.join()
            self.assertEqual(results, [200] * 32)
            stop.set()
            t.join()
        finally:
            stop.set()
            for c in slow:
                c.close()
            s.stop()

    def test_sigterm_ends_running_and_queued_requests_with_an_error(self):
        s = Server(self.model, "-c", "32768")
        self.addCleanup(lambda: s.proc.poll() is None and s.proc.kill())  # a failed check below
        outcome = {}
        decoding = threading.Event()

        def streamer():
            body = {"prompt": "Once upon a time", "max_tokens": 30000, "temperature": 0, "stream": True}
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=300)
            try:
                conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
                resp = conn.getresponse()
                first = resp.readline()  # the first event: the stream is decoding
                decoding.set()
                outcome["stream"] = (resp.status, (first + resp.read()).decode())
            except (OSError, http.client.HTTPException) as e:  # a stream cut off reads short
                outcome["stream"] = (-1, repr(e))
            finally:
                decoding.set()
                conn.close()

        def queued(k):
            try:
                outcome[k] = s.request("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 8}, timeout=300)
            except (OSError, http.client.HTTPException) as e:
                outcome[k] = (-1, repr(e))
        # Conditions, not fixed sleeps: SIGTERM goes out once the stream is decoding and both
        # other requests wait in the queue, however slowly a loaded machine gets there.
        threads = [threading.Thread(target=streamer)]
        threads[0].start()
        self.assertTrue(decoding.wait(120), "the stream did not start")
        threads += [threading.Thread(target=queued, args=(k,)) for k in ("q1", "q2")]
        for t in threads[1:]:
            t.start()
        wait_until(lambda: s.metric("bmoe_queue_depth") == 2.0, 120)
        self.assertEqual(s.metric("bmoe_queue_depth"), 2.0, "the two requests are not queued")
        s.proc.terminate()
        for t in threads:
            t.join(timeout=120)
        self.assertEqual(s.proc.wait(timeout=60), 0)
        status, text = outcome["stream"]
        self.assertEqual(status, 200, text[-500:])
        self.assertIn("shutting down", text)  # an error event, not a silent end
        for k in ("q1", "q2"):  # not streamed: the error carries its own status
            status, text = outcome[k]
            self.assertEqual(status, 503, text)
            self.assertIn("shutting down", json.loads(text)["error"]["message"])

    def test_seeds_and_utf8(self):
        s = Server(self.model)
        try:
            body = {"prompt": "The weather today", "max_tokens": 16, "temperature": 1.0}
            texts = [s.post("/v1/completions", body)[1]["choices"][0]["text"] for _ in range(2)]
            self.assertNotEqual(texts[0], texts[1], "two seedless requests sampled the same text")
            seeded = [s.post("/v1/completions", {**body, "seed": 7})[1]["choices"][0]["text"] for _ in range(2)]
            self.assertEqual(seeded[0], seeded[1])
            status, text = s.request("POST", "/v1/completions", raw=b'{"prompt": "\xff\xfe", "max_tokens": 2}')
            self.assertEqual(status, 400, text)
            self.assertIn("UTF-8", json.loads(text)["error"]["message"])
            self.assertEqual(s.get("/health")[0], 200)
        finally:
            s.stop()
        p = subprocess.run([tool("bmoe-server").encode(), b"-m", self.model.encode(), b"--port", b"0", b"--alias", b"\xff\xfe"],
                           capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 2, p.stderr[-500:])
        self.assertIn(b"--alias must be valid UTF-8", p.stderr)

class ServerToolsTest(unittest.TestCase):
    """Tool calls and constrained output, with the models' real chat templates (Qwen3's from its
    npm tokenizer package, gpt-oss's harmony template from llama.cpp's tree) over tiny models, and
    DeepSeek-V4's template (as bmoe-synth writes it) and R1-Distill-Qwen's (llama.cpp's tree) on
    tiny-deepseek4."""

    @classmethod
    def setUpClass(cls):
        templates = load_templates()
        cls.template_dir = tempfile.TemporaryDirectory()
        cls.servers = {}
        for name, preset, vocab in (("qwen3", "tiny-qwen3moe", "qwen3"), ("gpt-oss", "tiny-gpt-oss", "gptoss"),
                                    ("qwen3.5", "tiny-qwen3moe", "qwen3")):
            path = os.path.join(cls.template_dir.name, name + ".jinja")
            with open(path, "w") as f:
                f.write(templates[name])
            model = synth(f"{preset}-{vocab}", preset, "--vocab", vocab)  # shared by the two Qwen templates
            cls.servers[name] = Server(model, "-c", "2048", "--chat-template-file", path)
        # DeepSeek-V4's DSML calls: DeepSeek-V4's template (bmoe-synth writes it) on DeepSeek's vocabulary.
        deepseek = synth("tiny-deepseek4-deepseek_v3", "tiny-deepseek4", "--vocab", "deepseek_v3")
        cls.servers["deepseek4"] = Server(deepseek, "-c", "2048")
        # DeepSeek-R1's call format (R1-Distill-Qwen's template) on the same model. V3.1's format
        # differs only in the call's layout (tests/test_tool_calls.cpp): no server of its own.
        path = os.path.join(cls.template_dir.name, "deepseek-r1.jinja")
        with open(path, "w") as f:
            f.write(templates["deepseek-r1"])
        cls.servers["deepseek-r1"] = Server(deepseek, "-c", "2048", "--chat-template-file", path)
        cls.server = cls.servers["qwen3"]

    @classmethod
    def tearDownClass(cls):
        for s in cls.servers.values():
            s.stop()
        cls.template_dir.cleanup()

    def assert_error(self, status, body, want_status):
        self.assertEqual(status, want_status, body)
        self.assertIsInstance(body["error"]["message"], str)

    WEATHER = {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 12},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14}},
            "required": ["city", "days"], "additionalProperties": False}}}
    TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}

    def check_weather_args(self, arguments):
        args = json.loads(arguments)
        self.assertIsInstance(args["city"], str)
        self.assertLessEqual(len(args["city"]), 12)
        self.assertIsInstance(args["days"], int)
        self.assertTrue(1 <= args["days"] <= 14)
        self.assertLessEqual(set(args), {"city", "unit", "days"})
        if "unit" in args:
            self.assertIn(args["unit"], ("c", "f"))

    def forced_weather_call(self, server, max_tokens):
        """A get_weather call forced by tool_choice (seed 1, temperature 1, thinking off): one call,
        its arguments following the schema. Returns the request body and the calls."""
        body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": max_tokens,
                "tools": [self.WEATHER, self.TIME], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "parallel_tool_calls": False, "chat_template_kwargs": {"enable_thinking": False}}
        status, resp = server.post("/v1/chat/completions", {**body, "seed": 1, "temperature": 1})
        self.assertEqual(status, 200, resp)
        choice = resp["choices"][0]
        self.assertEqual(choice["finish_reason"], "tool_calls", choice)
        calls = choice["message"]["tool_calls"]
        self.assertEqual(len(calls), 1)
        self.assertEqual(calls[0]["function"]["name"], "get_weather")
        self.check_weather_args(calls[0]["function"]["arguments"])
        return body, calls

    def test_deepseek_dsml_tool_calls(self):
        """A required call on deepseek4 is written as DSML under the grammar (the template says
        so: ｜DSML｜) and parsed back into arguments that follow the schema, whole or streamed."""
        server = self.servers["deepseek4"]
        body, _ = self.forced_weather_call(server, 300)
        events = server.stream("/v1/chat/completions", {**body, "seed": 3, "temperature": 1, "stream": True})
        deltas = [e["choices"][0] for e in events if e != "[DONE]" and e["choices"]]
        calls = [c for d in deltas for c in d["delta"].get("tool_calls", [])]
        self.assertEqual(len(calls), 1)
        self.check_weather_args(calls[0]["function"]["arguments"])
        self.assertEqual(deltas[-1]["finish_reason"], "tool_calls")

    def test_deepseek_r1_tool_calls(self):
        """DeepSeek-R1's template names its format; a forced call is written between DeepSeek's
        tool-call tokens (special tokens of its vocabulary), parsed back, and goes back through the
        template with its result. (Streaming does not depend on the format: the deepseek4 case.)"""
        server = self.servers["deepseek-r1"]
        self.assertEqual(json.loads(server.get("/props")[1])["tool_call_format"], "deepseek-r1")
        body, calls = self.forced_weather_call(server, 200)
        turn = {"messages": body["messages"] + [
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "{\"temp\": 20}"}],
            "tools": body["tools"], "max_tokens": 2}
        status, resp = server.post("/v1/chat/completions", turn)
        self.assertEqual(status, 200, resp)

    def test_required_tool_call_follows_the_schema(self):
        body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 300,
                "tools": [self.WEATHER, self.TIME], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "parallel_tool_calls": False}
        for seed in range(3):
            status, resp = self.server.post("/v1/chat/completions", {**body, "seed": seed, "temperature": 1})
            self.assertEqual(status, 200, resp)
            choice = resp["choices"][0]
            self.assertEqual(choice["finish_reason"], "tool_calls", choice)
            self.assertIsNone(choice["message"]["content"])
            calls = choice["message"]["tool_calls"]
            self.assertEqual(len(calls), 1)
            self.assertEqual(calls[0]["type"], "function")
            self.assertTrue(calls[0]["id"])
            self.assertEqual(calls[0]["function"]["name"], "get_weather")
            self.check_weather_args(calls[0]["function"]["arguments"])
        # Streamed: the call arrives whole in one delta, then the tool_calls finish.
        events = self.server.stream("/v1/chat/completions", {**body, "seed": 7, "temperature": 1, "stream": True})
        deltas = [e["choices"][0] for e in events if e != "[DONE]" and e["choices"]]
        calls = [c for d in deltas for c in d["delta"].get("tool_calls", [])]
        self.assertEqual(len(calls), 1)
        self.assertEqual(calls[0]["index"], 0)
        self.assertEqual(calls[0]["function"]["name"], "get_weather")
        self.check_weather_args(calls[0]["function"]["arguments"])
        self.assertEqual(deltas[-1]["finish_reason"], "tool_calls")
        # Parallel calls (the default): every complete call is valid; one cut off by max_tokens stays text.
        status, resp = self.server.post("/v1/chat/completions", {**body, "parallel_tool_calls": True, "seed": 1,
                                                                 "temperature": 1})
        calls = resp["choices"][0]["message"]["tool_calls"]
        self.assertGreaterEqual(len(calls), 1)
        for call in calls:
            self.assertEqual(call["function"]["name"], "get_weather")
            self.check_weather_args(call["function"]["arguments"])
        self.assertEqual(len({c["id"] for c in calls}), len(calls))
        # "required" picks among the tools; the call then goes back to the model with its result.
        status, resp = self.server.post("/v1/chat/completions", {**body, "tool_choice": "required", "temperature": 0})
        self.assertEqual(status, 200, resp)
        call = resp["choices"][0]["message"]["tool_calls"][0]
        self.assertIn(call["function"]["name"], ("get_weather", "get_time"))
        turn = {"messages": body["messages"] + [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "{\"temp\": 20}"}],
            "tools": body["tools"], "max_tokens": 8}
        status, resp = self.server.post("/v1/chat/completions", turn)
        self.assertEqual(status, 200, resp)

    def test_tools_with_auto_choice_answer_normally(self):
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "temperature": 0,
                "tools": [self.WEATHER]}
        status, resp = self.server.post("/v1/chat/completions", body)
        self.assertEqual(status, 200, resp)
        self.assertIn(resp["choices"][0]["finish_reason"], ("stop", "length"))
        self.assertIsInstance(resp["choices"][0]["message"]["content"], str)
        # The tools reach the template (the prompt grows by their description), "none" hides them.
        _, none = self.server.post("/v1/chat/completions", {**body, "tool_choice": "none"})
        self.assertGreater(resp["usage"]["prompt_tokens"], none["usage"]["prompt_tokens"])

    def test_response_format_json_schema_and_grammar(self):
        schema = {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "ok": {"type": "boolean"}, "color": {"enum": ["red", "green"]}},
            "required": ["name", "age", "ok", "color"], "additionalProperties": False}
        body = {"messages": [{"role": "user", "content": "A person, as JSON."}], "max_tokens": 300, "temperature": 1,
                "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}}
        for seed in range(3):
            status, resp = self.server.post("/v1/chat/completions", {**body, "seed": seed})
            self.assertEqual(status, 200, resp)
            self.assertEqual(resp["choices"][0]["finish_reason"], "stop")
            value = json.loads(resp["choices"][0]["message"]["content"])
            self.assertEqual(set(value), {"name", "age", "ok", "color"})
            self.assertIsInstance(value["name"], str)
            self.assertLessEqual(len(value["name"]), 8)
            self.assertTrue(isinstance(value["age"], int) and 0 <= value["age"] <= 150)
            self.assertIsInstance(value["ok"], bool)
            self.assertIn(value["color"], ("red", "green"))
        # json_object: the text can only ever be the start of a JSON object.
        status, resp = self.server.post("/v1/chat/completions", {**body, "seed": 1, "max_tokens": 24,
                                                                 "response_format": {"type": "json_object"}})
        self.assertEqual(status, 200, resp)
        text = resp["choices"][0]["message"]["content"]
        self.assertTrue(text.startswith("{"), text)
        if resp["choices"][0]["finish_reason"] == "stop":
            self.assertIsInstance(json.loads(text), dict)
        # llama-server's grammar field, on completions.
        for seed in range(4):
            status, resp = self.server.post("/v1/completions", {"prompt": "Is it?", "max_tokens": 8, "temperature": 1,
                                                                "seed": seed, "grammar": 'root ::= "yes" | "no"'})
            self.assertEqual(status, 200, resp)
            self.assertIn(resp["choices"][0]["text"], ("yes", "no"))
            self.assertEqual(resp["choices"][0]["finish_reason"], "stop")

    def test_bad_tools_and_formats_are_400s(self):
        base = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
        for field, extra in (
                ("tools", {"tools": [{"type": "function", "function": {"name": "bad name!"}}]}),
                ("tools", {"tools": [{"type": "retrieval"}]}),
                ("tools", {"tools": {"a": 1}}),
                ("tool_choice", {"tool_choice": "required"}),  # without tools
                ("tool_choice", {"tools": [self.WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                ("tool_choice", {"tools": [self.WEATHER], "tool_choice": "always"}),
                ("response_format", {"response_format": {"type": "json_schema", "json_schema": {
                    "name": "x", "schema": {"type": "string", "pattern": "^(?=a)a+$"}}}}),
                ("response_format", {"response_format": {"type": "yaml"}}),
                ("grammar", {"grammar": "root ::= undefined-rule"}),
                ("grammar", {"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}})):
            status, resp = self.server.post("/v1/chat/completions", {**base, **extra})
            self.assert_error(status, resp, 400)
            self.assertEqual(resp["error"]["param"], field, (extra, resp))


    def test_deeply_nested_arguments_do_not_crash(self):
        deep = "{\"a\": " * 30000 + "1" + "}" * 30000
        turn = {"messages": [{"role": "user", "content": "x"},
                             {"role": "assistant", "content": None, "tool_calls": [
                                 {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": deep}}]},
                             {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
                "tools": [self.WEATHER], "max_tokens": 2}
        status, resp = self.server.post("/v1/chat/completions", turn)
        self.assertIn(status, (200, 400), resp)
        self.assertEqual(self.server.get("/health")[0], 200)

    def test_qwen35_xml_calls_and_json_after_its_open_think_block(self):
        s = self.servers["qwen3.5"]
        _, close = s.post("/tokenize", {"content": "</think>"})
        self.assertEqual(len(close["tokens"]), 1, close)
        # The reasoning runs free before a grammar (below): a favoured "</think>" ends it at once.
        body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 300, "temperature": 1,
                "tools": [self.WEATHER], "tool_choice": "required", "parallel_tool_calls": False,
                "logit_bias": {str(close["tokens"][0]): 100}}
        for seed in range(2):
            status, resp = s.post("/v1/chat/completions", {**body, "seed": seed})
            self.assertEqual(status, 200, resp)
            choice = resp["choices"][0]
            self.assertEqual(choice["finish_reason"], "tool_calls", choice)
            self.check_weather_args(choice["message"]["tool_calls"][0]["function"]["arguments"])
        # The template opens <think>; a grammar leaves the reasoning free and constrains what follows
        # its "</think>" (as llama-server does): favoured, "</think>" comes first (no grammar would
        # let it through), and the answer after it is the schema's JSON. The prompt is not changed.
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                  "additionalProperties": False}
        constrained = {"messages": body["messages"], "max_tokens": 100, "temperature": 1, "seed": 1,
                       "logit_bias": {str(close["tokens"][0]): 100},
                       "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
        status, resp = s.post("/v1/chat/completions", constrained)
        self.assertEqual(status, 200, resp)
        self.assertIsInstance(json.loads(resp["choices"][0]["message"]["content"])["ok"], bool)
        _, free = s.post("/v1/chat/completions", {"messages": body["messages"], "max_tokens": 1})
        self.assertEqual(resp["usage"]["prompt_tokens"], free["usage"]["prompt_tokens"])  # no "</think>" added
        # Without the bias the reasoning runs free: text the JSON grammar would refuse is reasoning.
        status, resp = s.post("/v1/chat/completions", {**constrained, "logit_bias": {}, "max_tokens": 8})
        self.assertEqual(status, 200, resp)
        self.assertTrue(resp["choices"][0]["message"].get("reasoning_content"), resp)
        # Thinking off: the template closes the block and the whole answer follows the grammar.
        status, resp = s.post("/v1/chat/completions", {**constrained, "logit_bias": {},
                                                       "chat_template_kwargs": {"enable_thinking": False}})
        self.assertEqual(status, 200, resp)
        self.assertIsInstance(json.loads(resp["choices"][0]["message"]["content"])["ok"], bool)

    def test_each_template_names_its_call_format(self):
        for name, want in (("qwen3", "hermes"), ("gpt-oss", "harmony"), ("qwen3.5", "qwen-xml"), ("deepseek4", "deepseek-dsml")):
            _, text = self.servers[name].get("/props")
            self.assertEqual(json.loads(text)["tool_call_format"], want)

    def test_harmony_tool_call_and_channels(self):
        s = self.servers["gpt-oss"]
        body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 300, "temperature": 1,
                "tools": [self.WEATHER], "tool_choice": "required"}
        for seed in range(2):
            status, resp = s.post("/v1/chat/completions", {**body, "seed": seed})
            self.assertEqual(status, 200, resp)
            choice = resp["choices"][0]
            self.assertEqual(choice["finish_reason"], "tool_calls", choice)
            call = choice["message"]["tool_calls"][0]
            self.assertEqual(call["function"]["name"], "get_weather")
            self.check_weather_args(call["function"]["arguments"])
        # The call and its result go back through the harmony template.
        turn = {"messages": body["messages"] + [{"role": "assistant", "content": None, "tool_calls": [call]},
                                                {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}],
                "tools": body["tools"], "max_tokens": 4}
        status, resp = s.post("/v1/chat/completions", turn)
        self.assertEqual(status, 200, resp)
        # A random model writes no channel markers: its text is content, not swallowed as a header.
        status, resp = s.post("/v1/chat/completions", {"messages": body["messages"], "max_tokens": 12, "temperature": 0})
        self.assertEqual(status, 200, resp)
        self.assertEqual(resp["usage"]["completion_tokens"], 12)
        msg = resp["choices"][0]["message"]
        self.assertGreater(len(msg["content"]) + len(msg.get("reasoning_content", "")), 0)

if __name__ == "__main__":
    unittest.main()
