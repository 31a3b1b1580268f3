"""Tests of the reference Kimi tokenizer (kimi_tokenizer.py) and its test vocabulary.

Run from tests/reference:  /usr/bin/python3 -m unittest test_tokenizer
or from the repo root:     /usr/bin/python3 -m unittest discover -s tests/reference -p 'test_*.py'
"""

import base64
import hashlib
import json
import os
import random
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import regex  # noqa: E402

import build_tokenizer  # noqa: E402
import kimi_tokenizer as kt  # noqa: E402

MODEL = kt.DEFAULT_TIKTOKEN_MODEL


def tiny_ranks(*extra):
    """The 256 bytes plus extra tokens at ranks 256, 257, ..."""
    ranks = {bytes([i]): i for i in range(256)}
    for t in extra:
        ranks[t] = len(ranks)
    return ranks


def naive_bpe(piece, ranks):
    """tiktoken's O(n^2) _byte_pair_merge, written plainly, as a cross-check."""
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return [ranks[p] for p in parts]


def random_text(rng, n):
    """Random str mixing scripts, marks, emoji, digits, CR/LF and space runs."""
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789", " ", "   ", "\r\n", "\n", "\t", "'", "'s", "'LL",
        ".,;:!?-()[]{}<>\"/\\@#$%^&*_=+~`|",
        [chr(c) for c in range(0x4E00, 0x9FFF)],     # Han
        [chr(c) for c in range(0x3041, 0x3097)],     # Hiragana
        [chr(c) for c in range(0x0400, 0x0460)],     # Cyrillic
        "éèêëàâäôöûüçñßÉÀÇŒœ",
        [chr(c) for c in range(0x0300, 0x0370)],     # combining marks
        [chr(c) for c in range(0x1F600, 0x1F650)],   # emoji
        "\u00a0\u2003\u3000\u0085\u2028\x0b\x0c\x1c",  # odd white space
        "١٢٣٤٥٦٧٨٩٠Ⅻ½",                              # other numerals
    ]
    out = []
    for _ in range(n):
        if rng.random() < 0.1:  # any scalar value (no surrogates)
            c = rng.randrange(0x110000 - 0x800)
            out.append(chr(c + 0x800 if c >= 0xD800 else c))
        else:
            out.append(rng.choice(rng.choice(pools)))
    return "".join(out)


