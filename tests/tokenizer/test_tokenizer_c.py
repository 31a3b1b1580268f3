"""k3run's C tokenizer against the Python reference (tests/reference/kimi_tokenizer.py).

Runs the C driver k3_tokdump (path in $K3_TOKDUMP) and compares, string by
string, its ids, its pieces (pre-tokens, specials, invalid bytes) and its
decoding with the reference's encode_bytes / PAT / chunk_text:

  - a corpus of tricky strings, with specials disallowed and allowed
  - every code point in contexts that tell the split pattern's classes apart
  - every code point in the chunker's whitespace / non-whitespace runs (str.isspace)
  - a few thousand random byte strings: ids equal, decode(encode(x)) == x
  - K3's released tokenizer_config.json with a synthetic 163 584-rank vocabulary
  - loader errors: whatever the reference refuses, the C loader refuses too

Run: K3_TOKDUMP=build/tests/k3_tokdump /usr/bin/python3 -m unittest discover \
         -s tests/tokenizer -p 'test_*.py'
"""

import base64
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, HERE)

import kimi_tokenizer as kt  # noqa: E402
import tok_corpus  # noqa: E402

FIXTURE_CONFIG = os.path.join(HERE, "data", "kimi-k3-tokenizer_config.json")
TOKDUMP = os.environ.get("K3_TOKDUMP", os.path.join(ROOT, "build", "tests", "k3_tokdump"))


def tokdump(args, lines, input_is_hex=True):
    """Run k3_tokdump with one input line per item; returns its output lines."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        for x in lines:
            f.write((x.hex() if input_is_hex else x) + "\n")
    try:
        p = subprocess.run([TOKDUMP] + args + [f.name], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if p.returncode != 0:
        raise AssertionError("k3_tokdump %s failed (%d): %s" % (args, p.returncode, p.stderr))
    out = p.stdout.split("\n")
    assert out[-1] == "", "output does not end with a newline"
    out = out[:-1]
    assert len(out) == len(lines), (len(out), len(lines))
    return out


def ref_pieces(tok, data, allow_special):
    """The reference's pieces in k3_tokdump --split notation."""
    out = []
    for part in kt.split_utf8_runs(data):
        if isinstance(part, int):
            out.append("x")
            continue
        for chunk in kt.chunk_text(part):
            segs, pos = [], 0
            if allow_special:
                for m in tok._special_re.finditer(chunk):
                    segs.append((chunk[pos:m.start()], None))
                    segs.append((None, tok.special_ids[m.group()]))
                    pos = m.end()
            segs.append((chunk[pos:], None))
            for text, sid in segs:
                if text is None:
                    out.append("s%d" % sid)
                else:
                    out.extend(str(len(p.encode())) for p in kt.PAT.findall(text))
    return " ".join(out)


def ids_line(ids):
    return " ".join(map(str, ids))


class Base(unittest.TestCase):
    vocab_dir = None

    @classmethod
    def setUpClass(cls):
        if not os.path.isfile(TOKDUMP):
            raise unittest.SkipTest("k3_tokdump not built (set K3_TOKDUMP)")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.vocab_dir = cls.make_vocab(cls.tmp.name)
        cls.tok = kt.Tokenizer.from_dir(cls.vocab_dir)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @classmethod
    def make_vocab(cls, d):
        kt.write_tokenizer_files(d)
        return d

    def c(self, args, lines):
        return tokdump(["--dir", self.vocab_dir] + args, lines)

    def compare_ids(self, datas, special):
        got = self.c(["--special"] if special else [], datas)
        for x, g in zip(datas, got):
            want = ids_line(self.tok.encode_bytes(x, allow_special=special))
            if g != want:
                self.fail("ids differ (special=%d) for %r:\n C  %s\n py %s"
                          % (special, x[:200], g[:400], want[:400]))
        return got

    def compare_split(self, datas, special):
        got = self.c(["--split"] + (["--special"] if special else []), datas)
        for x, g in zip(datas, got):
            want = ref_pieces(self.tok, x, special)
            if g != want:
                self.fail("pieces differ (special=%d) for %r:\n C  %s\n py %s"
                          % (special, x[:200], g[:400], want[:400]))

    def check_round_trip(self, datas, special):
        ids = self.c(["--special"] if special else [], datas)
        back = tokdump(["--dir", self.vocab_dir, "--decode"], ids, input_is_hex=False)
        for x, b in zip(datas, back):
            self.assertEqual(bytes.fromhex(b), x)


