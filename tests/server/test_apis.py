"""bmoe-server's other APIs and llama-server's own request fields, over HTTP.

llama-server's fields: every one at its default value is a 200, the samplers change the
answer as they should (a `samplers` chain of top-k 1 is greedy at any temperature), n_predict
limits like max_tokens, vLLM's repetition_penalty is the repeat penalty, /v1/completions
answers one choice per prompt of a list. The other APIs over plain HTTP: the API key as
Anthropic's x-api-key, each API's error shape, count_tokens, store false.
"""
import json
import math
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from test_server import Server  # noqa: E402
from common import synth  # noqa: E402
from templates import load_templates  # noqa: E402

# Every llama-server field at the value its server uses when the field is absent.
LLAMA_DEFAULTS = {
    "n_predict": -1, "n_probs": 0, "n_keep": 0, "typical_p": 1.0, "mirostat": 0, "mirostat_tau": 5.0,
    "mirostat_eta": 0.1, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "top_n_sigma": -1.0,
    "xtc_probability": 0.0, "xtc_threshold": 0.1, "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2,
    "dry_penalty_last_n": -1, "dry_sequence_breakers": ["\n", ":", "\"", "*"], "min_keep": 0,
    "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
    "reasoning_format": "deepseek", "reasoning_budget_tokens": -1, "continue_final_message": False,
    "return_tokens": False, "post_sampling_probs": False, "timings_per_token": False, "t_max_predict_ms": -1,
    "repetition_penalty": 1.0, "repeat_penalty": 1.0, "repeat_last_n": 64, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
    "temperature": 0.8, "ignore_eos": False, "cache_prompt": True,
}


class LlamaFieldsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(synth("tiny-qwen3moe", "tiny-qwen3moe"), "-c", "512")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def chat(self, **fields):
        body = {"messages": [{"role": "user", "content": "Count with me"}], "max_tokens": 12, **fields}
        return self.server.post("/v1/chat/completions", body)

    def complete(self, **fields):
        return self.server.post("/v1/completions", {"prompt": "One two three", "max_tokens": 12, **fields})

    def test_every_field_at_its_default_is_accepted(self):
        for name, send in (("chat", self.chat), ("completions", self.complete)):
            status, resp = send(seed=3, **LLAMA_DEFAULTS)
            self.assertEqual(status, 200, (name, resp))

    def test_samplers_chain_of_top_k_one_is_greedy(self):
        _, greedy = self.complete(temperature=0)
        for seed in (1, 2, 3):
            status, resp = self.complete(temperature=1.5, top_k=1, samplers=["top_k", "temperature"], seed=seed)
            self.assertEqual(status, 200, resp)
            self.assertEqual(resp["choices"][0]["text"], greedy["choices"][0]["text"])
            _, letters = self.complete(temperature=1.5, top_k=1, samplers="kt", seed=seed)
            self.assertEqual(letters["choices"][0]["text"], greedy["choices"][0]["text"])

    def test_new_samplers_are_seeded_and_change_draws(self):
        settings = [{"mirostat": 1}, {"mirostat": 2, "mirostat_tau": 3}, {"typical_p": 0.5}, {"top_n_sigma": 1.0},
                    {"xtc_probability": 1.0, "xtc_threshold": 0.01}, {"dynatemp_range": 0.5},
                    {"dry_multiplier": 0.8, "dry_allowed_length": 1}]
        for s in settings:
            fields = {"temperature": 1.0, "seed": 9, "ignore_eos": True, **s}
            first, second = self.complete(**fields), self.complete(**fields)
            self.assertEqual(first[0], 200, (s, first[1]))
            self.assertEqual(first[1]["choices"][0]["text"], second[1]["choices"][0]["text"], s)
            self.assertEqual(first[1]["usage"]["completion_tokens"], 12, s)

    def test_unknown_sampler_is_a_400_naming_the_field(self):
        status, resp = self.complete(samplers=["beam"])
        self.assertEqual(status, 400)
        self.assertEqual(resp["error"]["param"], "samplers")

    def test_n_predict_limits_and_repetition_penalty_is_the_repeat_penalty(self):
        status, resp = self.server.post("/v1/completions", {"prompt": "One", "n_predict": 5, "ignore_eos": True})
        self.assertEqual(status, 200, resp)
        self.assertEqual(resp["usage"]["completion_tokens"], 5)
        # Greedy over 48 tokens repeats some: a penalty of 10 over all of them changes the answer.
        long = {"temperature": 0, "max_tokens": 48, "ignore_eos": True, "repeat_last_n": -1}
        _, vllm = self.complete(repetition_penalty=10, **long)
        _, llama = self.complete(repeat_penalty=10, **long)
        _, plain = self.complete(**long)
        self.assertEqual(vllm["choices"][0]["text"], llama["choices"][0]["text"])
        self.assertNotEqual(vllm["choices"][0]["text"], plain["choices"][0]["text"])

    def test_list_of_prompts_answers_one_choice_per_prompt(self):
        prompts = ["One two three", "The sky is"]
        singles = [self.server.post("/v1/completions", {"prompt": p, "max_tokens": 8, "temperature": 0})[1] for p in prompts]
        status, resp = self.server.post("/v1/completions", {"prompt": prompts, "max_tokens": 8, "temperature": 0, "n": 2})
        self.assertEqual(status, 200, resp)
        self.assertEqual([c["index"] for c in resp["choices"]], [0, 1, 2, 3])
        texts = [c["text"] for c in resp["choices"]]
        self.assertEqual(texts, [singles[0]["choices"][0]["text"]] * 2 + [singles[1]["choices"][0]["text"]] * 2)
        self.assertEqual(resp["usage"]["prompt_tokens"], sum(s["usage"]["prompt_tokens"] for s in singles))
        events = self.server.stream("/v1/completions", {"prompt": prompts, "max_tokens": 8, "temperature": 0})
        streamed = {}
        for e in events[:-1]:
            for c in e.get("choices", []):
                streamed[c["index"]] = streamed.get(c["index"], "") + c["text"]
        self.assertEqual(streamed, {0: texts[0], 1: texts[2]})

    def test_return_tokens_n_probs_and_reasoning_fields(self):
        status, resp = self.complete(temperature=0, return_tokens=True, n_probs=2)
        self.assertEqual(status, 200, resp)
        choice = resp["choices"][0]
        self.assertEqual(len(choice["tokens"]), resp["usage"]["completion_tokens"])
        self.assertEqual(len(choice["logprobs"]["top_logprobs"][0]), 2)
        self.assertEqual(self.chat(reasoning_budget_tokens=0, reasoning_format="none")[0], 200)
        for field, value in (("reasoning_budget_tokens", -2), ("reasoning_format", "x")):
            status, resp = self.chat(**{field: value})
            self.assertEqual((status, resp["error"]["param"]), (400, field))

    def test_post_sampling_probs_are_the_chains_distribution(self):
        # The same seeded draw reported both ways. Top-k 2 at temperature 0.7 leaves the two most
        # likely tokens in the ratio exp((l0 - l1) / 0.7), l the raw log-probabilities llama-server
        # reports without the field: each step's post-sampling pair must be that, and sum to 1.
        fields = {"prompt": "One two three", "n_predict": 8, "n_probs": 2, "temperature": 0.7, "top_k": 2,
                  "top_p": 1.0, "min_p": 0.0, "seed": 5, "ignore_eos": True}
        status, raw = self.server.post("/completion", fields)
        self.assertEqual(status, 200, raw)
        status, post = self.server.post("/completion", {**fields, "post_sampling_probs": True})
        self.assertEqual(status, 200, post)
        raw_steps, post_steps = raw["completion_probabilities"], post["completion_probabilities"]
        self.assertEqual(len(post_steps), 8)
        self.assertEqual([s["id"] for s in post_steps], [s["id"] for s in raw_steps])  # reporting changes no draw
        for r, p in zip(raw_steps, post_steps):
            self.assertNotIn("logprob", p)
            tops = p["top_probs"]
            self.assertEqual([t["id"] for t in tops], [t["id"] for t in r["top_logprobs"]])
            l0, l1 = (t["logprob"] for t in r["top_logprobs"])
            self.assertAlmostEqual(tops[0]["prob"], 1 / (1 + math.exp((l1 - l0) / 0.7)), places=4)
            self.assertAlmostEqual(tops[0]["prob"] + tops[1]["prob"], 1.0, places=5)
            self.assertEqual(p["prob"], next(t["prob"] for t in tops if t["id"] == p["id"]))
            self.assertEqual(p["token"], r["token"])
            self.assertEqual(p["bytes"], r["bytes"])
        # Streamed, each piece carries its tokens' probabilities: the same list in all.
        events = self.server.stream("/completion", {**fields, "post_sampling_probs": True})
        self.assertTrue(events[-1]["stop"])
        streamed = [s for e in events for s in e.get("completion_probabilities", [])]
        self.assertEqual([s["id"] for s in streamed], [s["id"] for s in post_steps])
        for s, p in zip(streamed, post_steps):
            self.assertAlmostEqual(s["prob"], p["prob"], places=5)

    def test_post_sampling_probs_greedy_and_openai_endpoints(self):
        # Greedy leaves the pick alone at probability 1, as llama.cpp's temperature 0; the OpenAI
        # endpoints carry llama-server's list in logprobs.content.
        status, resp = self.complete(temperature=0, logprobs=3, post_sampling_probs=True)
        self.assertEqual(status, 200, resp)
        steps = resp["choices"][0]["logprobs"]["content"]
        self.assertEqual(len(steps), resp["usage"]["completion_tokens"])
        for s in steps:
            self.assertEqual(s["prob"], 1.0)
            self.assertEqual(s["top_probs"], [{"id": s["id"], "token": s["token"], "bytes": s["bytes"], "prob": 1.0}])
        status, resp = self.chat(temperature=0.9, top_k=3, seed=2, logprobs=True, top_logprobs=5,
                                 post_sampling_probs=True)
        self.assertEqual(status, 200, resp)
        for s in resp["choices"][0]["logprobs"]["content"]:
            self.assertLessEqual(len(s["top_probs"]), 3)  # top-k 3 leaves three at most
            self.assertAlmostEqual(sum(t["prob"] for t in s["top_probs"]), 1.0, places=5)
            self.assertGreater(s["prob"], 0.0)

    def test_t_max_predict_ms_ends_at_a_line_break_past_the_limit(self):
        # A bias on the newline makes line breaks common; greedy, so both answers share a start.
        fields = {"temperature": 0, "max_tokens": 64, "ignore_eos": True, "logit_bias": [["\n", 4]]}
        _, free = self.complete(**fields)
        text = free["choices"][0]["text"]
        self.assertIn("\n", text[:-1])  # the check below needs a line break before the end
        status, limited = self.complete(t_max_predict_ms=1, **fields)
        self.assertEqual(status, 200, limited)
        cut = limited["choices"][0]["text"]
        self.assertTrue(text.startswith(cut))
        self.assertIn("\n", cut)
        self.assertLess(len(cut), len(text))
        self.assertEqual(limited["choices"][0]["finish_reason"], "stop")

    def test_llama_cpp_web_ui_request_streams_progress_and_timings(self):
        # The fields llama.cpp's own web UI sends with every chat request (tools/ui's chat
        # service): prompt progress events, timings in every chunk, pings, its reasoning switches.
        body = {"messages": [{"role": "user", "content": "Count with me, one two three four"}], "max_tokens": 8,
                "ignore_eos": True, "return_progress": True, "sse_ping_interval": 1, "reasoning_format": "auto",
                "reasoning_control": True, "timings_per_token": True, "backend_sampling": False,
                "thinking_budget_tokens": -1, "chat_template_kwargs": {"enable_thinking": True}}
        events = self.server.stream("/v1/chat/completions", body)
        self.assertEqual(events[-1], "[DONE]")
        end = events[-2]
        progress = [e["prompt_progress"] for e in events[:-1] if "prompt_progress" in e]
        self.assertTrue(progress, events[:3])
        total = end["usage"]["prompt_tokens"]
        self.assertEqual({p["total"] for p in progress}, {total})
        self.assertEqual(progress[-1]["processed"], total)
        self.assertEqual([p["processed"] for p in progress], sorted(p["processed"] for p in progress))
        first_text = next(i for i, e in enumerate(events[:-1]) if e["choices"] and e["choices"][0]["delta"].get("content"))
        self.assertLess(events.index(next(e for e in events if "prompt_progress" in e)), first_text)
        timed = [e["timings"] for e in events[first_text:-2] if "timings" in e]
        self.assertTrue(timed, events)
        counts = [t["predicted_n"] for t in timed]
        self.assertEqual(counts, sorted(counts))
        self.assertGreaterEqual(counts[0], 1)
        self.assertLessEqual(counts[-1], end["timings"]["predicted_n"])
        self.assertEqual(end["timings"]["predicted_n"], 8)
        self.assertTrue(all(t["prompt_n"] == timed[0]["prompt_n"] for t in timed))
        # Without the fields: neither progress nor per-chunk timings.
        plain = self.server.stream("/v1/chat/completions", {k: body[k] for k in ("messages", "max_tokens")})
        self.assertFalse([e for e in plain[:-2] if "prompt_progress" in e or "timings" in e])
        for field, value in (("sse_ping_interval", "x"), ("thinking_budget_tokens", -3), ("return_progress", 3)):
            status, resp = self.chat(**{field: value})
            self.assertEqual((status, resp["error"]["param"]), (400, field))

    def test_add_generation_prompt_n_cmpl_and_the_other_fields_at_their_defaults(self):
        # llama-server's remaining request fields (tools/server/server-schema.cpp) at the values
        # it uses when they are absent.
        rest = {"verbose": False, "n_indent": 0, "n_discard": 0, "n_cache_reuse": 0, "t_max_prompt_ms": -1,
                "response_fields": [], "lora": [], "adaptive_target": -1.0, "adaptive_decay": 0.9, "n_cmpl": 1,
                "reasoning_budget_message": "", "add_generation_prompt": True}
        for send in (self.chat, self.complete):
            status, resp = send(**rest)
            self.assertEqual(status, 200, resp)
        # add_generation_prompt false: the template's assistant header is left out.
        _, header = self.chat(max_tokens=1)
        status, bare = self.chat(max_tokens=1, add_generation_prompt=False)
        self.assertEqual(status, 200, bare)
        self.assertLess(bare["usage"]["prompt_tokens"], header["usage"]["prompt_tokens"])
        # llama.cpp's web UI continues an answer with both fields.
        messages = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "One two"}]
        _, alone = self.server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 2, "continue_final_message": True})
        status, both = self.server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 2, "continue_final_message": True,
                                                                 "add_generation_prompt": False})
        self.assertEqual(status, 200, both)
        self.assertEqual(both["usage"]["prompt_tokens"], alone["usage"]["prompt_tokens"])
        # n_cmpl is n.
        status, resp = self.complete(n_cmpl=2, temperature=0)
        self.assertEqual((status, len(resp["choices"])), (200, 2), resp)
        for field, value in (("verbose", True), ("n_indent", 2), ("lora", [{"id": 0, "scale": 1}]), ("adaptive_target", 0.5),
                             ("response_fields", ["content"]), ("add_generation_prompt", "no"), ("n_cmpl", 0)):
            status, resp = self.chat(**{field: value})
            self.assertEqual((status, resp["error"]["param"]), (400, field))

    def test_native_completion_endpoint(self):
        # llama-server's own POST /completion: the answer in `content`, its counts and timings;
        # streamed, one object per piece and a last one with stop true (no [DONE]).
        _, oai = self.complete(temperature=0, max_tokens=10, ignore_eos=True)
        status, resp = self.server.post("/completion", {"prompt": "One two three", "n_predict": 10, "temperature": 0,
                                                       "ignore_eos": True, "return_tokens": True})
        self.assertEqual(status, 200, resp)
        self.assertEqual(resp["content"], oai["choices"][0]["text"])
        self.assertTrue(resp["stop"])
        self.assertEqual((resp["tokens_predicted"], resp["stop_type"]), (10, "limit"))
        self.assertEqual(len(resp["tokens"]), 10)
        self.assertEqual(resp["tokens_evaluated"], oai["usage"]["prompt_tokens"])
        self.assertEqual(resp["timings"]["predicted_n"], 10)
        status, text = self.server.request("POST", "/completion", {"prompt": "One two three", "n_predict": 10,
                                                                  "temperature": 0, "ignore_eos": True, "stream": True})
        self.assertEqual(status, 200, text)
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
        self.assertNotIn("[DONE]", text)
        self.assertTrue(all(not e["stop"] for e in events[:-1]))
        self.assertTrue(events[-1]["stop"])
        self.assertEqual(events[-1]["tokens_predicted"], 10)
        self.assertEqual("".join(e["content"] for e in events), resp["content"])  # the last one carries none
        # A stop word: stop_type "word", the word named and left out.
        word = resp["content"].split()[1] if len(resp["content"].split()) > 1 else resp["content"][2:4]
        _, cut = self.server.post("/completion", {"prompt": "One two three", "n_predict": 10, "temperature": 0,
                                                 "ignore_eos": True, "stop": [word]})
        self.assertEqual((cut["stop_type"], cut["stopping_word"]), ("word", word), (word, cut))
        self.assertTrue(resp["content"].startswith(cut["content"]))
        status, resp = self.server.post("/completion", {"prompt": "x", "bogus": 1})
        self.assertEqual((status, resp["error"]["param"]), (400, "bogus"))
        self.assertEqual(self.server.get("/completion")[0], 405)

    def test_continue_final_message_goes_on_from_the_assistant_text(self):
        messages = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "One two"}]
        status, resp = self.server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 4,
                                                                 "continue_final_message": True})
        self.assertEqual(status, 200, resp)
        _, fresh = self.server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 4})
        # No end of turn and no new assistant header: the prompt is shorter.
        self.assertLess(resp["usage"]["prompt_tokens"], fresh["usage"]["prompt_tokens"])
        status, resp = self.server.post("/v1/chat/completions", {"messages": messages[:1], "continue_final_message": True})
        self.assertEqual((status, resp["error"]["param"]), (400, "continue_final_message"))