class PatternTest(unittest.TestCase):
    def test_pattern_matches_spec(self):
        self.assertEqual(len(kt.PAT_ALTERNATIVES), 8)
        self.assertEqual(kt.PAT_STR, "|".join(kt.PAT_ALTERNATIVES))
        root = os.path.dirname(os.path.dirname(HERE))
        for shared in (os.environ.get("K3_SHARED", ""), os.path.join(root, "..", "shared"),
                       "/work/shared"):
            spec = os.path.join(shared, "spec", "K3-ARCHITECTURE.md")
            if shared and os.path.isfile(spec):
                break
        else:
            self.skipTest("spec not found")
        with open(spec, encoding="utf-8") as f:
            text = f.read()
        block = text.split("`pat_str`", 1)[1].split("```", 2)[1]
        lines = [ln for ln in block.split("\n") if ln.strip()]
        self.assertEqual(tuple(lines), kt.PAT_ALTERNATIVES)

    def test_known_pretokens(self):
        s = "Hello world's 12345 !!\n\n  x 中文abc Ab中 hello世界 DON'T"
        self.assertEqual(kt.pretokenize(s), [
            "Hello", " world's", " ", "123", "45", " !!\n\n", " ", " x", " ", "中文",
            "abc", " Ab", "中", " hello", "世界", " DON'T"])
        self.assertEqual(kt.pretokenize("a  \n\n  b"), ["a", "  \n\n", " ", " b"])
        self.assertEqual(kt.pretokenize("x   "), ["x", "   "])

    def test_han_excluded_from_letter_classes(self):
        upper = regex.compile(r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]", flags=regex.V1)
        lower = regex.compile(r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]", flags=regex.V1)
        for c in "中文字国々〇㐀\U00020000":  # Script=Han, all Lo/Nl
            self.assertIsNone(upper.fullmatch(c), c)
            self.assertIsNone(lower.fullmatch(c), c)
        for c in "あアㄱ가ب":  # Lo, not Han
            self.assertIsNotNone(upper.fullmatch(c), c)
            self.assertIsNotNone(lower.fullmatch(c), c)
        # Han runs never merge with neighbouring letters, kana or a space.
        self.assertEqual(kt.pretokenize("東京はabc漢字"), ["東京", "はabc", "漢字"])
        self.assertEqual(kt.pretokenize(" 世界"), [" ", "世界"])

    def test_digits_grouped_by_three(self):
        self.assertEqual(kt.pretokenize("1234567"), ["123", "456", "7"])
        self.assertEqual(kt.pretokenize("12 3456"), ["12", " ", "345", "6"])
        self.assertEqual(kt.pretokenize("١٢٣٤"), ["١٢٣", "٤"])
        rng = random.Random(7)
        for _ in range(200):
            for p in kt.pretokenize(random_text(rng, 40)):
                if regex.fullmatch(r"\p{N}+", p):
                    self.assertLessEqual(len(p), 3)

    def test_pieces_concatenate_to_input(self):
        rng = random.Random(1)
        for _ in range(400):
            s = random_text(rng, rng.randrange(0, 80))
            self.assertEqual("".join(kt.pretokenize(s)), s)

    def test_lookahead_rewrite_is_equivalent(self):
        # The C engine uses PCRE2, where `[X&&[^\p{Han}]]` is written
        # `(?:(?!\p{Han})[X])` (DESIGN §4). Check the two agree.
        pat = kt.PAT_STR
        for cls in (r"\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}", r"\p{Ll}\p{Lm}\p{Lo}\p{M}"):
            pat = pat.replace("[%s&&[^\\p{Han}]]" % cls, "(?:(?!\\p{Han})[%s])" % cls)
        self.assertNotIn("&&", pat)
        rewritten = regex.compile(pat, flags=regex.V0)
        rng = random.Random(2)
        for _ in range(400):
            s = random_text(rng, 60)
            self.assertEqual(rewritten.findall(s), kt.pretokenize(s), repr(s))

    def test_simple_case_folding(self):
        # Rust regex (tiktoken) uses simple case folding: 'S, 'ſ match 's.
        self.assertEqual(kt.pretokenize("it'S"), ["it'S"])
        self.assertEqual(kt.pretokenize("it'\u017f"), ["it'\u017f"])


class ChunkTest(unittest.TestCase):
    def test_split_known_answers(self):
        f = kt.split_whitespaces_or_nonwhitespaces
        self.assertEqual(list(f("abcde", 2)), ["ab", "cd", "e"])
        self.assertEqual(list(f("ab   cd", 2)), ["ab  ", " cd"])
        self.assertEqual(list(f("a b c", 2)), ["a b c"])
        self.assertEqual(list(f("", 2)), [""])

    def test_split_property(self):
        rng = random.Random(3)
        for _ in range(300):
            s = "".join(rng.choice(["a", "b", " ", "\n", "中"]) for _ in range(rng.randrange(60)))
            m = rng.randrange(1, 6)
            parts = list(kt.split_whitespaces_or_nonwhitespaces(s, m))
            self.assertEqual("".join(parts), s)
            for p in parts:
                for run in regex.findall(r"\s+|\S+", p):
                    self.assertLessEqual(len(run), m)

    def test_chunk_text_small_limits(self):
        self.assertEqual(list(kt.chunk_text("aaaaa bb", max_chars=4, max_run=2)),
                         ["aa", "aa", "a bb"])

    def test_long_runs_round_trip(self):
        tok = kt.Tokenizer(kt.load_tiktoken_bpe(MODEL))
        s = " " * 60001 + "x" + "中" * 26000 + "\n" * 3 + "ab" * 13000
        ids = tok.encode(s)
        self.assertEqual(tok.decode(ids), s.encode())
        chunks = list(kt.chunk_text(s))
        # 25000 + 25000 spaces | 10001 spaces + 25000 non-space | 1001 + "\n"*3 + 25000 | 1000
        self.assertEqual([len(c) for c in chunks], [25000, 25000, 35001, 26004, 1000])
        expect = []
        for c in chunks:
            expect.extend(tok.encode(c))
        self.assertEqual(ids, expect)


