"""The demo model's data: the King James Bible from Debian's bible-kjv-text package.

    kjv_data.py --out DIR [--chats N] [--tool-chats N]
        writes DIR/kjv-train.txt, DIR/kjv-heldout.txt, DIR/chat-train.jsonl, DIR/tool-train.jsonl

The text is read with the package's own reader (`bible`, package bible-kjv) from
/usr/lib/bible.data, whose SHA-256 is checked, so every machine trains on the same bytes.

HELD OUT: the books of Ruth, Jonah and Jude are the test set. They are cut out here, before
anything else sees the text: the tokenizer, the training documents and the chat conversations
are all made from `train_books()` only; `heldout_text()` is used by nothing but evaluation.

Plain-text documents are chapters, laid out as the reader prints them:
    Genesis 1
    1 In the beginning God created the heaven and the earth.
    2 And the earth was without form, ...
Chat documents are conversations (a list of OpenAI-style messages plus render options) about
verses of the training books: quote a verse by its reference, go on from a verse, say where a
verse stands; thinking off, or on with a short think channel.
"""

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kjv_tools  # noqa: E402

BIBLE_DATA = "/usr/lib/bible.data"
BIBLE_DATA_SHA256 = "6c746c2acc8a34bfded980883ff1701a5d68934a1c853ebf88a07b978fe0ae0e"   # bible-kjv-text 4.38
HELDOUT_BOOKS = ("Ruth", "Jonah", "Jude")


def read_bible():
    """[(book, chapter, verse, text)] for all 31102 verses, in canonical order."""
    with open(BIBLE_DATA, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != BIBLE_DATA_SHA256:
        raise SystemExit("kjv_data: %s has SHA-256 %s, expected %s (bible-kjv-text 4.38)"
                         % (BIBLE_DATA, digest, BIBLE_DATA_SHA256))
    out = subprocess.run(["bible", "-l0", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                         env=dict(os.environ, COLUMNS="0")).stdout.decode("utf-8")
    verses, book, chap = [], None, None
    for line in out.split("\n"):
        if not line.strip():
            continue
        if line.startswith("  "):
            num, text = line.strip().split(" ", 1)
            verses.append((book, chap, int(num), text.strip()))
        else:
            book, c = line.rsplit(" ", 1)
            chap = int(c)
    if len(verses) != 31102:
        raise SystemExit("kjv_data: expected 31102 verses, read %d" % len(verses))
    return verses


def chapters(verses):
    """[(book, chapter, [(verse, text)])] in order."""
    out = []
    for b, c, v, t in verses:
        if not out or out[-1][0] != b or out[-1][1] != c:
            out.append((b, c, []))
        out[-1][2].append((v, t))
    return out


def chapter_text(book, chap, vs):
    return "%s %d\n" % (book, chap) + "".join("%d %s\n" % (v, t) for v, t in vs)


def train_books(verses):
    return [x for x in verses if x[0] not in HELDOUT_BOOKS]


def heldout_verses(verses):
    return [x for x in verses if x[0] in HELDOUT_BOOKS]


def text_of(verses):
    """Chapters separated by a blank line."""
    return "\n".join(chapter_text(b, c, vs) for b, c, vs in chapters(verses))


# ---------------------------------------------------------------------------
# Chat conversations
# ---------------------------------------------------------------------------

ASK_QUOTE = ["Quote %s.", "What does %s say?", "Recite %s.", "Give me %s.", "Read me %s, please.",
             "%s?", "What is written in %s?", "Say the verse %s."]
ASK_NEXT = ["What comes after this verse? %s", "Go on from here: %s", "Continue: %s",
            "What is the next verse after \"%s\"?", "Finish the passage: %s"]
ASK_WHERE = ["Where is this written? %s", "Which verse is this: %s", "Where does it say \"%s\"?"]
SYSTEMS = ["You answer with verses of the King James Bible.", "Answer briefly.",
           "You are a concordance of the King James Version."]


def ref(b, c, v):
    return "%s %d:%d" % (b, c, v)


def conversations(verses, n, seed):
    """n conversations (dicts: messages, thinking, effort) about the given (training) verses."""
    rnd = random.Random(seed)
    idx_next = {i: i + 1 for i in range(len(verses) - 1)
                if verses[i][0] == verses[i + 1][0] and verses[i][1] == verses[i + 1][1]}
    out = []
    for _ in range(n):
        i = rnd.randrange(len(verses))
        b, c, v, t = verses[i]
        kind = rnd.random()
        if kind < 0.5:
            q = rnd.choice(ASK_QUOTE) % ref(b, c, v)
            think = "%s is in the book of %s, chapter %d." % (ref(b, c, v), b, c)
            ans = t
        elif kind < 0.8 and i in idx_next:
            b2, c2, v2, t2 = verses[idx_next[i]]
            q = rnd.choice(ASK_NEXT) % t
            think = "That is %s; the next verse is %s." % (ref(b, c, v), ref(b2, c2, v2))
            ans = t2
        else:
            q = rnd.choice(ASK_WHERE) % t
            think = "These words are from the book of %s." % b
            ans = "It is %s." % ref(b, c, v)
        msgs = []
        if rnd.random() < 0.2:
            msgs.append({"role": "system", "content": rnd.choice(SYSTEMS)})
        msgs.append({"role": "user", "content": q})
        thinking = rnd.random() < 0.4
        a = {"role": "assistant", "content": ans}
        if thinking:
            a["reasoning_content"] = think
        msgs.append(a)
        out.append({"messages": msgs, "thinking": thinking,
                    "effort": rnd.choice(["max", "max", "high", "low", None]) if thinking else None})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--chats", type=int, default=24000)
    ap.add_argument("--tool-chats", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    vs = read_bible()
    tr, ho = train_books(vs), heldout_verses(vs)
    with open(os.path.join(a.out, "kjv-train.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write(text_of(tr))
    with open(os.path.join(a.out, "kjv-heldout.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write(text_of(ho))
    with open(os.path.join(a.out, "chat-train.jsonl"), "w", encoding="utf-8", newline="\n") as f:
        for cv in conversations(tr, a.chats, a.seed):
            f.write(json.dumps(cv, ensure_ascii=False) + "\n")
    # the tool conversations (kjv_tools.py) have their own file and their own random stream, so
    # the chat file, and with it the tokenizer trained on it, are what they were without them
    with open(os.path.join(a.out, "tool-train.jsonl"), "w", encoding="utf-8", newline="\n") as f:
        for cv in kjv_tools.tool_conversations(tr, a.tool_chats, a.seed + 1000):
            f.write(json.dumps(cv, ensure_ascii=False) + "\n")
    print("kjv_data: %d training verses, %d held-out verses (%s), %d conversations, %d with the tool -> %s"
          % (len(tr), len(ho), ", ".join(HELDOUT_BOOKS), a.chats, a.tool_chats, a.out), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
