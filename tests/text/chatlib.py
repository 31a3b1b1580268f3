"""Shared helpers of the chat-format tests: k3run --render-chat against tests/reference/xtml.py.

Paths come from the environment as in the other Python tests (tests/run/runlib.py): K3_SRC (the
repo), K3_BIN (the binaries, default build/bin), K3_TEST_TMP, K3_SHARED (the shared/ folder
holding spec/CHAT-FORMAT.md, default ../shared next to the repo, then /work/shared).

k3run's output (agreed with its author): `--render-chat FILE --json` prints one JSON document
{"ids": [...], "pieces": [{"special": NAME, "id": ID} | {"text": TEXT, "ids": [...]}, ...],
"thinking": BOOL, "n_ids": N}; without --json the ids space-separated on one line; exit 2 for
a refused request, 1 for invalid JSON.
"""

import json
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("K3_SRC", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BIN = os.environ.get("K3_BIN", os.path.join(SRC, "build", "bin"))
TMP = os.environ.get("K3_TEST_TMP", "/tmp")
REF = os.path.join(SRC, "tests", "reference")
if REF not in sys.path:
    sys.path.insert(0, REF)

import kimi_tokenizer   # noqa: E402
import xtml             # noqa: E402

TOKDIR = os.path.join(SRC, "tests", "models", "k3-kjv")
K3RUN = os.path.join(BIN, "k3run")
_tok = None


def tokenizer():
    global _tok
    if _tok is None:
        _tok = kimi_tokenizer.Tokenizer.from_dir(TOKDIR)
    return _tok


def spec_path():
    for shared in (os.environ.get("K3_SHARED", ""), os.path.join(SRC, "..", "shared"), "/work/shared"):
        p = os.path.join(shared, "spec", "CHAT-FORMAT.md")
        if shared and os.path.isfile(p):
            return p
    return None


def have_k3run():
    """True if k3run exists and knows --render-chat."""
    if not os.access(K3RUN, os.X_OK):
        return False
    p = subprocess.run([K3RUN, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return b"--render-chat" in p.stdout


def run_c(request_text, as_json=True, workdir=None):
    """Run k3run --render-chat on REQUEST_TEXT (a str or bytes of JSON). Returns
    (exit code, stdout bytes, stderr bytes)."""
    data = request_text.encode("utf-8") if isinstance(request_text, str) else request_text
    os.makedirs(workdir or TMP, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix="chat-", suffix=".json", dir=workdir or TMP)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        args = [K3RUN, "--tokenizer", TOKDIR, "--render-chat", path] + (["--json"] if as_json else [])
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        return p.returncode, p.stdout, p.stderr
    finally:
        os.unlink(path)


def c_pieces(doc):
    """k3run's pieces as (id) / (text, ids) tuples, lone surrogates as U+FFFD."""
    out = []
    for p in doc["pieces"]:
        if "special" in p:
            out.append(("special", p["special"], p["id"]))
        else:
            out.append(("text", xtml.fix_surrogates(p["text"]), list(p["ids"])))
    return out


def py_pieces(res):
    out = []
    for p in res["pieces"]:
        if "special" in p:
            out.append(("special", p["special"], p["id"]))
        else:
            out.append(("text", p["text"], list(p["ids"])))
    return out


def cut_form(pieces):
    """The same pieces with every text piece replaced by its §3.3 slices (the spec's other
    meaning of "piece": one independently encoded unit)."""
    tok = tokenizer()
    out = []
    for p in pieces:
        if p[0] == "special":
            out.append(p)
            continue
        for s in kimi_tokenizer.chunk_text(p[1]):
            if s:
                out.append(("text", s, tok.encode(s)))
    return out


def show(pieces, limit=400):
    """A readable one-line form of a piece list, long texts shortened."""
    r = []
    for p in pieces:
        if p[0] == "special":
            r.append("[%s %d]" % (p[1], p[2]))
        else:
            t = p[1] if len(p[1]) <= 60 else p[1][:40] + "...(%d cp)" % len(p[1])
            r.append(json.dumps(t, ensure_ascii=False))
    s = " ".join(r)
    return s if len(s) <= limit * 10 else s[:limit * 10] + " ..."


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare(tc, request_text, name="case", plain=True):
    """The whole comparison of one request: xtml.py (refused or rendered) against k3run's
    exit code, --json pieces, ids, thinking and n_ids, and the plain ids line."""
    tok = tokenizer()
    try:
        expected = xtml.render(json.loads(request_text), tok)
    except xtml.XtmlError as e:
        expected = e
    rc, out, err = run_c(request_text)
    if isinstance(expected, Exception):
        tc.assertEqual(rc, 2, "%s: refused by xtml.py (%s) but k3run exit %d: %s" % (
            name, expected, rc, (out + err)[:2000].decode("utf-8", "replace")))
        return None
    tc.assertEqual(rc, 0, "%s: k3run exit %d: %s" % (name, rc, err[:2000].decode("utf-8", "replace")))
    doc = json.loads(out.decode("utf-8"))
    want = py_pieces(expected)
    got = c_pieces(doc)
    if got != want and got == cut_form(want):
        want = cut_form(want)           # k3run lists the §3.3 slices as pieces: the same thing
    if got != want:
        i = first_difference(got, want)
        tc.fail("%s: pieces differ at %d\n  expected: %s\n  got:      %s\n  piece %d expected %.300r\n  piece %d got      %.300r" % (
            name, i, show(want[max(0, i - 8):i + 8]), show(got[max(0, i - 8):i + 8]),
            i, want[i] if i < len(want) else None, i, got[i] if i < len(got) else None))
    if doc["ids"] != expected["ids"]:
        i = first_difference(doc["ids"], expected["ids"])
        tc.fail("%s: ids differ at %d (of %d / %d): expected %r, got %r" % (
            name, i, len(expected["ids"]), len(doc["ids"]), expected["ids"][i:i + 8], doc["ids"][i:i + 8]))
    tc.assertEqual(doc.get("n_ids"), expected["n_ids"], "%s: n_ids" % name)
    tc.assertEqual(doc.get("thinking"), expected["thinking"], "%s: thinking" % name)
    if "add_generation_prompt" in doc:
        tc.assertEqual(doc["add_generation_prompt"], expected["add_generation_prompt"], "%s: add_generation_prompt" % name)
    if not plain:
        return doc
    rc2, out2, err2 = run_c(request_text, as_json=False)
    tc.assertEqual(rc2, 0, "%s: k3run (no --json) exit %d: %s" % (name, rc2, err2[:500]))
    tc.assertTrue([int(x) for x in out2.split()] == expected["ids"], "%s: the plain ids line is not the ids" % name)
    return doc
