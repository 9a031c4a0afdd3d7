"""Builds tokenizer.json files with the Python `tokenizers` library and records what the library
makes of a test corpus, for tests/cpu/test_tokenizer.cpp (which runs m3mono's tokenizer on the same
files and strings and must agree exactly).

  python3 make_tokenizer_cases.py OUT_DIR [--seed N] [--random N]

Writes OUT_DIR/<layout>/tokenizer.json for each layout and OUT_DIR/cases.jsonl, one JSON object a
line: {"layout", "kind": "text", "text", "ids", "ids_plain", "decoded", "decoded_skip",
"round_trip"[, "nfc_old_tables"]} (ids: add_special_tokens=True, ids_plain: False; decoded*: decode(ids_plain) without
and with skip_special_tokens; round_trip: decode(ids_plain) == text) or {"layout", "kind": "ids",
"ids", "decoded", "decoded_skip"} (random id sequences, to test decoding of byte soup).
The corpus: fixed strings, paragraphs of realistic text, and --random random strings per layout
(code points from every plane, random bytes read as UTF-8 with replacement and as Latin-1, and
fragments glued together: markers inside text, whitespace runs, digits, scripts, emoji).
The seed is fresh each run unless --seed or M3_TOKENIZER_SEED fixes it; it is printed first.

Layouts:
  m3     M3's layout: BPE trained with the o200k-style split pattern (Split, Isolated) followed by
         ByteLevel(add_prefix_space=False, use_regex=False), ByteLevel decoder and post-processor,
         M3's 61 added tokens right after the trained vocabulary (special and non-special).
  gpt2   GPT-2's layout: ByteLevel(add_prefix_space=True) alone (its built-in regex), merges
         written in the legacy "a b" spelling, added tokens with lstrip/rstrip/single_word and
         one that is a prefix of another (longest match).
  nfc    the m3 model with an NFC normalizer, ignore_merges, normalized added tokens (one whose
         normalized form differs), 20 of M3's tokens, and a TemplateProcessing post-processor
         adding BOS/EOS.
  splits the m3 model behind other Split behaviors (MergedWithNext, Contiguous with invert,
         Removed, MergedWithPrevious on a String pattern) and ByteLevel with add_prefix_space.
"""
import argparse
import json
import os
import random
import sys
import unicodedata

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# The o200k_base-style pattern M3's tokenizer.json uses (ecosystem-notes.md 1.1: the letter
# alternatives with case classes and contractions, digits in threes, punctuation runs, newline
# runs, the look-ahead whitespace rule).
NFC = normalizers.NFC()

M3_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# M3's added tokens in id order (200000..200060 in the checkpoint; here right after the trained
# vocabulary). Names documented in ecosystem-notes.md are used; the rest are stand-ins of the same
# shapes. (content, special)
M3_ADDED = (
    [("]!p~[", True)]
    + [(f"]<]fim {n}[>[", False) for n in ("prefix", "middle", "suffix", "pad")]
    + [(f"<repo_{k}>", False) for k in range(14)]
    + [("]~b]", True), ("[e~[", True), ("]!d~[", True), ("<function_call>", False),
       ("]<]speech[>[", False), ("]<]end of speech[>[", False),
       ("]<]image[>[", False), ("]<]video[>[", False), ("]<]audio[>[", False), ("]<]end of audio[>[", False),
       ("]<]start of image[>[", False), ("]<]end of image[>[", False),
       ("]<]start of video[>[", False), ("]<]end of video[>[", False), ("]<]vision pad[>[", False),
       ("]~!b[", True)]
    + [(f"<reserved_{k}>", True) for k in range(35, 50)]
    + [("<think>", False), ("</think>", False), ("<tool_call>", False), ("</tool_call>", False),
       ("]<]frame[>[", False), ("]<]start of frame[>[", False), ("]<]end of frame[>[", False),
       ("<|content_altered_placeholder|>", True), ("]<]minimax[>[", False),
       ("<mm:think>", False), ("</mm:think>", False)]
)
assert len(M3_ADDED) == 61, len(M3_ADDED)
MARKERS = [c for c, _ in M3_ADDED]


