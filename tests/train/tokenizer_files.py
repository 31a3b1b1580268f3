"""The demo model's tokenizer: byte-level BPE trained on the training split only.

    tokenizer_files.py --data DIR --out MODEL_DIR [--ranks 3840] [--names-apart]

Trains on DIR/kjv-train.txt and the text pieces of DIR/chat-train.jsonl (never on the held-out
books), with Kimi's split pattern (tests/reference/build_tokenizer.py's trainer), and writes
MODEL_DIR/tiktoken.model and MODEL_DIR/tokenizer_config.json: the released K3
tokenizer_config.json with every id moved down by 163584 - ranks, so the 16 named specials
sit after the ranks at K3's offsets (<|end_of_msg|> = ranks+2, <|open|> +3, <|close|> +4,
<|sep|> +5, ...), `special: false` on the three chat markers exactly as released.

--names-apart: no token joins a word's leading space or punctuation to a capital letter
(build_tokenizer.name_apart), so a capitalised word has the same ids wherever it stands: " Jude" in
a question is " " and then exactly the ids of "Jude" at the start of a tool call's argument. The
demo model that calls lookup_verse needs it to copy a book's name it never saw (issue 34).
"""

import argparse
import hashlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "reference")
sys.path.insert(0, REF)
import build_tokenizer  # noqa: E402
import kimi_tokenizer as kt  # noqa: E402

# Kimi K3's released tokenizer_config.json, byte for byte (the fixture of ../shared/fixtures)
K3_TOKENIZER_CONFIG = os.path.join(HERE, "k3-tokenizer_config.json")
K3_RANKS = 163584


def tokenizer_config(n_ranks):
    """K3's released tokenizer_config.json (key order kept) with ids shifted to n_ranks."""
    with open(K3_TOKENIZER_CONFIG, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["added_tokens_decoder"] = {str(int(k) - K3_RANKS + n_ranks): v
                                   for k, v in cfg["added_tokens_decoder"].items()}
    cfg["model_max_length"] = 1048576
    cfg["auto_map"] = {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}
    return cfg


def training_texts(data_dir):
    """[(text, weight)]: the training books, and every text piece of the conversations."""
    import chat_render
    with open(os.path.join(data_dir, "kjv-train.txt"), encoding="utf-8") as f:
        texts = [(f.read(), 1)]

    class _M:                                   # markers as placeholders: only text pieces count
        open, close, sep, eom = -1, -2, -3, -4
    with open(os.path.join(data_dir, "chat-train.jsonl"), encoding="utf-8") as f:
        for line in f:
            cv = json.loads(line)
            for p in chat_render.pieces(_M, cv["messages"], cv["thinking"], cv["effort"]):
                if isinstance(p, str):
                    texts.append((p, 1))
    return texts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ranks", type=int, default=3840)
    ap.add_argument("--names-apart", action="store_true")
    a = ap.parse_args(argv)
    sys.path.insert(0, HERE)
    t0 = time.time()
    texts = training_texts(a.data)
    ranks = build_tokenizer.train(texts, a.ranks, build_tokenizer.name_apart if a.names_apart else None)
    n_tok, n_bytes = build_tokenizer.verify(ranks, texts[:1])
    os.makedirs(a.out, exist_ok=True)
    data = kt.dump_tiktoken_bpe(ranks)
    with open(os.path.join(a.out, "tiktoken.model"), "wb") as f:
        f.write(data)
    with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(tokenizer_config(len(ranks)), indent=2, ensure_ascii=False) + "\n")
    print("tokenizer: %d ranks + 256 specials, sha256 %s; training books %d bytes -> %d tokens "
          "(%.2f bytes/token), %.1f s" % (len(ranks), hashlib.sha256(data).hexdigest()[:16], n_bytes, n_tok,
                                         n_bytes / n_tok, time.time() - t0), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
