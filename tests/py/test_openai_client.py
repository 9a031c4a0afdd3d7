"""The official `openai` Python client against a running `m3mono serve` (started by
tests/scripts/serve_openai.sh). Environment: M3_URL (server base URL, no /v1), M3_API_KEY, M3_MODEL.

The checkpoint has no tokenizer: prompts are lists of token ids, and completions come back as ids
in choices[i].token_ids (with choices[i].text holding the same ids separated by spaces)."""
import json
import os
import random
import sys
import time
import unittest
import urllib.request

import openai

URL = os.environ.get("M3_URL", "http://127.0.0.1:8000")
KEY = os.environ.get("M3_API_KEY", "")
MODEL = os.environ.get("M3_MODEL", "tiny")
SEED = int(os.environ.get("M3_TEST_SEED", random.SystemRandom().randrange(1 << 30)))
print(f"test_openai_client: {URL} model {MODEL} seed {SEED}", file=sys.stderr)


def client(key=KEY):
    return openai.OpenAI(base_url=URL + "/v1", api_key=key or "none", max_retries=0, timeout=120)


def metrics():
    with urllib.request.urlopen(URL + "/metrics", timeout=10) as r:
        page = r.read().decode()
    out = {}
    for line in page.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def post(path, body, key=KEY):
    """POST JSON to the server (outside /v1); returns (status, parsed body)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method="POST",
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def tokenize(text, add_special_tokens=True):
    status, body = post("/tokenize", {"prompt": text, "add_special_tokens": add_special_tokens})
    assert status == 200, body
    return body["tokens"]


def split_thinking(text, mode):
    """(reasoning or None, content) of a chat answer, as serve/reasoning.h splits it."""
    opener, closer = "<mm:think>", "</mm:think>"
    if mode == "disabled":
        return None, text
    at = 0
    if mode != "enabled":
        stripped = text.lstrip(" \t\r\n")
        if not stripped.startswith(opener):
            return None, text
        at = len(text) - len(stripped) + len(opener)
    end = text.find(closer, at)
    if end < 0:
        return text[at:], ""
    return text[at:end], text[end + len(closer):]


def detokenize(ids):
    status, body = post("/detokenize", {"tokens": list(ids)})
    assert status == 200, body
    return body["prompt"]


# Random text with multi-byte characters (split over byte tokens by the tiny vocabulary).
PIECES = ["the", " dog", " robot", "é", "ü", "你", "好", "世界", "😀", "🚀", " ", "\n", ",", "42", " hello", "Привет"]


def ids_of(choice):
    ids = getattr(choice, "token_ids", None)
    assert ids is not None, f"choice has no token_ids: {choice}"
    return list(ids)


class OpenAIClient(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = client()
        cls.rng = random.Random(SEED)
        models = cls.c.models.list().data
        cls.info = models[0]
        cls.vocab = int(cls.info.model_extra["vocab_size"])
        cls.max_len = int(cls.info.model_extra["max_model_len"])

    def prompt(self, n=None):
        n = n or self.rng.randint(1, 40)
        return [self.rng.randrange(self.vocab) for _ in range(n)]

    def greedy(self, prompt, max_tokens=6, **extra):
        body = {"ignore_eos": True, "skip_special_tokens": False}
        body.update(extra)
        return self.c.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                         extra_body=body)

    def test_models(self):
        ids = [m.id for m in self.c.models.list().data]
        self.assertEqual(ids, [MODEL])
        self.assertGreater(self.vocab, 0)
        self.assertGreater(self.max_len, 1)

    def test_completion_fields(self):
        p = self.prompt()
        r = self.greedy(p, 7)
        self.assertEqual(r.object, "text_completion")
        self.assertEqual(r.model, MODEL)
        self.assertEqual(len(r.choices), 1)
        ch = r.choices[0]
        ids = ids_of(ch)
        self.assertEqual(len(ids), 7)
        self.assertTrue(all(0 <= t < self.vocab for t in ids))
        self.assertEqual(ch.text, detokenize(ids))  # skip_special_tokens=False (greedy() sets it)
        self.assertEqual(ch.finish_reason, "length")
        self.assertEqual(r.usage.prompt_tokens, len(p))
        self.assertEqual(r.usage.completion_tokens, 7)
        self.assertEqual(r.usage.total_tokens, len(p) + 7)
        # greedy is deterministic
        self.assertEqual(ids_of(self.greedy(p, 7).choices[0]), ids)

    def test_seeded_sampling_is_reproducible(self):
        p = self.prompt()
        runs = [self.c.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=1.0, top_p=0.9, seed=1234,
                                          extra_body={"ignore_eos": True}) for _ in range(2)]
        self.assertEqual(ids_of(runs[0].choices[0]), ids_of(runs[1].choices[0]))

    def test_streaming_equals_whole(self):
        p = self.prompt()
        whole = ids_of(self.greedy(p, 9).choices[0])
        stream = self.c.completions.create(model=MODEL, prompt=p, max_tokens=9, temperature=0, stream=True,
                                           stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True, "skip_special_tokens": False})
        ids, text, finish, usage = [], "", None, None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for ch in chunk.choices:
                self.assertIsNone(finish, "a chunk after finish_reason")
                ids += ids_of(ch)
                text += ch.text
                finish = ch.finish_reason or finish
        self.assertEqual(ids, whole)
        self.assertEqual(text, detokenize(whole))
        self.assertEqual(finish, "length")
        self.assertIsNotNone(usage)
        self.assertEqual(usage.completion_tokens, 9)

    def test_batched_prompts(self):
        p1, p2 = self.prompt(), self.prompt()
        r = self.greedy([p1, p2], 5)
        self.assertEqual([c.index for c in r.choices], [0, 1])
        self.assertEqual(ids_of(r.choices[0]), ids_of(self.greedy(p1, 5).choices[0]))
        self.assertEqual(ids_of(r.choices[1]), ids_of(self.greedy(p2, 5).choices[0]))
        self.assertEqual(r.usage.prompt_tokens, len(p1) + len(p2))
        self.assertEqual(r.usage.completion_tokens, 10)

    def test_n_and_logprobs(self):
        p = self.prompt()
        r = self.c.completions.create(model=MODEL, prompt=p, max_tokens=5, temperature=1.0, seed=11, n=2,
                                      logprobs=2, extra_body={"ignore_eos": True})
        self.assertEqual([c.index for c in r.choices], [0, 1])
        self.assertEqual(r.usage.prompt_tokens, len(p))
        self.assertEqual(r.usage.completion_tokens, 10)
        for j, c in enumerate(r.choices):
            one = self.c.completions.create(model=MODEL, prompt=p, max_tokens=5, temperature=1.0, seed=11 + j,
                                            extra_body={"ignore_eos": True})
            self.assertEqual(ids_of(c), ids_of(one.choices[0]))
            self.assertEqual(len(c.logprobs.token_logprobs), 5)
            for lp, top in zip(c.logprobs.token_logprobs, c.logprobs.top_logprobs):
                self.assertLessEqual(lp, 0.0)
                self.assertTrue(1 <= len(top) <= 2)
                self.assertGreaterEqual(max(top.values()), lp)
        msgs = [{"role": "user", "content": "Hi"}]
        ch = self.c.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=4, temperature=0,
                                            logprobs=True, top_logprobs=2,
                                            extra_body={"ignore_eos": True,
                                                        "chat_template_kwargs": {"thinking_mode": "disabled"}})
        content = ch.choices[0].logprobs.content
        self.assertEqual(len(content), 4)
        for e in content:
            self.assertEqual(len(e.top_logprobs), 2)
            self.assertAlmostEqual(e.logprob, e.top_logprobs[0].logprob, places=5)  # greedy: the best
            self.assertEqual(bytes(e.bytes).decode("utf-8", "replace"), e.token)

    def test_stop_token_ids(self):
        p = self.prompt()
        free = ids_of(self.greedy(p, 10).choices[0])
        stop = free[4]
        r = self.greedy(p, 10, stop_token_ids=[stop])
        ch = r.choices[0]
        first = free.index(stop)
        self.assertEqual(ch.finish_reason, "stop")
        self.assertEqual(ids_of(ch), free[:first + 1])
        self.assertEqual(ch.model_extra.get("stop_reason"), stop)

    def assert_error(self, cls, fn, needle):
        with self.assertRaises(cls) as cm:
            fn()
        e = cm.exception
        self.assertIn(needle, str(e))
        body = e.body if isinstance(e.body, dict) else {}
        self.assertIn("message", body, f"error body {e.body!r} lacks the OpenAI error fields")
        self.assertIn("type", body)

    def test_errors(self):
        c = self.c
        mk = lambda **kw: (lambda: c.completions.create(**{"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2, **kw}))
        self.assert_error(openai.BadRequestError, mk(prompt=""), "empty string")
        self.assert_error(openai.BadRequestError, mk(prompt=["Hello", ""]), "'prompt[1]' is an empty string")
        self.assert_error(openai.BadRequestError, mk(prompt="x", stop=["a", 5]), "'stop[1]' must be a string")
        self.assert_error(openai.BadRequestError, mk(prompt=[]), "empty")
        self.assert_error(openai.BadRequestError, mk(prompt=[1, self.vocab]), "outside the vocabulary")
        self.assert_error(openai.BadRequestError, mk(prompt=[-5]), "outside the vocabulary")
        self.assert_error(openai.BadRequestError, mk(prompt=[1] * self.max_len), "tokens")
        self.assert_error(openai.BadRequestError, mk(max_tokens=0), "max_tokens")
        self.assert_error(openai.BadRequestError, mk(max_tokens=self.max_len * 2), "max_tokens")
        self.assert_error(openai.BadRequestError, mk(temperature=2.5), "temperature")
        self.assert_error(openai.BadRequestError, mk(top_p=1.5), "top_p")
        self.assert_error(openai.BadRequestError, mk(n=0), "'n' must be in")
        self.assert_error(openai.BadRequestError, mk(logprobs=21), "'logprobs' must be in [0, 20]")
        self.assert_error(openai.BadRequestError, mk(stream=True, extra_body={"ignore_eos": "yes"}), "ignore_eos")
        self.assert_error(openai.NotFoundError, mk(model="gpt-5"), "does not exist")
        self.assert_error(openai.AuthenticationError,
                          lambda: client("wrong-key").completions.create(model=MODEL, prompt=[1], max_tokens=1),
                          "API key")
        # malformed JSON, straight through HTTP
        req = urllib.request.Request(URL + "/v1/completions", data=b'{"model": ', method="POST",
                                     headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        with self.assertRaises(urllib.error.HTTPError) as cm:
            urllib.request.urlopen(req, timeout=10)
        self.assertEqual(cm.exception.code, 400)
        self.assertIn("not valid JSON", json.loads(cm.exception.read())["error"]["message"])
        # invalid UTF-8 inside the prompt string names the field
        status, body = post("/v1/completions", b'{"model": "' + MODEL.encode() + b'", "prompt": "ab\xff\xfe"}')
        self.assertEqual(status, 400)
        self.assertEqual(body["error"]["param"], "prompt")
        self.assertEqual(body["error"]["code"], "invalid_utf8")
        # and it keeps serving
        self.assertEqual(len(ids_of(self.greedy(self.prompt(), 3).choices[0])), 3)

    def random_text(self, n=None):
        return "".join(self.rng.choice(PIECES) for _ in range(n or self.rng.randint(1, 12)))

    def test_text_prompt(self):
        p = self.random_text()
        r = self.c.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True, "skip_special_tokens": False})
        ch = r.choices[0]
        self.assertIsInstance(ch.text, str)
        self.assertEqual(ch.text, detokenize(ids_of(ch)))
        self.assertEqual(r.usage.prompt_tokens, len(tokenize(p)))
        self.assertEqual(r.usage.completion_tokens, 8)
        # the same as the prompt's token ids
        self.assertEqual(ids_of(self.greedy(tokenize(p), 8).choices[0]), ids_of(ch))
        # and special tokens are left out of the text by default
        plain = self.c.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0,
                                          extra_body={"ignore_eos": True})
        self.assertEqual(ids_of(plain.choices[0]), ids_of(ch))
        self.assertLessEqual(len(plain.choices[0].text), len(ch.text))

    def test_text_prompt_list(self):
        p1, p2 = self.random_text(), self.random_text()
        r = self.greedy([p1, p2], 5)
        self.assertEqual([c.index for c in r.choices], [0, 1])
        self.assertEqual(r.choices[0].text, self.greedy(p1, 5).choices[0].text)
        self.assertEqual(r.choices[1].text, self.greedy(p2, 5).choices[0].text)
        self.assertEqual(r.usage.prompt_tokens, len(tokenize(p1)) + len(tokenize(p2)))

    def test_tokenize_round_trip(self):
        for _ in range(20):
            s = self.random_text() + self.rng.choice(["", "[e~[", "]~b]user"])
            status, body = post("/tokenize", {"model": MODEL, "prompt": s})
            self.assertEqual(status, 200, body)
            self.assertEqual(body["count"], len(body["tokens"]))
            self.assertEqual(body["max_model_len"], self.max_len)
            self.assertEqual(detokenize(body["tokens"]), s)
        for path, bad, param in [("/tokenize", {"prompt": 5}, "prompt"),
                                 ("/tokenize", {"prompt": "a", "add_special_tokens": "x"}, "add_special_tokens"),
                                 ("/detokenize", {"tokens": [1, self.vocab]}, "tokens"),
                                 ("/detokenize", {"tokens": "1 2"}, "tokens"),
                                 ("/detokenize", {"tokens": [1, "2"]}, "tokens")]:
            status, body = post(path, bad)
            self.assertEqual(status, 400, (path, bad, body))
            self.assertEqual(body["error"]["param"], param)
            self.assertIn(param, body["error"]["message"])
        status, body = post("/tokenize", b'{"prompt": "\xc3("}')
        self.assertEqual((status, body["error"]["param"], body["error"]["code"]), (400, "prompt", "invalid_utf8"))

    def spanning_stop(self, ids, whole):
        """A 2-3 character stop string across the boundary of two tokens of `ids` (so the server sees
        it arrive in pieces), or None. Texts of prefixes must extend each other (no character cut)."""
        ks = list(range(1, len(ids) - 2))
        self.rng.shuffle(ks)
        for k in ks:
            t1, t2 = detokenize(ids[:k]), detokenize(ids[:k + 1])
            if not t1 or len(t2) <= len(t1) or not t2.startswith(t1) or not whole.startswith(t2):
                continue
            if "\ufffd" in t2:
                continue
            return t1[-self.rng.randint(1, min(2, len(t1))):] + t2[len(t1)]
        return None

    def test_stop_string(self):
        tried = 0
        for _ in range(6):
            p = self.random_text()
            r0 = self.greedy(p, 24).choices[0]
            whole, ids = r0.text, ids_of(r0)
            stop = self.spanning_stop(ids, whole)
            if stop is None:
                continue
            tried += 1
            want = whole[:whole.find(stop)]
            r = self.greedy(p, 24, stop=[stop, "\x01never"])
            ch = r.choices[0]
            self.assertEqual(ch.text, want, f"stop {stop!r} in {whole!r}")
            self.assertEqual(ch.finish_reason, "stop")
            self.assertEqual(ch.model_extra.get("stop_reason"), stop)
            self.assertEqual(r.usage.completion_tokens, len(ids_of(ch)))
            stream = self.c.completions.create(model=MODEL, prompt=p, max_tokens=24, temperature=0, stream=True,
                                               stop=[stop], extra_body={"ignore_eos": True, "skip_special_tokens": False})
            text, finish = "", None
            for chunk in stream:
                for c in chunk.choices:
                    text += c.text
                    self.assertTrue(want.startswith(text), f"streamed past the stop {stop!r}: {text!r}")
                    finish = c.finish_reason or finish
            self.assertEqual(text, want)
            self.assertEqual(finish, "stop")
        self.assertGreater(tried, 0, "no stop string spanning two tokens was found in 6 completions")

    def test_chat(self):
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": self.random_text()}]
        for mode in ["enabled", "disabled", "adaptive"]:
            kw = {"ignore_eos": True, "skip_special_tokens": False, "chat_template_kwargs": {"thinking_mode": mode}}
            r = self.c.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=8, temperature=0,
                                               extra_body=kw)
            self.assertEqual(r.object, "chat.completion")
            ch = r.choices[0]
            self.assertEqual(ch.message.role, "assistant")
            ids = ch.model_extra["token_ids"]
            self.assertEqual(len(ids), 8)
            want_reasoning, want_content = split_thinking(detokenize(ids), mode)
            self.assertEqual(ch.message.content, want_content)
            self.assertEqual(ch.message.model_extra.get("reasoning_content"), want_reasoning)
            self.assertEqual(r.usage.completion_tokens, 8)
            self.assertGreater(r.usage.prompt_tokens, 10)
            stream = self.c.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=8, temperature=0,
                                                    stream=True, stream_options={"include_usage": True}, extra_body=kw)
            text, thought, roles, usage = "", "", [], None
            for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                for c in chunk.choices:
                    text += c.delta.content or ""
                    thought += (c.delta.model_extra or {}).get("reasoning_content") or ""
                    if c.delta.role:
                        roles.append(c.delta.role)
            self.assertEqual(text, ch.message.content)
            self.assertEqual(thought, want_reasoning or "")
            self.assertEqual(roles, ["assistant"])
            self.assertEqual(usage.prompt_tokens, r.usage.prompt_tokens)
            status, tok = post("/tokenize", {"messages": msgs, "chat_template_kwargs": {"thinking_mode": mode}})
            self.assertEqual(status, 200, tok)
            self.assertEqual(tok["count"], r.usage.prompt_tokens)
        # with tools: the same answer (the tiny model writes no call block), the schema accepted
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                   "parameters": {"type": "object",
                                                                  "properties": {"city": {"type": "string"}}}}}]
        kw = {"ignore_eos": True, "skip_special_tokens": False, "chat_template_kwargs": {"thinking_mode": "disabled"}}
        r = self.c.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=8, temperature=0,
                                           tools=tools, extra_body=kw)
        ids = r.choices[0].model_extra["token_ids"]
        self.assertEqual(r.choices[0].message.content, detokenize(ids))
        self.assertFalse(r.choices[0].message.tool_calls)
        self.assertEqual(r.choices[0].finish_reason, "length")
        with self.assertRaises(openai.BadRequestError) as cm:
            self.c.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=2,
                                           tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}])
        self.assertIn("tools[0].function.parameters", str(cm.exception))
        with self.assertRaises(openai.BadRequestError) as cm:
            self.c.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "x"}], max_tokens=2)
        self.assertIn("messages[0].role", str(cm.exception))

    def test_client_disconnect_cancels(self):
        before = metrics().get('m3_requests_finished_total{reason="cancelled"}', 0)
        n = min(2000, self.max_len - 8)
        stream = self.c.completions.create(model=MODEL, prompt=self.prompt(4), max_tokens=n, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        for i, _ in enumerate(stream):
            if i == 2:
                break
        stream.close()  # hang up mid-stream
        deadline = time.time() + 20
        while time.time() < deadline:
            m = metrics()
            if (m.get('m3_requests_finished_total{reason="cancelled"}', 0) > before and m["m3_cache_blocks_used"] == 0
                    and m["m3_requests_running"] == 0):
                break
            time.sleep(0.05)
        m = metrics()
        self.assertGreater(m.get('m3_requests_finished_total{reason="cancelled"}', 0), before,
                           "the abandoned stream was not cancelled")
        self.assertEqual(m["m3_cache_blocks_used"], 0)
        self.assertEqual(m["m3_requests_running"], 0)
        self.assertLess(m["m3_generation_tokens_total"], 10 ** 9)


if __name__ == "__main__":
    unittest.main()
