"""Test strings and vocabularies for test_tokenizer_c.py (deterministic).

tricky()              short strings that probe the split pattern, the chunking,
                      specials, invalid UTF-8 and NUL (bytes)
long_strings()        strings around the 25 000-char run and 400 000-char block limits
random_bytes(rng, t)  one random byte string mixing all of the above
code_point_lines()    every code point (sampled in unassigned planes 4-13 and 15-16)
                      in contexts that tell the pattern's classes apart
synthetic_k3_ranks()  a 163 584-rank vocabulary (K3's size) grown from the test
                      vocabulary: substrings of pre-tokens of a sample text, then
                      concatenations of random token pairs
"""

import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "reference"))

import kimi_tokenizer as kt  # noqa: E402

TRICKY_STR = [
    "", " ", "  ", "\t", "\n", "\r", "\r\n", "\r\n\r\n  \r\n", "a\r\nb", "\n\n\n", " \n ",
    "x   ", "x \t \n y", "   leading", "trailing   ", "a  \n\n  b", "\t\tindent\n\t\t\tx",
    "Hello world", "Hello world's 12345 !!\n\n  x 中文abc Ab中 hello世界 DON'T",
    "it's it'S it'ſ IT'S I'LL i'Ll we'VE they'Re she'D I'M don't' x'K x'\u212a",
    "'s 's's ''s", "x'ſt", "ſ", "'", "a'", "A'LL", "ǅ'S", "MIXEDcase camelCase XMLHttpRequest",
    "1", "12", "123", "1234", "1234567890" * 10, "3.14159", "١٢٣٤٥", "Ⅻ½¼", "x²³", "①②③",
    "中文字符测试", "東京はabc漢字", "〇〆々ヶ", "中、文。「引用」", "ー中ー", "㐀\U00020000\U0002B739",
    "한국어 텍스트", "ไทยภาษา", "العربية ١٢٣", "עברית", "Привет, мир!", "Ελληνικά", "हिन्दी",
    "ǅungla Ǆ ǈ", "café naïve résumé", "e\u0301\u0302", "\u0301\u0301x", "A\u0301B",
    "😀👍🏽👨\u200d👩\u200d👧\u200d👦🏳️\u200d🌈", "\u200d\u200c", "\ufeffBOM", "x\ufe0fy",
    "a\u00a0b", "\u00a0\u00a0x", "a\u2003b\u3000c", "\u180e", "x\u180ey", "\u180e  ", " \u180e",
    "\x1c\x1d\x1e\x1f", "a\x1cb", "a \x1c b", "\x0b\x0c", "\u0085", "\u2028\u2029", "a \u2028 b",
    "\x00", "a\x00b", "\x00\x00 \x00", "\x7f\x01", "x\u00ad",
    "<|end_of_msg|>", "x[EOS]y", '<|open|>message role="user"<|sep|>hi<|close|>',
    "<|reserved_token_3850|>", "<|reserved_token_9999|>", "<|reserved_token_163600|>",
    "<|end_of_msg|", "<<|end_of_msg|>>", "[BOS][BOS]", " [PAD]", "<osagent_mode>", "[EOS ]",
    "\U00031350\U00031351", "\U0001E4D0\U0001E4F0", "\u0CF3a", "a\U00011F00", "\U0001D2C0\U0001D2C1",
    "\U0001DF25x", "\U0010FFFF", "\ue000\U000F0000", "\U000E0001\U000E0020",
]

TRICKY_BYTES = [
    b"\xff", b"a\xffb", b"\xe2\x82", b"\xe2\x82\xac", b"\xed\xa0\x80", b"\xc0\xaf", b"\xc1\xbf",
    b"\xf4\x90\x80\x80", b"\xf0\x9f\x98", b"abc\x80\x80def", b"<|end_of_msg\xff|>",
    b"\xef\xbb\xbf", b"\x00\xff\x00", b"\xe0\x80\x80", b"\xf5\x80", b" \xff ", b"\xa0 \xc2\xa0",
    b"it'\xc5", b"\xe4\xb8\xad\xe6", b"[EOS]\xfe[EOS]", b"\xfe\xff" * 5,
]


def tricky():
    return [s.encode("utf-8") for s in TRICKY_STR] + TRICKY_BYTES