def training_corpus(rng, n=4000):
    """Multilingual text for the BPE trainer (varies with the seed)."""
    words_en = ("the quick brown fox jumps over the lazy dog while another one sleeps under a tree "
                "I'm you're they'll we've she'd it's DON'T WON'T Hello World token tokenizer encoding").split()
    words_code = ("def class return import from self None True False int main void const auto std::vector "
                  "printf for while if else { } ( ) [ ] ; => != == <= >= += -> :: // /* */ #include").split()
    cjk = "我们今天学习中文分词器的工作原理。日本語のテキストも含まれています。한국어 문장도 있습니다。"
    other = "Привет мир, как дела? Γειά σου κόσμε. مرحبا بالعالم. नमस्ते दुनिया। สวัสดีชาวโลก 😀👍🏽🎉 café naïve"
    lines = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.4:
            lines.append(" ".join(rng.choice(words_en) for _ in range(rng.randint(3, 15))))
        elif kind < 0.6:
            lines.append(" ".join(rng.choice(words_code) for _ in range(rng.randint(3, 12))))
        elif kind < 0.75:
            s = rng.randint(0, len(cjk) - 10)
            lines.append(cjk[s:s + rng.randint(5, 30)])
        elif kind < 0.9:
            s = rng.randint(0, len(other) - 10)
            lines.append(other[s:s + rng.randint(5, 40)])
        else:
            lines.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 8))) for _ in range(rng.randint(1, 6))))
    return lines


