"""bmoe-server's web chat page (GET /), driven in headless Chromium at a phone's width.

Chromium is controlled through the DevTools protocol over --remote-debugging-pipe (JSON
messages ended by a NUL byte on fds 3 and 4), which needs nothing beyond the standard library.
The page must load, send a message, show the answer growing while it streams, stop it with the
Stop button (the server then cancels the generation), keep conversations across a reload, show
reasoning apart from the answer, and work with an API key. Skipped only where Chromium is not
installed (Debian: apt-get install chromium).
"""
import http.client
import http.server
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from test_server import Server, synth  # noqa: E402

# The page as served: tools/web/index.html with marked and DOMPurify put inline at build time.
PAGE = os.path.join(os.environ.get("BMOE_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build")),
                    "tools", "generated", "index.html")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WIDTH, HEIGHT = 360, 740  # a small phone


class Chromium:
    """One headless Chromium with one page, at a phone's size."""

    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="bmoe-webui-")
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()
        os.set_inheritable(to_browser_r, True)
        os.set_inheritable(from_browser_w, True)
        # The shell puts the pipe ends on the fds the protocol uses (3: commands in, 4: out).
        args = " ".join([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                         "--disable-extensions", "--disable-background-networking", "--remote-debugging-pipe",
                         f"--user-data-dir={self.profile}", "about:blank"])
        self.proc = subprocess.Popen(["sh", "-c", f"exec {args} 3<&{to_browser_r} 4>&{from_browser_w}"],
                                     pass_fds=(to_browser_r, from_browser_w),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.buffer = b""
        self.next_id = 0
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 2, "mobile": True}, page=True)
        self.call("Page.enable", page=True)

    def call(self, method, params=None, page=False, timeout=30):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if page:
            message["sessionId"] = self.session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.time() + timeout
        while time.time() < deadline:
            while b"\0" not in self.buffer:
                # A page that stops answering fails the call at its deadline instead of
                # blocking the read (and the test) until CTest's timeout.
                if not select.select([self.from_browser], [], [], max(0.0, deadline - time.time()))[0]:
                    raise TimeoutError(f"{method}: no reply in {timeout} s")
                chunk = os.read(self.from_browser, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self.buffer += chunk
            raw, self.buffer = self.buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") != self.next_id:
                continue  # an event (none is needed: the page's state is read by polling)
            if "error" in reply:
                raise RuntimeError(f"{method}: {reply['error']}")
            return reply["result"]
        raise TimeoutError(method)

    def js(self, expression):
        """Evaluates in the page (awaiting a promise) and returns the value."""
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                      page=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def open(self, url):
        self.call("Page.navigate", {"url": url}, page=True)
        self.wait("document.readyState === 'complete' && !!document.querySelector('#send')", "the page loads")

    def reload(self):
        self.js("location.reload()")
        time.sleep(0.3)
        self.wait("document.readyState === 'complete' && !!document.querySelector('#send')", "the page reloads")

    def wait(self, expression, what, timeout=60):
        # Generous: a condition that holds returns at once, and a loaded machine is slow.
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting until {what} ({expression})")

    def click(self, selector):
        """A real mouse click at the element's centre: it fails if the element is hidden or covered."""
        box = self.js(f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                      f" return [r.x + r.width / 2, r.y + r.height / 2, r.width, r.height]; }})()")
        x, y, w, h = box
        if w <= 0 or h <= 0 or not (0 <= x < WIDTH and 0 <= y < HEIGHT):
            raise AssertionError(f"{selector} is not on screen: {box}")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
                      page=True)

    def type(self, selector, text):
        self.js(f"document.querySelector({json.dumps(selector)}).focus()")
        self.call("Input.insertText", {"text": text}, page=True)

    def set_field(self, selector, value):
        """Fills a settings field the way a user's edit ends: input, then change."""
        self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.value = {json.dumps(value)};"
                " e.dispatchEvent(new Event('input')); e.dispatchEvent(new Event('change')); })()")

    def text(self, selector):
        return self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                       " return e ? e.textContent : null; })()")

    def visible(self, selector):
        return self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                       " return !!e && e.getClientRects().length > 0; })()")

    def close(self):
        try:
            self.call("Browser.close", timeout=5)
        except (OSError, RuntimeError, TimeoutError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.to_browser)
        os.close(self.from_browser)
        shutil.rmtree(self.profile, ignore_errors=True)