def long_strings():
    lorem = "Lorem ipsum dolor sit amet, it's 2024: 中文 text\r\n\tx " * 9000
    return [
        b"a" * 25000, b"a" * 25001, b" " * 25001, b"a" * 24999 + b" " + b"b" * 25001,
        ("中" * 25001).encode(), b"\n" * 25001, b"\r\n" * 13000, b"1" * 30000,
        (" " * 60001 + "x" + "中" * 26000 + "\n" * 3 + "ab" * 13000).encode(),
        b"a" * 24995 + b"[EOS]", b"a" * 24996 + b"[EOS]", b"Ab" * 20000, b"A" * 30000,
        ("é" * 30000).encode(), ("\u0301" * 30000).encode(), ("😀" * 30000).encode(),
        b"!" * 30000, b" !" * 20000, b"a" * 20000 + b"\xff" + b"a" * 20000,
        ("\u00a0" * 26000 + "x\x1c" * 13000).encode(),
        b"!\x1c" * 30000,   # isspace alternates, \s does not: one 60 000-char pre-token
        (lorem[:399990] + "<|end_of_msg|>" + lorem[:50]).encode(),   # cut by the 400 000 block
        (lorem[:399980] + "[EOS]" + lorem[:50]).encode(),
        (lorem[:420000]).encode(),
    ]


_POOL = [
    "the", " cat", "Hello", " WORLD", "'s", "'S", "'ll", "'ſ", "123", "4567", " ", "  ", "\t",
    "\n", "\r\n", "\u00a0", "\u3000", "\u2028", "\x1c", "\x00", "中文", "漢字", "、", "。",
    "あいう", "カタカナ", "한글", "ไทย", "مرحبا", "é", "\u0301", "😀", "\u200d", "👍🏽", ".", "!!",
    "...", "-->", "<", "|", ">", "[", "]", "<|end_of_msg|>", "[EOS]", "<|open|>", "<|sep|>",
    "<|reserved_token_3901|>", "<|end_of", "_msg|>", "\u180e", "Ⅻ", "١٢", "\U00031350",
]


def random_bytes(rng, tok=None):
    """A random byte string: raw bytes, or pool pieces, or random scalar values,
    often with an invalid byte or a cut multi-byte character put in."""
    k = rng.random()
    if k < 0.2:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
    if k < 0.4:
        chars = []
        for _ in range(rng.randrange(0, 30)):
            c = rng.randrange(0x110000 - 0x800)
            chars.append(chr(c + 0x800 if c >= 0xD800 else c))
        data = "".join(chars).encode()
    else:
        data = "".join(rng.choice(_POOL) for _ in range(rng.randrange(0, 25))).encode()
    if data and rng.random() < 0.4:
        i = rng.randrange(len(data) + 1)
        ins = rng.choice([b"\xff", b"\x80", b"\xe2\x82", b"\xf0\x9f", b"\xc3", b"\xed\xb0\x80"])
        data = data[:i] + ins + data[i:]
    return data


def code_point_lines(per_line=64):
    cps = [c for c in range(0x40000) if not 0xD800 <= c <= 0xDFFF]
    cps += list(range(0x40000, 0xE0000, 509)) + list(range(0xE0000, 0xE1000))
    cps += list(range(0xE1000, 0x110000, 257)) + [0x10FFFF]
    lines = []
    for i in range(0, len(cps), per_line):
        parts = []
        for cp in cps[i:i + per_line]:
            c = chr(cp)
            parts.append(c + "a" + c + "A" + c + "1" + c + "中" + c + " " + c + "\n" + c +
                         "x'" + c + c + "." + c + "  " + c + "\tx'r" + c + "x'v" + c + "x'l" + c)
        lines.append("".join(parts).encode())
    return lines


def synthetic_k3_ranks(n_ranks=163584, seed=163584):
    ranks = dict(kt.load_tiktoken_bpe(kt.DEFAULT_TIKTOKEN_MODEL))
    rng = random.Random(seed)
    sample = "".join(TRICKY_STR) + long_strings()[-1].decode()[:20000]
    sample += "".join(rng.choice(_POOL) for _ in range(20000))
    for p in kt.pretokenize(sample):
        b = p.encode()
        for i in range(len(b)):
            for j in range(i + 2, min(len(b), i + 16) + 1):
                if b[i:j] not in ranks:
                    ranks[b[i:j]] = len(ranks)
                    if len(ranks) >= n_ranks // 2:
                        break
    toks = list(ranks)
    while len(ranks) < n_ranks:
        t = rng.choice(toks) + rng.choice(toks)
        if len(t) <= 48 and t not in ranks:
            ranks[t] = len(ranks)
            toks.append(t)
    return ranks
