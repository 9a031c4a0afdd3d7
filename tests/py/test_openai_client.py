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
        body = {"ignore_eos": True}
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
        self.assertEqual(ch.text, " ".join(map(str, ids)))
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
                                           stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
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
        self.assertEqual(text, " ".join(map(str, whole)))
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
        self.assert_error(openai.BadRequestError, mk(prompt="Hello world"), "no tokenizer")
        self.assert_error(openai.BadRequestError, mk(prompt=["Hello", "world"]), "no tokenizer")
        self.assert_error(openai.BadRequestError, mk(prompt=[]), "empty")
        self.assert_error(openai.BadRequestError, mk(prompt=[1, self.vocab]), "outside the vocabulary")
        self.assert_error(openai.BadRequestError, mk(prompt=[-5]), "outside the vocabulary")
        self.assert_error(openai.BadRequestError, mk(prompt=[1] * self.max_len), "tokens")
        self.assert_error(openai.BadRequestError, mk(max_tokens=0), "max_tokens")
        self.assert_error(openai.BadRequestError, mk(max_tokens=self.max_len * 2), "max_tokens")
        self.assert_error(openai.BadRequestError, mk(temperature=2.5), "temperature")
        self.assert_error(openai.BadRequestError, mk(top_p=1.5), "top_p")
        self.assert_error(openai.BadRequestError, mk(n=3), "n = 1")
        self.assert_error(openai.BadRequestError, mk(stop=["\n"]), "stop_token_ids")
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
        # and it keeps serving
        self.assertEqual(len(ids_of(self.greedy(self.prompt(), 3).choices[0])), 3)

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