class ReasoningBudgetTest(unittest.TestCase):
    """llama-server's reasoning_budget_tokens > 0 on Qwen3.5's template (its generation prompt
    opens the think block): after that many reasoning tokens the close tag is forced and the
    answer goes on as content."""

    @classmethod
    def setUpClass(cls):
        cls.template_dir = tempfile.TemporaryDirectory()
        path = os.path.join(cls.template_dir.name, "qwen3.5.jinja")
        with open(path, "w") as f:
            f.write(load_templates()["qwen3.5"])
        model = synth("tiny-qwen3moe-qwen3", "tiny-qwen3moe", "--vocab", "qwen3")
        cls.server = Server(model, "-c", "1024", "--chat-template-file", path)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.template_dir.cleanup()

    def chat(self, **fields):
        body = {"messages": [{"role": "user", "content": "Think, then answer"}], "max_tokens": 24, "temperature": 0,
                "ignore_eos": True, "return_tokens": True, **fields}
        return self.server.post("/v1/chat/completions", body)

    def test_the_close_tag_is_forced_after_the_budget(self):
        _, close = self.server.post("/tokenize", {"content": "</think>"})
        _, free = self.chat()
        free_tokens = free["choices"][0]["tokens"]
        self.assertNotIn(close["tokens"][0], free_tokens)  # greedy, this model never ends its reasoning
        self.assertFalse(free["choices"][0]["message"].get("content"), free)
        for name in ("reasoning_budget_tokens", "thinking_budget_tokens"):
            status, resp = self.chat(**{name: 5})
            self.assertEqual(status, 200, resp)
            choice = resp["choices"][0]
            tokens = choice["tokens"]
            self.assertEqual(tokens[:5], free_tokens[:5])  # the reasoning as it was, cut at 5
            self.assertEqual(tokens[5:5 + len(close["tokens"])], close["tokens"])
            self.assertEqual(resp["usage"]["completion_tokens"], 24)
            self.assertEqual(len(tokens), 24)
            self.assertTrue(choice["message"]["reasoning_content"], choice)
            self.assertTrue(choice["message"]["content"], choice)
        # Streamed: the same split.
        events = self.server.stream("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Think, then answer"}], "max_tokens": 24, "temperature": 0,
            "ignore_eos": True, "reasoning_budget_tokens": 5})
        deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
        self.assertEqual("".join(d.get("content") or "" for d in deltas), choice["message"]["content"])
        self.assertEqual("".join(d.get("reasoning_content") or "" for d in deltas), choice["message"]["reasoning_content"])
        # llama-server's reasoning_budget_message goes before the close tag.
        _, told = self.chat(reasoning_budget_tokens=5, reasoning_budget_message=" Time is up.")
        self.assertTrue(told["choices"][0]["message"]["reasoning_content"].rstrip().endswith("Time is up."), told)
        self.assertEqual(told["choices"][0]["tokens"][:5], free_tokens[:5])
        # A budget larger than the answer changes nothing; log-probabilities with a budget are refused.
        _, roomy = self.chat(reasoning_budget_tokens=100)
        self.assertEqual(roomy["choices"][0]["tokens"], free_tokens)
        status, resp = self.chat(reasoning_budget_tokens=5, logprobs=True)
        self.assertEqual((status, resp["error"]["param"]), (400, "reasoning_budget_tokens"))


class OtherApisHttpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(synth("tiny-qwen3moe", "tiny-qwen3moe"), "-c", "512", "--api-key", "k")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def post(self, path, body, key="k", header="Authorization"):
        value = f"Bearer {key}" if header == "Authorization" else key
        return self.server.post(path, body, headers={header: value})

    def test_api_key_and_error_shapes(self):
        ask = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
        status, resp = self.post("/v1/messages", ask, header="x-api-key")
        self.assertEqual((status, resp["type"]), (200, "message"), resp)
        status, resp = self.post("/v1/messages", ask, key="wrong", header="x-api-key")
        self.assertEqual(status, 401)
        self.assertEqual(resp, {"type": "error", "error": {"type": "authentication_error", "message": resp["error"]["message"]}})
        status, resp = self.post("/v1/messages", {**ask, "temperature": 1.5})  # Anthropic's range is 0..1
        self.assertEqual((status, resp["error"]["type"]), (400, "invalid_request_error"))
        status, resp = self.post("/v1/responses", {"model": "m", "input": "Hi", "bogus": 1})
        self.assertEqual((status, resp["error"]["param"]), (400, "bogus"))  # OpenAI's shape

    def test_llama_server_paths_without_v1(self):
        # llama-server also answers the OpenAI routes without "/v1" (a client whose base URL
        # lacks it), /models and /v1/health.
        ask = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
        _, want = self.post("/v1/chat/completions", ask)
        status, got = self.post("/chat/completions", ask)
        self.assertEqual(status, 200, got)
        self.assertEqual(got["choices"][0]["message"], want["choices"][0]["message"])
        status, resp = self.post("/responses", {"model": "m", "input": "Hi", "max_output_tokens": 2})
        self.assertEqual((status, resp["object"]), (200, "response"), resp)
        status, text = self.server.get("/models", headers={"Authorization": "Bearer k"})
        self.assertEqual(status, 200, text)
        self.assertEqual(json.loads(text)["data"][0]["object"], "model")
        self.assertEqual(self.server.get("/v1/health")[0], 200)
        self.assertEqual(self.server.get("/chat/completions")[0], 405)
        self.assertEqual(self.post("/chat/completions", ask, key="wrong")[0], 401)

    def test_responses_input_tokens_equals_usage(self):
        # OpenAI's POST /v1/responses/input_tokens (client.responses.inputTokens.count()).
        ask = {"model": "m", "instructions": "Be brief", "input": [{"role": "user", "content": "Hi there"}]}
        status, counted = self.post("/v1/responses/input_tokens", ask)
        self.assertEqual(status, 200, counted)
        self.assertEqual(counted["object"], "response.input_tokens")
        _, resp = self.post("/v1/responses", {**ask, "max_output_tokens": 2})
        self.assertEqual(counted["input_tokens"], resp["usage"]["input_tokens"])
        status, resp = self.post("/v1/responses/input_tokens", {**ask, "bogus": 1})
        self.assertEqual((status, resp["error"]["param"]), (400, "bogus"))

    def test_count_tokens_equals_usage(self):
        ask = {"model": "m", "system": "Be brief", "messages": [{"role": "user", "content": "Hi there"}]}
        status, counted = self.post("/v1/messages/count_tokens", ask)
        self.assertEqual(status, 200, counted)
        _, resp = self.post("/v1/messages", {**ask, "max_tokens": 2})
        self.assertEqual(counted["input_tokens"], resp["usage"]["input_tokens"])

    def events(self, path, body):
        status, text = self.server.request("POST", path, {**body, "stream": True}, headers={"Authorization": "Bearer k"})
        self.assertEqual(status, 200, text)
        return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]

    @staticmethod
    def runs(types):
        # The sequence with repeats folded: deltas (and keep-alive pings) are many, their place one.
        out = []
        for t in types:
            if t != "ping" and (not out or out[-1] != t):
                out.append(t)
        return out

    def test_streams_send_their_events_in_the_documented_order(self):
        # OpenAI's Responses: created, in_progress, the message item and its part opened, text
        # deltas, then everything closed in reverse and completed (or incomplete at the limit);
        # sequence_number counts every event from 0.
        events = self.events("/v1/responses", {"model": "m", "input": "Hi", "max_output_tokens": 6, "temperature": 0})
        self.assertEqual([e["sequence_number"] for e in events], list(range(len(events))))
        self.assertIn("response.output_text.delta", [e["type"] for e in events])  # greedy here writes text
        self.assertEqual(self.runs(e["type"] for e in events), [
            "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
            "response.output_text.delta", "response.output_text.done", "response.content_part.done",
            "response.output_item.done", events[-1]["type"]])
        self.assertIn(events[-1]["type"], ("response.completed", "response.incomplete"))
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        self.assertEqual(events[-1]["response"]["output"][-1]["content"][0]["text"], text)
        # Anthropic's Messages: message_start, a text block opened, its deltas, closed, then
        # message_delta (stop_reason, usage) and message_stop.
        events = self.events("/v1/messages", {"model": "m", "max_tokens": 6, "temperature": 0,
                                              "messages": [{"role": "user", "content": "Hi"}]})
        self.assertEqual(self.runs(e["type"] for e in events), [
            "message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
            "message_stop"])
        self.assertIn(events[-2]["delta"]["stop_reason"], ("end_turn", "max_tokens"))

    def test_store_false_is_not_kept_and_embeddings_answer(self):
        status, resp = self.post("/v1/responses", {"model": "m", "input": "Hi", "max_output_tokens": 2, "store": False})
        self.assertEqual(status, 200, resp)
        status, resp = self.post("/v1/responses", {"model": "m", "input": "More", "previous_response_id": resp["id"]})
        self.assertEqual((status, resp["error"]["code"]), (404, "previous_response_not_found"))
        status, resp = self.post("/v1/embeddings", {"input": ["a", "b"]})
        self.assertEqual(status, 200, resp)
        self.assertEqual([d["index"] for d in resp["data"]], [0, 1])


if __name__ == "__main__":
    unittest.main()