def train(lines, pre_tokenizer, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def fixed_strings():
    s = [
        "", " ", "a", "Hello world", "Hello, world! How are you doing today?",
        "I'm sure they'll say it's fine; DON'T WORRY, it'S OK. We'VE got it. She'd've.",
        "'s 's'S 'll'LL 're've 'm 'd x's", "naïve café résumé Ångström", "cafe\u0301 e\u0301 A\u030a",
        "我们今天学习中文分词器的工作原理。", "日本語のテキスト、カタカナ、ひらがな。", "한국어 문장도 있습니다.",
        "Привет, мир! ΑΒΓ αβγ", "مرحبا بالعالم ١٢٣٤٥", "नमस्ते दुनिया", "สวัสดีชาวโลก",
        "😀👍🏽🎉 👨‍👩‍👧‍👦 🇺🇸🇯🇵 ✔︎ ❤️", "emoji😀inside😀words", "x²+y² = z³, ½ ⅓ Ⅻ",
        "1234567890", "3.14159265358979", "1,000,000.00", "０１２３４５６７８９ fullwidth", "v1.2.3-rc4",
        "def f(x):\n    return x ** 2  # square\n", "int main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn 0;\n}\n",
        '{"key": [1, 2, {"nested": null}], "s": "a\\nb"}', "<div class=\"x\">&amp;</div>",
        "    leading", "trailing    ", "a  b   c    d     e", " " * 300, "\t" * 40, "\n" * 30,
        "\r\n\r\n", "line1\nline2\r\nline3\rline4", " \t \n \r\n  \n\n  x", "x" + " " * 17 + "y",
        "\u00a0nbsp\u00a0 \u2000\u2001\u2002\u3000ideographic\u3000space", "mongolian\u180evowel\u180e sep",
        "zero\u200bwidth\u200b", "bom\ufeffinside", "nel\u0085line\u2028sep\u2029para", "\x00\x01\x1f\x7f ctrl",
        "\u001c\u001d\u001e\u001f info seps", "ſ 'ſ x'ſ", "K Kelvin 'K",
        "]~!b[]~b]system\nYou are a helpful assistant.[e~[\n]~b]user\nHi![e~[\n]~b]ai\n<mm:think>",
        "<mm:think>Let me think.</mm:think>The answer is 42.[e~[",
        "text]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"f\">]<]minimax[>[</invoke>",
        "]~b ]~b] ]~b]] [e~ [e~[[e~[ <mm:thin <mm:<mm:think>> </mm:think", "a]<]start of image[>[b",
        "]<]start of image[>[]<]end of image[>[]<]vision pad[>[", "<think></think><tool_call></tool_call>",
        "<|content_altered_placeholder|> ]!p~[ ]!d~[", "x<mask>y  <mask>  z", "[rs]   next", "foo foobar barfoo (foo) _foo",
        "<|endoftext|>Hello<|endoftext|>", "<|im|>start <|im|>star <|im|><|im|>startstart", "  <|endoftext|>  ", "<bos> literal", "\u00e9t\u00e9 <e\u0301>",
    ]
    return s


def random_strings(rng, n):
    """Random text: code points from every plane, byte soup, and fragments glued together."""
    frags = ["the", " ", "  ", "\n", "\r\n", "\t", "123", "4567", "'s", "'LL", "é", "e\u0301", "中文", "の", "😀",
             "👍🏽", "{", "}", "()", "::", "->", "    ", "\u00a0", "\u3000", "x", "Y", "_", "-", ".", ",", "!?",
             "٣", "１", "ſ", "\u200b", "\u180e", "<", ">", "[", "]", "~"] + MARKERS[:6] + MARKERS[-8:] + \
            ["<mask>", "[rs]", "foo", "<|endoftext|>", "<bos>", "<e\u0301>", "<|im|>", "<|im|>start"]
    out = []
    for k in range(n):
        kind = k % 5
        length = rng.choice([1, 2, 3, 5, 8, 13, 40, 100, 300])
        if kind == 0:  # code points anywhere (no surrogates)
            cps = []
            while len(cps) < length:
                r = rng.random()
                if r < 0.3:
                    cp = rng.randint(0x20, 0x7E)
                elif r < 0.5:
                    cp = rng.randint(0x80, 0x7FF)
                elif r < 0.8:
                    cp = rng.randint(0x800, 0xFFFF)
                else:
                    cp = rng.randint(0x10000, 0x10FFFF)
                if 0xD800 <= cp <= 0xDFFF:
                    continue
                cps.append(chr(cp))
            out.append("".join(cps))
        elif kind == 1:  # random bytes read as UTF-8 with replacement
            out.append(bytes(rng.randrange(256) for _ in range(length)).decode("utf-8", errors="replace"))
        elif kind == 2:  # random bytes read as Latin-1 (every byte value as a character)
            out.append(bytes(rng.randrange(256) for _ in range(length)).decode("latin-1"))
        else:  # fragments: markers inside text, whitespace runs, digits, mixed scripts
            out.append("".join(rng.choice(frags) for _ in range(max(1, length // 3))))
    return out


def random_id_lists(rng, n, vocab, special_ids):
    out = []
    for _ in range(n):
        length = rng.choice([1, 2, 3, 7, 20, 60])
        out.append([rng.choice(special_ids) if rng.random() < 0.1 else rng.randrange(vocab) for _ in range(length)])
    return out


def add_m3_tokens(tok):
    base = tok.get_vocab_size()
    tok.add_tokens([AddedToken(c, special=sp, normalized=False) for c, sp in M3_ADDED])
    for k, (c, _) in enumerate(M3_ADDED):
        assert tok.token_to_id(c) == base + k, (c, tok.token_to_id(c), base + k)


def build(out_dir, rng):
    lines = training_corpus(rng)
    layouts = {}

    m3_pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(M3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    m3 = train(lines, m3_pre, 3000)
    m3.post_processor = processors.ByteLevel(trim_offsets=False)
    add_m3_tokens(m3)
    layouts["m3"] = m3

    gpt2 = train(lines, pre_tokenizers.ByteLevel(add_prefix_space=True), 1500)
    gpt2.add_tokens([
        AddedToken("<|endoftext|>", special=True, normalized=False),
        AddedToken("<mask>", special=True, lstrip=True, normalized=False),
        AddedToken("[rs]", special=False, rstrip=True, normalized=False),
        AddedToken("foo", special=False, single_word=True, normalized=True),
        AddedToken("<|im|>", special=True, normalized=False),
        AddedToken("<|im|>start", special=False, normalized=False),  # longest match wins
    ])
    layouts["gpt2"] = gpt2

    # nfc and splits: the m3 model (vocab + merges) behind other pipelines
    m3_json = json.loads(m3.to_str())
    nfc_json = json.loads(m3.to_str())
    nfc_json["added_tokens"] = []
    nfc_json["model"]["ignore_merges"] = True
    nfc = Tokenizer.from_str(json.dumps(nfc_json))
    nfc.normalizer = normalizers.Sequence([normalizers.NFC()])
    base = nfc.get_vocab_size()
    nfc.add_tokens([AddedToken("<bos>", special=True, normalized=False),
                    AddedToken("<eos>", special=True, normalized=False),
                    AddedToken("<e\u0301>", special=False, normalized=True),
                    AddedToken("<mm:think>", special=False, normalized=True)] +
                   [AddedToken(c, special=sp, normalized=False) for c, sp in M3_ADDED[:20]])
    nfc.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", base), ("<eos>", base + 1)])
    layouts["nfc"] = nfc

    splits = Tokenizer.from_str(json.dumps(m3_json))
    splits.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"\p{N}+"), behavior="contiguous", invert=True),
        pre_tokenizers.Split(Regex(r"[!?]"), behavior="removed"),
        pre_tokenizers.Split(",", behavior="merged_with_previous"),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
    ])
    layouts["splits"] = splits

    for name, tok in layouts.items():
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        j = json.loads(tok.to_str())
        if name == "gpt2":  # the legacy merges spelling
            j["model"]["merges"] = [f"{a} {b}" for a, b in j["model"]["merges"]]
        text = json.dumps(j, ensure_ascii=False, indent=1)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(text)
        layouts[name] = Tokenizer.from_str(text)  # the reference is the file as written
    return layouts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--random", type=int, default=int(os.environ.get("M3_TOKENIZER_RANDOM", 400)),
                    help="random strings per layout (default: M3_TOKENIZER_RANDOM or 400)")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int(os.environ.get("M3_TOKENIZER_SEED", random.SystemRandom().randrange(1 << 31)))
    print(f"seed {seed} (set M3_TOKENIZER_SEED={seed} to repeat)", flush=True)
    rng = random.Random(seed)
    os.makedirs(a.out_dir, exist_ok=True)
    layouts = build(a.out_dir, rng)
    n_text = n_ids = 0
    with open(os.path.join(a.out_dir, "cases.jsonl"), "w", encoding="utf-8") as f:
        for name, tok in layouts.items():
            prose = training_corpus(rng, 2000)  # realistic text: paragraphs of the trainer's kind of lines
            paragraphs = ["\n".join(prose[k:k + rng.randint(1, 12)]) for k in range(0, 2000, 20)]
            texts = fixed_strings() + paragraphs + random_strings(rng, a.random)
            for t in texts:
                ids = tok.encode(t, add_special_tokens=True).ids
                plain = tok.encode(t, add_special_tokens=False).ids
                dec = tok.decode(plain, skip_special_tokens=False)
                rec = {"layout": name, "kind": "text", "text": t, "ids": ids, "ids_plain": plain, "decoded": dec,
                       "decoded_skip": tok.decode(plain, skip_special_tokens=True), "round_trip": dec == t}
                if name == "nfc" and NFC.normalize_str(t) != unicodedata.normalize("NFC", t):
                    # tokenizers' NFC tables predate some combining classes (U+07FD, ...): flagged,
                    # the C++ test reports and skips these encodes
                    rec["nfc_old_tables"] = True
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                n_text += 1
            vocab = tok.get_vocab_size(with_added_tokens=True)
            special = [i for i, t in tok.get_added_tokens_decoder().items()] or [0]
            for ids in random_id_lists(rng, a.random // 2, vocab, special):
                rec = {"layout": name, "kind": "ids", "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                       "decoded_skip": tok.decode(ids, skip_special_tokens=True)}
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                n_ids += 1
    print(f"wrote {len(layouts)} layouts, {n_text} strings, {n_ids} id lists to {a.out_dir}")


if __name__ == "__main__":
    main()