LAST_ANSWER = ".msg.assistant:last-of-type .content"
LAST_META = ".msg.assistant:last-of-type .meta"


def ready(browser):
    """The composer is ready for the next message: Send shown, Stop hidden."""
    return browser.visible("#send") and not browser.visible("#stop")


class PageServedTest(unittest.TestCase):
    """GET / is the page from the source tree, self-contained, without the API key."""

    def test_page_is_served_without_the_key(self):
        model = synth("tiny-qwen3moe", "tiny-qwen3moe")
        server = Server(model, "-c", "256", "--api-key", "sekrit")
        try:
            status, body = server.get("/")
            self.assertEqual(status, 200)
            with open(PAGE, encoding="utf-8") as f:
                self.assertEqual(body, f.read())
            # The Markdown renderer and the sanitiser are inline, not fetched.
            self.assertIn("marked v", body)
            self.assertIn("DOMPurify", body)
            self.assertNotIn("<!--vendor:", body)
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            conn.request("GET", "/")
            resp = conn.getresponse()
            resp.read()
            self.assertEqual(resp.getheader("Content-Type"), "text/html; charset=utf-8")
            conn.close()
            # Nothing fetched from elsewhere: a phone may have no internet, only the server.
            self.assertIsNone(re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", body), "the page loads an external URL")
            self.assertNotIn("@import", body)
            # The data endpoints stay behind the key.
            self.assertEqual(server.get("/stats")[0], 401)
        finally:
            server.stop()
            server.log.close()


@unittest.skipUnless(CHROMIUM, "chromium is not installed (Debian: apt-get install chromium)")
class WebChatTest(unittest.TestCase):
    """The page against a real bmoe-server on a tiny model."""

    @classmethod
    def setUpClass(cls):
        cls.model = synth("tiny-qwen3moe", "tiny-qwen3moe")
        # An answer with no token limit that cannot end by itself (--ignore-eos, a long context)
        # streams far longer than the test waits: sampled, the tiny model ended 3 answers in 8
        # with its end token after 761-1091 tokens, sometimes before Stop was pressed, and even
        # greedy ends this prompt after 11,007 tokens (a few seconds). Experts are streamed
        # through a cache smaller than the model, so hits and flash reads both happen.
        cls.server = Server(cls.model, "-c", "65536", "--moe-stream", "--cache-mb", "1", "--ignore-eos")
        cls.browser = Chromium()

    @classmethod
    def tearDownClass(cls):
        cls.browser.close()
        cls.server.stop()
        cls.server.log.close()

    def setUp(self):
        self.browser.open(f"http://127.0.0.1:{self.server.port}/")
        self.browser.js("localStorage.clear()")
        self.browser.reload()

    def test_send_stream_stop(self):
        b = self.browser
        # /v1/models answered: the header names the model.
        b.wait("document.querySelector('#model').textContent.endsWith('.gguf')", "the model name shows")
        # Nothing wider than the phone's screen.
        self.assertLessEqual(b.js("document.documentElement.scrollWidth"), WIDTH)
        self.assertTrue(ready(b))

        cancelled = self.server.metric_labelled("bmoe_requests_total", 'outcome="cancelled"')
        b.type("#input", "Tell me a very long story")
        b.click("#send")
        b.wait(f"(document.querySelector('{LAST_ANSWER}') || {{}}).textContent", "the answer starts")
        self.assertTrue(b.visible("#stop"), "Stop is shown while the answer streams")
        self.assertFalse(b.visible("#send"))
        self.assertEqual(b.text(".msg.user .content"), "Tell me a very long story")
        first = len(b.text(LAST_ANSWER))
        # Waited for, not slept on: a loaded machine may take longer than a second per token.
        b.wait(f"document.querySelector('{LAST_ANSWER}').textContent.length > {first}",
               "the answer grows while it streams")
        # Live telemetry, from the stream and GET /stats.
        b.wait("parseFloat(document.querySelector('#t-tps').textContent) > 0", "tok/s shows")
        b.wait("/%$/.test(document.querySelector('#t-hit').textContent)", "the cache hit rate shows")
        b.wait("!isNaN(parseFloat(document.querySelector('#t-flash').textContent))", "flash MiB/token shows")
        self.assertRegex(b.text("#t-mem"), r"^\d+(\.\d+)? (MiB|GiB)$")
        b.wait("document.querySelector('#state b').textContent === 'busy'", "the server shows busy")
        self.assertTrue(b.visible("#stop"), "the answer was still streaming when Stop was pressed")

        b.click("#stop")
        b.wait("!!document.querySelector('#send').getClientRects().length", "Send is back after Stop")
        self.assertFalse(b.visible("#stop"))
        stopped = len(b.text(LAST_ANSWER))
        time.sleep(1.0)
        self.assertEqual(len(b.text(LAST_ANSWER)), stopped, "the answer stops growing")
        meta = b.text(LAST_META)
        self.assertIn("stopped", meta)
        self.assertIn("tok/s", meta)
        hit = float(re.search(r"cache hit ([\d.]+)%", meta).group(1))
        self.assertTrue(0 < hit < 100, meta)
        self.assertGreater(float(re.search(r"([\d.]+) MiB/tok", meta).group(1)), 0, meta)
        # The server noticed the closed stream and cancelled the generation.
        deadline = time.time() + 60
        while time.time() < deadline and self.server.metric("bmoe_busy") != 0.0:
            time.sleep(0.1)
        self.assertEqual(self.server.metric("bmoe_busy"), 0.0)
        self.assertGreater(self.server.metric_labelled("bmoe_requests_total", 'outcome="cancelled"'), cancelled)

        # The conversation is listed and survives a reload.
        self.assertEqual(b.js("document.querySelectorAll('#chat-list li').length"), 1)
        self.assertEqual(b.text("#chat-list li .title"), "Tell me a very long story")
        answer = b.text(LAST_ANSWER)
        b.reload()
        b.wait("document.querySelectorAll('.msg').length === 2", "the conversation is restored")
        self.assertEqual(b.text(LAST_ANSWER), answer)

        # A short answer in the same conversation ends by itself, with its usage and speed.
        b.set_field("#max-tokens", "6")
        b.type("#input", "And now briefly")
        b.click("#send")
        b.wait("document.querySelectorAll('.msg').length === 4", "the second turn shows")
        b.wait("!!document.querySelector('#send').getClientRects().length", "the short answer ends", timeout=60)
        meta = b.wait(f"(() => {{ const t = document.querySelector('{LAST_META}').textContent;"
                      " return /cache hit/.test(t) && t; })()", "the answer's figures settle")
        self.assertIn("6 tokens", meta)
        self.assertRegex(meta, r"[\d.]+ tok/s")
        self.assertRegex(meta, r"[\d.]+ MiB/tok")
        self.assertNotIn("stopped", meta)

        # New conversation, then delete it: the list follows.
        b.click("#menu")
        b.wait("document.body.classList.contains('drawer')", "the drawer opens")
        time.sleep(0.3)  # its slide-in transition
        b.click("#new-chat")
        b.type("#input", "Second chat")
        b.click("#send")
        b.wait("!!document.querySelector('#send').getClientRects().length && "
               "document.querySelectorAll('#chat-list li').length === 2", "a second conversation", timeout=60)
        self.assertEqual(b.js("document.querySelectorAll('.msg').length"), 2)
        self.assertEqual(b.text("#chat-list li.current .title"), "Second chat")
        b.js("document.querySelector('#chat-list li.current button').click()")
        self.assertEqual(b.js("document.querySelectorAll('#chat-list li').length"), 1)
        self.assertEqual(b.text("#chat-list li.current .title"), "Tell me a very long story")
        self.assertEqual(b.js("document.querySelectorAll('.msg').length"), 4)


@unittest.skipUnless(CHROMIUM, "chromium is not installed (Debian: apt-get install chromium)")
class WebChatKeyTest(unittest.TestCase):
    """With --api-key the page still loads, asks for the key, and works once it is entered."""

    def test_api_key(self):
        model = synth("tiny-qwen3moe", "tiny-qwen3moe")
        server = Server(model, "-c", "256", "--api-key", "sekrit")
        browser = Chromium()
        try:
            browser.open(f"http://127.0.0.1:{server.port}/")
            browser.wait("!document.querySelector('#banner').hidden", "the page asks for the key")
            self.assertIn("API key", browser.text("#banner"))
            browser.type("#api-key", "sekrit")
            browser.js("document.querySelector('#api-key').dispatchEvent(new Event('change'))")
            browser.wait("document.querySelector('#model').textContent.endsWith('.gguf')", "the model name shows")
            self.assertTrue(browser.js("document.querySelector('#banner').hidden"))
            self.assertEqual(browser.js("JSON.parse(localStorage.getItem('bmoe.settings')).apiKey"), "sekrit")
            browser.set_field("#max-tokens", "4")
            browser.js("document.body.classList.remove('drawer')")
            time.sleep(0.3)
            browser.type("#input", "Hello")
            browser.click("#send")
            browser.wait("document.querySelectorAll('.msg').length === 2", "the turn shows")
            meta = browser.wait(f"(() => {{ const t = document.querySelector('{LAST_META}').textContent;"
                                " return /resident/.test(t) && t; })()", "the answer's figures settle", timeout=60)
            self.assertIn("4 tokens", meta)
            # No --moe-stream: the figures say so rather than show a cache that is not there.
            self.assertNotIn("cache hit", meta)
            self.assertNotIn("unauthorized", meta)
            self.assertTrue(browser.text(LAST_ANSWER))
        finally:
            browser.close()
            server.stop()
            server.log.close()


class FakeApi(http.server.BaseHTTPRequestHandler):
    """Serves the page and a scripted stream with reasoning (no tiny model produces <think>)."""

    requests = []
    # (delay before the first event, reasoning pieces, content pieces) of the next answer.
    script = (0, ["Two plus ", "two is four."], ["The answer", " is 4."])
    reading = False  # /stats says a prompt is being read (3 of 7 tokens)

    def log_message(self, *args):
        pass

    def reply(self, status, body, kind="application/json"):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/":
            with open(PAGE, "rb") as f:
                self.reply(200, f.read(), "text/html; charset=utf-8")
        elif self.path == "/v1/models":
            self.reply(200, json.dumps({"object": "list", "data": [{"id": "fake-model", "object": "model"}]}))
        elif self.path == "/props":
            self.reply(200, json.dumps({"default_generation_settings": {"n_ctx": 64}}))
        elif self.path == "/stats":
            n = len(FakeApi.requests)
            prompt = {"done": 3, "total": 7} if FakeApi.reading else {"done": 0, "total": 0}
            self.reply(200, json.dumps({"busy": FakeApi.reading, "queue_depth": 0, "prompt": prompt,
                                        "generated_tokens": 10 * n,
                                        "experts": {"lookups": 100 * n, "hits": 75 * n, "flash_read_bytes": 0},
                                        "memory": {"rss_bytes": 123 << 20}}))
        else:
            self.reply(404, "{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeApi.requests.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        base = {"id": "x", "object": "chat.completion.chunk", "model": "fake-model"}

        def event(delta=None, finish=None, **extra):
            choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
            self.wfile.write(f"data: {json.dumps({**base, 'choices': choices, **extra})}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.05)

        delay, reasoning, content = FakeApi.script
        FakeApi.reading = delay > 0
        time.sleep(delay)
        FakeApi.reading = False
        event({"role": "assistant", "content": ""})
        for piece in reasoning:
            event({"reasoning_content": piece})
        for piece in content:
            event({"content": piece})
        usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
        event({}, "stop", usage=usage, timings={"predicted_per_second": 42.0})
        event(None, usage=usage)
        self.wfile.write(b"data: [DONE]\n\n")


@unittest.skipUnless(CHROMIUM, "chromium is not installed (Debian: apt-get install chromium)")
class WebChatReasoningTest(unittest.TestCase):
    def test_reasoning_shown_apart(self):
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        browser = Chromium()
        try:
            browser.open(f"http://127.0.0.1:{httpd.server_address[1]}/")
            browser.wait("document.querySelector('#model').textContent === 'fake-model'", "the model name shows")
            browser.type("#input", "What is 2+2?")
            browser.click("#send")
            browser.wait("!!document.querySelector('#send').getClientRects().length && "
                         "document.querySelectorAll('.msg').length === 2", "the answer ends")
            self.assertEqual(browser.text(LAST_ANSWER), "The answer is 4.")
            self.assertEqual(browser.text(".msg.assistant .reasoning div"), "Two plus two is four.")
            self.assertFalse(browser.js("document.querySelector('.msg.assistant .reasoning').hidden"))
            self.assertFalse(browser.js("document.querySelector('.msg.assistant .reasoning').open"),
                             "reasoning starts collapsed")
            meta = browser.text(LAST_META)
            self.assertIn("7 tokens", meta)
            self.assertIn("42.0 tok/s", meta)
            self.assertEqual(browser.text("#t-tps"), "42.0")
            sent = FakeApi.requests[-1]
            self.assertTrue(sent["stream"])
            self.assertEqual(sent["stream_options"], {"include_usage": True})
            self.assertEqual(sent["messages"], [{"role": "user", "content": "What is 2+2?"}])
        finally:
            browser.close()
            httpd.shutdown()
            httpd.server_close()


MARKDOWN = ("Use **bold** and a list:\n\n- one\n- two\n\n```python\nprint('hi')\n```\n\n"
            "<img src=x onerror=\"window.pwned=1\"><script>window.pwned=2</script>end")


@unittest.skipUnless(CHROMIUM, "chromium is not installed (Debian: apt-get install chromium)")
class WebChatMarkdownTest(unittest.TestCase):
    """Answers render as sanitised Markdown with a Copy button on code; the status reads the
    prompt's progress; an answer that is all reasoning is shown (issue 33)."""

    def ask(self, browser, text):
        browser.type("#input", text)
        browser.click("#send")

    def test_markdown_code_copy_prompt_progress_and_reasoning_only(self):
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        browser = Chromium()
        try:
            browser.open(f"http://127.0.0.1:{httpd.server_address[1]}/")
            browser.wait("document.querySelector('#model').textContent === 'fake-model'", "the model name shows")
            # The prompt is read for a while before the first token: the status says so.
            FakeApi.script = (3, [], [MARKDOWN[:20], MARKDOWN[20:]])
            self.ask(browser, "Show me markdown")
            browser.wait("document.querySelector('#state').textContent.includes('reading prompt 3/7')",
                         "the status reads the prompt's progress")
            browser.wait("document.querySelectorAll('.msg').length === 2 && "
                         "!!document.querySelector('#send').getClientRects().length", "the answer ends")
            answer = ".msg.assistant:last-of-type .content"
            self.assertEqual(browser.text(answer + " strong"), "bold")
            self.assertEqual(browser.js(f"document.querySelectorAll('{answer} li').length"), 2)
            self.assertEqual(browser.text(answer + " pre code"), "print('hi')\n")
            # Sanitised: no script ran, no handler survived, the text after them is kept.
            self.assertIsNone(browser.js("window.pwned === undefined ? null : window.pwned"))
            self.assertEqual(browser.js(f"document.querySelectorAll('{answer} script, {answer} [onerror]').length"), 0)
            self.assertIn("end", browser.text(answer))
            # A code block has a Copy button that answers the click.
            self.assertEqual(browser.text(answer + " pre button.copy"), "Copy")
            browser.click(answer + " pre button.copy")
            browser.wait(f"document.querySelector('{answer} pre button.copy').textContent !== 'Copy'", "the copy is done")
            self.assertEqual(browser.text(answer + " pre button.copy"), "Copied")
            self.assertEqual(browser.text("#state b"), "idle")
            # All reasoning, no answer: the reasoning shows open, not a "…" bubble.
            FakeApi.script = (0, ["Only thinking, ", "no answer."], [])
            self.ask(browser, "Think only")
            browser.wait("document.querySelectorAll('.msg').length === 4 && "
                         "!!document.querySelector('#send').getClientRects().length", "the answer ends")
            self.assertTrue(browser.js("document.querySelector('.msg.assistant:last-of-type .reasoning').open"))
            self.assertEqual(browser.text(".msg.assistant:last-of-type .reasoning div"), "Only thinking, no answer.")
            self.assertFalse(browser.visible(".msg.assistant:last-of-type .content"))
        finally:
            FakeApi.script = (0, ["Two plus ", "two is four."], ["The answer", " is 4."])
            browser.close()
            httpd.shutdown()
            httpd.server_close()


if __name__ == "__main__":
    unittest.main()
