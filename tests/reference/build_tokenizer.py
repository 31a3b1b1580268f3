#!/usr/bin/python3
"""Train the small byte-level BPE vocabulary used by k3's test checkpoints.

    cd tests/reference && /usr/bin/python3 build_tokenizer.py --out data/tiktoken.model

Produces a tiktoken.model (``base64(token) rank`` per line) with exactly
``--ranks`` ranks (default 3840, so vocab_size = 3840 + 256 specials = 4096):

* ranks 0..255 are the 256 single bytes, in byte order;
* then merges learned greedily by pair frequency over the pre-tokens produced
  by Kimi's split pattern (kimi_tokenizer.PAT_STR). Ties are broken by the
  lowest (left rank, right rank). Each merge whose concatenation is a new byte
  string gets the next rank; a merge that recreates an existing string reuses
  its rank (tiktoken ranks byte strings, so they must be unique).

Training text (see data/TOKENIZER-SOURCE.md): the 14 regular files of Debian
12's /usr/share/common-licenses (package base-files), checked by SHA-256, plus
the multilingual sample below, counted SAMPLE_WEIGHT times so that Han, kana,
Cyrillic, accented Latin, digits and code get merges of their own.

The result is deterministic. After training the script checks that every
learned token is reachable by tiktoken's rank-BPE (bpe_merge(token) == [rank])
and that the training text round-trips.
"""

import argparse
import hashlib
import heapq
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kimi_tokenizer as kt  # noqa: E402

LICENSE_DIR = "/usr/share/common-licenses"
# name -> SHA-256 as shipped by Debian 12 base-files (12.4+deb12u11).
LICENSE_FILES = {
    "Apache-2.0": "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30",
    "Artistic": "b7fd9b73ea99602016a326e0b62e6646060d18febdd065ceca8bb482208c3d88",
    "BSD": "5d588eb3b157d52112afea935c88a7ff9efddc1e2d95a42c25d3b96ad9055008",
    "CC0-1.0": "a2010f343487d3f7618affe54f789f5487602331c0a8d03f49e9a7c547cf0499",
    "GFDL-1.2": "d8e94ae5fdb5433fcae2961aeb1a8cf17174d6f4a0465d24bf37dd8a038bd439",
    "GFDL-1.3": "110535522396708cea37c72a802c5e7e81391139f5f7985631c93ef242b206a4",
    "GPL-1": "d77d235e41d54594865151f4751e835c5a82322b0e87ace266567c3391a4b912",
    "GPL-2": "8177f97513213526df2cf6184d8ff986c675afb514d4e68a404010521b880643",
    "GPL-3": "3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986",
    "LGPL-2": "681e386e44a19d7d0674b4320272c90e66b6610b741e7e6305f8219c42e85366",
    "LGPL-2.1": "dc626520dcd53a22f727af3ee42c770e56c97a64fe3adb063799d8ab032fe551",
    "LGPL-3": "e3a994d82e644b03a792a930f574002658412f62407f5fee083f2555c5f23118",
    "MPL-1.1": "f849fc26a7a99981611a3a370e83078deb617d12a45776d6c4cada4d338be469",
    "MPL-2.0": "fab3dd6bdab226f1c08630b1dd917e11fcb4ec5e1e020e2c16f83a0a13863e85",
}

SAMPLE_WEIGHT = 3
MULTILINGUAL_SAMPLE = """\
人工智能正在改变世界。我们的模型在中央处理器上运行，不需要图形处理器。
今天天气很好，我们去公园散步吧。中文分词是一个有趣的问题，中文文本没有空格。
大型语言模型的推理需要大量内存，专家混合模型每个词元只激活一部分专家。
日本語の文章も少し入れておきます。東京は日本の首都です。ひらがなとカタカナ、そして漢字を使います。
コンピューターでプログラムを書くのは楽しいです。今日はいい天気ですね。
한국어 문장도 조금 있습니다. 서울은 대한민국의 수도입니다.
Привет, мир! Это небольшой пример русского текста. Москва — столица России.
Съешь же ещё этих мягких французских булок, да выпей чаю.
Γειά σου κόσμε! Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.
Le cœur a ses raisons que la raison ne connaît point. Où est l'hôtel? Ça va très bien, merci.
Über den Wolken muss die Freiheit wohl grenzenlos sein. Grüße aus München, schöne Straße!
El niño comió jalapeños en la montaña. ¿Dónde está la estación? ¡Qué día tan bonito!
A ação é rápida; não há razão para pânico. Tiếng Việt có dấu: xin chào các bạn.
مرحبا بالعالم. हिन्दी में नमस्ते दुनिया। שלום עולם.
Numbers: 0 1 2 3 12 123 1234 12345 3.14159 2.71828 1e-5 0x7fff 65536 163584 2026-07-16 10:30:00
Prices $19.99, €5,50, 100% done, 7/8 passed, version v1.2.3, ids [163584, 163585, 163586].
Emoji 😀 🚀 ✅ and symbols ≤ ≥ ≠ → ← ∑ √ ∞ ± × ÷ ° © ™ … “quoted” ‘single’ «guillemets» — dash.
```c
#include <stdint.h>
static inline float silu(float x) { return x / (1.0f + expf(-x)); }
int main(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        printf("%d: %s\\n", i, argv[i]);
    }
    return 0;
}
```
```python
def softmax(x):
    m = max(x)
    e = [math.exp(v - m) for v in x]
    return [v / sum(e) for v in e]

if __name__ == "__main__":
    print(softmax([1.0, 2.0, 3.0]))
```
{"role": "user", "content": "Hello, K3!"}\t<tag attr="value">text</tag>\r\n
"""