class CorpusTest(Base):
    def test_tricky_ids(self):
        for special in (0, 1):
            self.compare_ids(tok_corpus.tricky(), special)

    def test_tricky_pieces(self):
        for special in (0, 1):
            self.compare_split(tok_corpus.tricky(), special)

    def test_long_strings(self):
        longs = tok_corpus.long_strings()
        for special in (0, 1):
            self.compare_ids(longs, special)
        self.compare_split(longs, 1)
        self.check_round_trip(longs, 1)

    def test_known_answers(self):
        n = self.tok.n_ranks
        got = self.c(["--special"], ["x[EOS]y".encode(), b"<|end_of_msg|>",
                                     b"<|reserved_token_3850|>", b"a" * 24996 + b"[EOS]"])
        self.assertEqual(got[0].split()[1], str(n + 1))
        self.assertEqual(got[1], str(n + 2))
        self.assertEqual(got[2], str(n + 10))
        self.assertNotIn(str(n + 1), got[3].split())   # cut by the 25 000-run limit
        self.assertEqual(self.c([], [b""]), [""])       # no BOS

    def test_random_round_trip(self):
        rng = random.Random(20240601)
        datas = [tok_corpus.random_bytes(rng, self.tok) for _ in range(3000)]
        for special in (0, 1):
            self.compare_ids(datas, special)
        self.check_round_trip(datas, 0)
        self.check_round_trip(datas, 1)
        self.compare_split(datas[:500], 1)

    def test_info(self):
        p = subprocess.run([TOKDUMP, "--dir", self.vocab_dir, "--info"], capture_output=True,
                           text=True, check=True)
        lines = p.stdout.splitlines()
        n = self.tok.n_ranks
        self.assertEqual(lines[:2], ["n_ranks %d" % n, "n_ids %d" % (n + 256)])
        names = {int(ln.split()[1]): bytes.fromhex(ln.split()[2]) for ln in lines[2:]}
        self.assertEqual(names, {i: s.encode() for i, s in self.tok.special_names.items()})


class ClassTest(Base):
    """Every code point in contexts that tell the split pattern's classes apart."""

    def test_every_code_point(self):
        lines = tok_corpus.code_point_lines()
        self.compare_split(lines, 0)


class IsSpaceTest(Base):
    """The chunker's str.isspace, for every code point: a run of exactly
    25 001 chars whose first k are the code points under test is cut before its
    last char only if the C side puts all k in the same class as Python does."""

    def test_every_code_point(self):
        cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
        spaces = [chr(c) for c in cps if chr(c).isspace()]
        others = [chr(c) for c in cps if not chr(c).isspace()]
        self.assertEqual(len(spaces), 29)
        lines = ["".join(spaces) + " " * (kt.MAX_NO_WHITESPACES_CHARS + 1 - len(spaces))]
        k = 24000
        for i in range(0, len(others), k):
            block = "".join(others[i:i + k])
            lines.append(block + "x" * (kt.MAX_NO_WHITESPACES_CHARS + 1 - len(block)))
        datas = [ln.encode() for ln in lines]
        for x in lines:
            self.assertEqual(len(list(kt.chunk_text(x))), 2)
        self.compare_split(datas, 0)


class ReleasedConfigTest(Base):
    """K3's tokenizer_config.json as released, with a synthetic 163 584-rank vocabulary."""

    @classmethod
    def make_vocab(cls, d):
        ranks = tok_corpus.synthetic_k3_ranks()
        with open(os.path.join(d, "tiktoken.model"), "wb") as f:
            f.write(kt.dump_tiktoken_bpe(ranks))
        shutil.copyfile(FIXTURE_CONFIG, os.path.join(d, "tokenizer_config.json"))
        return d

    def test_shape_and_specials(self):
        self.assertEqual(self.tok.n_ranks, 163584)
        p = subprocess.run([TOKDUMP, "--dir", self.vocab_dir, "--info"], capture_output=True,
                           text=True, check=True)
        lines = p.stdout.splitlines()
        self.assertEqual(lines[:2], ["n_ranks 163584", "n_ids 163840"])
        names = {int(ln.split()[1]): bytes.fromhex(ln.split()[2]).decode() for ln in lines[2:]}
        self.assertEqual(names, self.tok.special_names)
        self.assertEqual(names[163586], "<|end_of_msg|>")
        self.assertEqual(names[163587], "<|open|>")          # "special": false, still special
        self.assertEqual(names[163592], "<|reserved_token_163592|>")
        chat = '<|open|>message role="user"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>'
        got = self.c(["--special"], [chat.encode()])[0].split()
        self.assertEqual([int(i) for i in got if int(i) >= 163584],
                         [163587, 163589, 163588, 163589, 163586])

    def test_corpus(self):
        datas = tok_corpus.tricky() + tok_corpus.long_strings()[:6]
        rng = random.Random(77)
        datas += [tok_corpus.random_bytes(rng, self.tok) for _ in range(1000)]
        for special in (0, 1):
            self.compare_ids(datas, special)
        self.check_round_trip(datas, 1)