class BpeTest(unittest.TestCase):
    def test_tiny_known_answers(self):
        ranks = tiny_ranks(b"ab", b"abc")
        tok = kt.Tokenizer(ranks)
        self.assertEqual(tok.encode("abcab"), [257, 256])
        self.assertEqual(tok.encode("ab abc"), [256, 32, 257])
        # Lowest rank wins over leftmost.
        tok2 = kt.Tokenizer(tiny_ranks(b"bc", b"ab"))
        self.assertEqual(tok2.encode("abc"), [97, 256])
        # Leftmost wins between equal ranks.
        tok3 = kt.Tokenizer(tiny_ranks(b"aa"))
        self.assertEqual(tok3.encode("aaaaa"), [256, 256, 97])
        self.assertEqual(tok3.encode("é"), [0xC3, 0xA9])

    def test_whole_piece_shortcut(self):
        # "abcd" is not reachable by merges (a|bc|d is stuck) but tiktoken
        # emits a pre-token that is itself a token directly.
        ranks = tiny_ranks(b"bc", b"abcd")
        self.assertEqual(kt.bpe_merge(b"abcd", ranks), [97, 256, 100])
        self.assertEqual(kt.Tokenizer(ranks).encode("abcd"), [257])
        self.assertEqual(kt.Tokenizer(ranks).encode("abcde"), [97, 256, 100, 101])

    def test_heap_equals_naive(self):
        ranks = kt.load_tiktoken_bpe(MODEL)
        rng = random.Random(5)
        for _ in range(300):
            for p in kt.pretokenize(random_text(rng, 50)):
                b = p.encode()
                self.assertEqual(kt.bpe_merge(b, ranks), naive_bpe(b, ranks), p)
        for s in ("the the the", "licensee", "aaaaaaaaaaaaa", " " * 37, "模型模型处理器"):
            b = s.encode()
            self.assertEqual(kt.bpe_merge(b, ranks), naive_bpe(b, ranks))

    def test_every_token_reachable(self):
        ranks = kt.load_tiktoken_bpe(MODEL)
        for t, r in ranks.items():
            self.assertEqual(kt.bpe_merge(t, ranks), [r], t)


class TokenizerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.ids = kt.write_tokenizer_files(cls.tmp.name)
        cls.tok = kt.Tokenizer.from_dir(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_vocab_and_special_ids(self):
        tok, n = self.tok, 3840
        self.assertEqual(tok.n_ranks, n)
        self.assertEqual(tok.n_vocab, 4096)
        self.assertEqual(self.ids, {"bos_token_id": n, "eos_token_id": n + 2,
                                    "pad_token_id": n + 255, "vocab_size": 4096})
        for off, name in kt.K3_NAMED_SPECIAL_OFFSETS.items():
            self.assertEqual(tok.special_ids[name], n + off)
        self.assertEqual(tok.special_ids["<|reserved_token_3848|>"], n + 8)
        self.assertEqual(len(tok.special_ids), 256)
        self.assertEqual(tok.decode([n + 2]), b"<|end_of_msg|>")
        self.assertEqual(tok.id_to_bytes(65), b"A")
        with self.assertRaises(ValueError):
            tok.id_to_bytes(4096)

    def test_config_layout_and_determinism(self):
        with open(os.path.join(self.tmp.name, "tokenizer_config.json"), "rb") as f:
            first = f.read()
        cfg = json.loads(first)
        self.assertEqual(cfg["eos_token"], "<|end_of_msg|>")
        self.assertEqual(cfg["auto_map"],
                         {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]})
        self.assertEqual(cfg["added_tokens_decoder"]["3842"], {
            "content": "<|end_of_msg|>", "lstrip": False, "normalized": False,
            "rstrip": False, "single_word": False, "special": True})
        self.assertEqual(list(cfg), sorted(cfg))
        with tempfile.TemporaryDirectory() as d:
            kt.write_tokenizer_files(d)
            with open(os.path.join(d, "tokenizer_config.json"), "rb") as f:
                self.assertEqual(f.read(), first)
            with open(os.path.join(d, "tiktoken.model"), "rb") as f, open(MODEL, "rb") as g:
                self.assertEqual(f.read(), g.read())

    def test_round_trip_random(self):
        rng = random.Random(11)
        for _ in range(400):
            s = random_text(rng, rng.randrange(0, 100))
            ids = self.tok.encode(s)
            self.assertTrue(all(0 <= i < self.tok.n_ranks for i in ids))
            self.assertEqual(self.tok.decode(ids), s.encode("utf-8"), repr(s))

    def test_specials(self):
        tok, n = self.tok, 3840
        s = "<|open|>message role=\"user\"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>"
        ids = tok.encode(s, allow_special=True)
        self.assertEqual([i for i in ids if i >= n], [n + 3, n + 5, n + 4, n + 5, n + 2])
        self.assertEqual(tok.decode(ids), s.encode())
        # Text between specials is encoded as if alone.
        self.assertEqual(ids[:1] + ids[-1:], [n + 3, n + 2])
        self.assertEqual(tok.encode("x[EOS]y", allow_special=True),
                         tok.encode("x") + [n + 1] + tok.encode("y"))
        self.assertEqual(tok.encode("<|reserved_token_3850|>", allow_special=True), [n + 10])
        # Disallowed: plain text, round-trips, no special id.
        plain = tok.encode(s)
        self.assertTrue(all(i < n for i in plain))
        self.assertEqual(tok.decode(plain), s.encode())
        # No BOS is ever added.
        self.assertEqual(tok.encode(""), [])
        self.assertNotEqual(tok.encode("Hello")[0], n)

    def test_encode_requires_str(self):
        with self.assertRaises(TypeError):
            self.tok.encode(b"abc")