def training_texts():
    """[(text, weight)] in a fixed order; raises FileNotFoundError/ValueError
    if a license file is missing or differs from the recorded hash."""
    texts = []
    for name in sorted(LICENSE_FILES):
        with open(os.path.join(LICENSE_DIR, name), "rb") as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != LICENSE_FILES[name]:
            raise ValueError("%s/%s differs from the recorded SHA-256" % (LICENSE_DIR, name))
        texts.append((data.decode("utf-8"), 1))
    texts.append((MULTILINGUAL_SAMPLE, SAMPLE_WEIGHT))
    return texts


def sources_available():
    """True if every training file is present with the recorded content."""
    try:
        training_texts()
    except (OSError, ValueError):
        return False
    return True


def name_apart(tok):
    """True for a token that joins a word's leading non-letter (a space, a quote) to a capital letter
    (" J", '"On', " Jud"): a tokenizer without them writes a capitalised word with the same ids
    whatever comes before it, so " Jude" in a question is " " + the ids of "Jude" in a tool call's
    argument, and a model can copy a name it has never seen from one to the other."""
    return len(tok) >= 2 and not chr(tok[0]).isalpha() and 65 <= tok[1] <= 90


def train(texts, n_ranks, banned=None):
    """Greedy byte-level BPE. Returns {token_bytes: rank} with n_ranks entries. banned(bytes):
    merges that would make such a token are never made."""
    if n_ranks < 256:
        raise ValueError("need at least 256 ranks")
    # Pre-token frequencies (weights multiply counts).
    counts = {}
    for text, weight in texts:
        for p in kt.pretokenize(text):
            b = p.encode("utf-8")
            counts[b] = counts.get(b, 0) + weight
    words = sorted(counts)
    freqs = [counts[w] for w in words]
    syms = [list(w) for w in words]  # symbols are ranks; bytes start as ranks 0..255

    vocab = [bytes([i]) for i in range(256)]
    tok_id = {t: i for i, t in enumerate(vocab)}
    pair_count = {}
    pair_words = {}
    for wi, s in enumerate(syms):
        for p in zip(s, s[1:]):
            pair_count[p] = pair_count.get(p, 0) + freqs[wi]
            pair_words.setdefault(p, set()).add(wi)
    # Max-heap on count, ties by lowest (left, right); stale entries skipped.
    heap = [(-c, a, b) for (a, b), c in pair_count.items()]
    heapq.heapify(heap)
    skipped = set()

    while len(vocab) < n_ranks:
        if not heap:
            raise ValueError("training text too small for %d ranks" % n_ranks)
        negc, a, b = heapq.heappop(heap)
        if pair_count.get((a, b), 0) != -negc:
            continue
        merged = vocab[a] + vocab[b]
        if banned and banned(merged):
            skipped.add((a, b))              # its count kept up to date, never pushed again
            continue
        new = tok_id.get(merged)
        if new is None:
            new = len(vocab)
            vocab.append(merged)
            tok_id[merged] = new
        changed = set()
        for wi in sorted(pair_words.pop((a, b))):
            s, f = syms[wi], freqs[wi]
            for p in zip(s, s[1:]):
                pair_count[p] -= f
                changed.add(p)
            ns, i = [], 0
            while i < len(s):  # merge left to right, non-overlapping
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    ns.append(new)
                    i += 2
                else:
                    ns.append(s[i])
                    i += 1
            syms[wi] = ns
            for p in zip(ns, ns[1:]):
                pair_count[p] = pair_count.get(p, 0) + f
                pair_words.setdefault(p, set()).add(wi)
                changed.add(p)
        for p in sorted(changed):
            c = pair_count[p]
            if c <= 0:
                del pair_count[p]
            elif p not in skipped:
                heapq.heappush(heap, (-c, p[0], p[1]))
    return {t: i for i, t in enumerate(vocab)}


def verify(ranks, texts):
    """Every token reachable by rank-BPE; the training text round-trips."""
    bad = [r for t, r in ranks.items() if kt.bpe_merge(t, ranks) != [r]]
    if bad:
        raise ValueError("%d tokens are not reachable by rank-BPE, e.g. rank %d"
                         % (len(bad), bad[0]))
    tok = kt.Tokenizer(ranks)
    n_tokens = n_bytes = 0
    for text, _ in texts:
        ids = tok.encode(text)
        if tok.decode(ids) != text.encode("utf-8"):
            raise ValueError("training text does not round-trip")
        n_tokens += len(ids)
        n_bytes += len(text.encode("utf-8"))
    return n_tokens, n_bytes


def build_tiktoken_model(n_ranks=3840, check=True):
    """The tiktoken.model bytes (deterministic)."""
    texts = training_texts()
    ranks = train(texts, n_ranks)
    if check:
        verify(ranks, texts)
    return kt.dump_tiktoken_bpe(ranks)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output tiktoken.model path")
    ap.add_argument("--ranks", type=int, default=3840, help="number of BPE ranks")
    args = ap.parse_args(argv)
    t0 = time.time()
    texts = training_texts()
    ranks = train(texts, args.ranks)
    t1 = time.time()
    n_tokens, n_bytes = verify(ranks, texts)
    data = kt.dump_tiktoken_bpe(ranks)
    with open(args.out, "wb") as f:
        f.write(data)
    print("wrote %s: %d ranks (vocab_size %d), sha256 %s" % (
        args.out, len(ranks), len(ranks) + kt.NUM_RESERVED_SPECIAL_TOKENS,
        hashlib.sha256(data).hexdigest()))
    print("train %.1fs, verify %.1fs; training text %d bytes -> %d tokens (%.2f bytes/token)"
          % (t1 - t0, time.time() - t1, n_bytes, n_tokens, n_bytes / max(n_tokens, 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
