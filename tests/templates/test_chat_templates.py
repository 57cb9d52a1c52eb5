"""bmoe's Jinja engine renders the models' real chat templates exactly as @huggingface/jinja does
(the renderer behind transformers.js' apply_chat_template), on every conversation in templates.py:
same text where the reference renders, an error where the reference raises."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

from templates import ROOT, conversations, load_templates

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "conformance"))
from common import bmoe_tokenize, oracle as llama_oracle, synth  # noqa: E402

BUILD = os.environ.get("BMOE_BUILD", os.path.join(ROOT, "build"))
TEMPLATE_TOOL = os.path.join(BUILD, "tools", "bmoe-template")


def oracle(templates, contexts):
    payload = json.dumps({"templates": templates, "contexts": contexts})
    r = subprocess.run(["node", os.path.join(os.path.dirname(__file__), "render_oracle.mjs")], input=payload,
                       capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(r.stdout)


def model_templates(models):
    """The chat templates the GGUF files hold, read by node-llama-cpp's GGUF reader (one process)."""
    r = subprocess.run(["node", os.path.join(os.path.dirname(__file__), "model_template.mjs"), *models],
                       capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(r.stdout)


def ours(source, contexts):
    with tempfile.TemporaryDirectory() as tmp:
        tpath, cpath = os.path.join(tmp, "t.jinja"), os.path.join(tmp, "c.json")
        with open(tpath, "w") as f:
            f.write(source)
        with open(cpath, "w") as f:
            json.dump(contexts, f)
        r = subprocess.run([TEMPLATE_TOOL, "-t", tpath, "--json", cpath], capture_output=True, text=True)
    if r.returncode != 0:
        return [{"error": r.stderr.strip()}] * len(contexts)
    return json.loads(r.stdout)


class ChatTemplateTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.templates = load_templates()
        cls.cases = conversations()
        cls.expected = oracle(cls.templates, [ctx for _, ctx in cls.cases])

    def test_every_template_renders_like_the_reference(self):
        rendered_somewhere = 0
        for name, source in self.templates.items():
            got = ours(source, [ctx for _, ctx in self.cases])
            for (label, _), want, have in zip(self.cases, self.expected[name], got):
                with self.subTest(template=name, conversation=label):
                    if isinstance(want, dict):
                        self.assertIsInstance(have, dict, f"the reference raised ({want['error']}), bmoe rendered")
                    else:
                        rendered_somewhere += 1
                        self.assertEqual(have, want, f"{name}/{label}")
        # The comparison means something only if most cases render.
        self.assertGreater(rendered_somewhere, len(self.templates) * len(self.cases) // 2)

    def test_the_conversations_reach_the_templates_features(self):
        # The tool and thinking cases change what the qwen3 template renders (tools block,
        # empty think block, reasoning dropped from history), so they exercise those paths.
        labels = [label for label, _ in self.cases]
        qwen = dict(zip(labels, self.expected["qwen3"]))
        self.assertIn("<tools>", qwen["tools"])
        self.assertIn("<think>\n\n</think>", qwen["thinking-off"])
        self.assertIn("<tool_response>", qwen["tool-call"])
        self.assertNotIn("Easy one", qwen["reasoning-content"])  # history's reasoning is dropped
        self.assertIn("<|channel|>commentary", self.expected["gpt-oss"][labels.index("tool-call")])
        # GLM-4.6: the thinking switch (/nothink and a closed think block) and its XML tool calls.
        glm = dict(zip(labels, self.expected["glm-4.6"]))
        self.assertTrue(glm["thinking-off"].endswith("/nothink<|assistant|>\n<think></think>"))
        self.assertTrue(glm["user"].endswith("<|assistant|>"))
        self.assertIn("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>", glm["tool-call"])
        # DeepSeek-V4: the thinking switch (enable_thinking opens or closes the think block) and its
        # DSML tool calls.
        ds = dict(zip(labels, self.expected["deepseek-v4"]))
        self.assertTrue(ds["thinking-on"].endswith("<\uff5cAssistant\uff5c><think>"))
        self.assertTrue(ds["thinking-off"].endswith("<\uff5cAssistant\uff5c></think>"))
        self.assertIn("<\uff5cDSML\uff5cparameter name=\"city\" string=\"true\">Paris</\uff5cDSML\uff5cparameter>",
                      ds["tool-call"])


class SynthesizedTemplateTest(unittest.TestCase):
    """The chat templates bmoe-synth writes render as the reference renders them (DeepSeek-V4's on
    DeepSeek's vocabulary keeps the thinking switch and the DSML tool calls bmoe's tool-call
    parser reads back), and on real vocabularies they are the models' own."""

    def render_file_template(self, model):
        """The template the file holds, rendered by bmoe and by the reference on every
        conversation: the same text, or an error on both sides. bmoe's renderings by label."""
        source = model_templates([model])[0]
        cases = conversations()
        want = oracle({"t": source}, [ctx for _, ctx in cases])["t"]
        have = ours(source, [ctx for _, ctx in cases])
        for (label, _), w, h in zip(cases, want, have):
            with self.subTest(conversation=label):
                if isinstance(w, dict):  # the reference raised (string arguments: no from_json filter there)
                    self.assertIsInstance(h, dict, f"the reference raised ({w['error']}), bmoe rendered")
                else:
                    self.assertEqual(h, w)
        return dict(zip([label for label, _ in cases], have))

    def test_deepseek4_template(self):
        got = self.render_file_template(
            synth("templates-tiny-deepseek4-deepseek_v3", "tiny-deepseek4", "--vocab", "deepseek_v3"))
        self.assertTrue(got["thinking-on"].endswith("<\uff5cAssistant\uff5c><think>"))
        self.assertTrue(got["thinking-off"].endswith("<\uff5cAssistant\uff5c></think>"))
        self.assertIn("<\uff5cDSML\uff5cparameter name=\"days\" string=\"false\">2</\uff5cDSML\uff5cparameter>",
                      got["tool-call"])

    def test_ling_template(self):
        # Ling 3.0's thinking switch: on unless enable_thinking is false; reasoning kept in history.
        got = self.render_file_template(synth("templates-tiny-bailingmoe3", "tiny-bailingmoe3"))
        self.assertTrue(got["thinking-on"].endswith("<role>ASSISTANT</role>\n<think>"))
        self.assertTrue(got["user"].endswith("<role>ASSISTANT</role>\n<think>"))
        self.assertTrue(got["thinking-off"].endswith("<role>ASSISTANT</role>\n<think></think>"))
        self.assertIn("<role>ASSISTANT</role>\n<think>\nEasy.\n</think>\n\nParis.<|role_end|>", got["thinking-history"])
        self.assertIn("<role>ASSISTANT</role>\n<think>\nEasy one.\n</think>\n\nParis.<|role_end|>",
                      got["reasoning-content"])
        self.assertIn("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>", got["tool-call"])

    def test_real_shape_presets_write_the_models_templates(self):
        # On the real vocabularies (as qwen3.6-35b-a3b, gpt-oss-20b/120b, gemma-4-26b-a4b, qwen3-30b-a3b,
        # deepseek-v4-flash and lfm2-8b-a1b write them; tiny shapes keep the files small) bmoe-synth writes the
        # real template, byte for byte the one test_every_template_renders_like_the_reference checks.
        templates = load_templates()
        cases = [("tiny-qwen35moe", "qwen3", "qwen3.5"), ("tiny-gpt-oss", "gptoss", "gpt-oss"),
                 ("tiny-gemma4", "gemma", "gemma4"), ("tiny-qwen3moe", "qwen3", "qwen3"),
                 ("tiny-deepseek4", "deepseek_v3", "deepseek-v4"), ("tiny-lfm2moe", "llama3", "lfm2")]
        models = [synth(f"templates-{preset}-{vocab}", preset, "--vocab", vocab) for preset, vocab, _ in cases]
        for (preset, vocab, name), source in zip(cases, model_templates(models)):
            with self.subTest(preset=preset, vocab=vocab):
                self.assertEqual(source, templates[name])


class RenderedPromptTokensTest(unittest.TestCase):
    """The prompts bmoe renders from real templates tokenize to llama.cpp's ids: the rendered
    text's special tokens (<|im_start|>, <|start|>, <|start_header_id|>, ...) are recognised the
    same way on both sides, for the vocabulary each template belongs to."""

    PAIRS = [("qwen3", "qwen3", "tiny-qwen3moe"), ("qwen3.5", "qwen3", "tiny-qwen3moe"),
             ("gpt-oss", "gptoss", "tiny-gpt-oss"), ("llama3_1", "llama3", "tiny-mixtral"),
             ("llama3.1-tools", "llama3", "tiny-mixtral"), ("glm-4.6", "tiny", "tiny-glm4moe"),
             ("glm-4.7-flash", "tiny", "tiny-glm4moe"), ("deepseek_v3", "deepseek_v3", "tiny-deepseek4"),
             ("deepseek-v4", "deepseek_v3", "tiny-deepseek4")]

    def test_rendered_prompts_tokenize_like_llama_cpp(self):
        templates = load_templates()
        cases = conversations()
        # One tokenizer run per model on each side (a peer process loads its model once), for
        # all the templates written in that model's vocabulary.
        by_model = {}
        for name, vocab, preset in self.PAIRS:
            texts = [t for t in ours(templates[name], [ctx for _, ctx in cases]) if isinstance(t, str)]
            by_model.setdefault((preset, vocab), []).extend((name, t) for t in texts)
        checked = 0
        models = {key: synth(f"templates-{key[0]}-{key[1]}", key[0], "--vocab", key[1]) for key in by_model}
        # llama.cpp tokenizes for every model in one process.
        theirs_all = llama_oracle("tokenize-models", "-", [{"model": models[key], "texts": [t for _, t in named]}
                                                            for key, named in by_model.items()])
        for ((preset, vocab), named), theirs in zip(by_model.items(), theirs_all):
            mine = bmoe_tokenize(models[(preset, vocab)], [t for _, t in named])
            for (name, text), a, b in zip(named, mine, theirs):
                with self.subTest(template=name, text=text[:60]):
                    self.assertEqual(a, b)
                    checked += 1
        self.assertGreater(checked, 30)

if __name__ == "__main__":
    unittest.main()