class LoaderTest(unittest.TestCase):
    def load(self, lines):
        with tempfile.NamedTemporaryFile("wb", suffix=".model", delete=False) as f:
            f.write(b"".join(ln + b"\n" for ln in lines))
        try:
            return kt.load_tiktoken_bpe(f.name)
        finally:
            os.unlink(f.name)

    def lines(self, ranks):
        return [base64.b64encode(t) + b" " + str(r).encode()
                for t, r in sorted(ranks.items(), key=lambda kv: kv[1])]

    def test_valid(self):
        ranks = tiny_ranks(b"ab", b"abc")
        self.assertEqual(self.load(self.lines(ranks)), ranks)
        self.assertEqual(kt.dump_tiktoken_bpe(ranks), b"".join(ln + b"\n" for ln in self.lines(ranks)))

    def test_rejects(self):
        good = self.lines(tiny_ranks(b"ab", b"abc"))
        cases = {
            "bad base64": good[:-1] + [b"Y*Jj 257"],
            "bad base64 padding": good[:-1] + [b"YWJ 257"],
            "duplicate rank": good[:-1] + [base64.b64encode(b"abc") + b" 256"],
            "rank gap": good[:-1] + [base64.b64encode(b"abc") + b" 258"],
            "duplicate token": good + [base64.b64encode(b"ab") + b" 258"],
            "missing byte": [ln for ln in good if not ln.endswith(b" 65")],
            "bad rank": good[:-1] + [base64.b64encode(b"abc") + b" x1"],
            "negative rank": good[:-1] + [base64.b64encode(b"abc") + b" -1"],
            "three fields": good[:-1] + [base64.b64encode(b"abc") + b" 257 1"],
        }
        for what, lines in cases.items():
            with self.subTest(what), self.assertRaises(ValueError):
                self.load(lines)

    def test_rejects_bad_special_config(self):
        with tempfile.TemporaryDirectory() as d:
            kt.write_tokenizer_files(d)
            cfg_path = os.path.join(d, "tokenizer_config.json")
            with open(cfg_path) as f:
                cfg = json.load(f)
            cfg["added_tokens_decoder"]["5000"] = {"content": "<x>", "special": True}
            with open(cfg_path, "w") as f:
                json.dump(cfg, f)
            with self.assertRaises(ValueError):
                kt.Tokenizer.from_dir(d)


class BuildTest(unittest.TestCase):
    def test_committed_model_is_reproducible(self):
        if not build_tokenizer.sources_available():
            self.skipTest("training files absent or different from Debian 12's")
        with open(MODEL, "rb") as f:
            committed = f.read()
        built = build_tokenizer.build_tiktoken_model(3840, check=False)
        self.assertEqual(hashlib.sha256(built).hexdigest(), hashlib.sha256(committed).hexdigest())

    def test_small_build_is_consistent(self):
        # Training on a small text: ranks valid, all tokens reachable.
        texts = [("the cat sat on the mat; the cats sat. 模型模型 123123", 1)]
        ranks = build_tokenizer.train(texts, 270)
        self.assertEqual(len(ranks), 270)
        build_tokenizer.verify(ranks, texts)


if __name__ == "__main__":
    unittest.main()