class EncodeBytesTest(unittest.TestCase):
    """The reference's encode_bytes (k3's rule for bytes that are not UTF-8) itself."""

    @classmethod
    def setUpClass(cls):
        cls.tok = kt.Tokenizer(kt.load_tiktoken_bpe(kt.DEFAULT_TIKTOKEN_MODEL))

    def test_rule(self):
        self.assertEqual(list(kt.split_utf8_runs(b"ab\xff\xe2\x82c\xed\xa0\x80\xf0\x9f\x98\x80\x00")),
                         ["ab", 0xff, 0xe2, 0x82, "c", 0xed, 0xa0, 0x80, "\U0001F600\x00"])
        self.assertEqual(list(kt.split_utf8_runs(b"")), [])
        a = self.tok.encode("a" * 30)
        self.assertEqual(self.tok.encode_bytes(b"a" * 30 + b"\xff" + b"a" * 30), a + [0xff] + a)
        with self.assertRaises(TypeError):
            self.tok.encode_bytes("text")

    def test_properties(self):
        rng = random.Random(5)
        for _ in range(500):
            x = tok_corpus.random_bytes(rng)
            self.assertEqual(self.tok.decode(self.tok.encode_bytes(x)), x)
            try:
                s = x.decode("utf-8")
            except UnicodeDecodeError:
                continue
            self.assertEqual(self.tok.encode_bytes(x), self.tok.encode(s))


class LoaderTest(unittest.TestCase):
    """Vocabularies the reference refuses make the C loader fail, naming file and line."""

    def setUp(self):
        if not os.path.isfile(TOKDUMP):
            self.skipTest("k3_tokdump not built (set K3_TOKDUMP)")

    def run_c(self, model_bytes, config=None):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "tiktoken.model")
            with open(path, "wb") as f:
                f.write(model_bytes)
            args = [TOKDUMP, "--vocab", path, "--info"]
            if config is not None:
                cpath = os.path.join(d, "tokenizer_config.json")
                with open(cpath, "w") as f:
                    f.write(config)
                args += ["--config", cpath]
            p = subprocess.run(args, capture_output=True, text=True)
            return p.returncode, p.stderr.replace(d, "D")

    def test_rejects_what_the_reference_rejects(self):
        ranks = {bytes([i]): i for i in range(256)}
        ranks[b"ab"], ranks[b"abc"] = 256, 257
        good = [base64.b64encode(t) + b" " + str(r).encode() for t, r in ranks.items()]
        cases = {
            "bad base64": (good[:-1] + [b"Y*Jj 257"], "line 258: bad base64"),
            "bad padding": (good[:-1] + [b"YWJ 257"], "line 258: bad base64"),
            "duplicate rank": (good[:-1] + [base64.b64encode(b"abc") + b" 256"],
                               "line 258: duplicate rank 256 (first on line 257)"),
            "rank gap": (good[:-1] + [base64.b64encode(b"abc") + b" 258"], "line 258: rank 258"),
            "duplicate token": (good + [base64.b64encode(b"ab") + b" 258"],
                                "line 259: duplicate token (the same bytes as line 257)"),
            "missing byte": ([ln for ln in good if not ln.endswith(b" 65")] + [
                base64.b64encode(b"xyz") + b" 65"], "single byte 0x41"),
            "bad rank": (good[:-1] + [base64.b64encode(b"abc") + b" x1"], "line 258: bad rank"),
            "negative rank": (good[:-1] + [base64.b64encode(b"abc") + b" -1"], "line 258: bad rank"),
            "three fields": (good[:-1] + [base64.b64encode(b"abc") + b" 257 1"], "line 258: expected"),
        }
        for what, (lines, msg) in cases.items():
            with self.subTest(what):
                data = b"".join(ln + b"\n" for ln in lines)
                with tempfile.NamedTemporaryFile("wb", delete=False) as f:
                    f.write(data)
                try:
                    with self.assertRaises(ValueError):
                        kt.load_tiktoken_bpe(f.name)
                finally:
                    os.unlink(f.name)
                rc, err = self.run_c(data)
                self.assertEqual(rc, 1, err)
                self.assertIn("'D/tiktoken.model': ", err)
                self.assertIn(msg, err)

    def test_rejects_bad_special_config(self):
        model = kt.dump_tiktoken_bpe({bytes([i]): i for i in range(256)})
        base = kt.k3_tokenizer_config(256)
        bad_id = json.loads(json.dumps(base))
        bad_id["added_tokens_decoder"]["5000"] = {"content": "<x>", "special": True}
        clash = json.loads(json.dumps(base))
        clash["added_tokens_decoder"]["100"] = {"content": "<x>", "special": True}
        twice = json.loads(json.dumps(base))
        twice["added_tokens_decoder"]["300"] = {"content": "[EOS]", "special": True}
        for what, cfg, msg in (("outside", bad_id, "outside the special range 256..511"),
                               ("rank", clash, "collides with a BPE rank"),
                               ("twice", twice, "'[EOS]' names ids 257 and 300")):
            with self.subTest(what):
                rc, err = self.run_c(model, json.dumps(cfg))
                self.assertEqual(rc, 1, err)
                self.assertIn(msg, err)
        rc, err = self.run_c(model, json.dumps(base))
        self.assertEqual(rc, 0, err)


if __name__ == "__main__":
    unittest.main()
