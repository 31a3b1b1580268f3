"""k3run's defined behaviour on the tiny preset (tests/run/runlib.py builds the
fixture pack) for issue 9:

item 7, prompts and options: an empty prompt (-p, -f, stdin, --prompt-ids); a
prompt longer than the context, refused before any weight is read (proved on a
pack whose shards are missing); invalid UTF-8 and NUL bytes in -f, stdin and -p,
tokenized exactly as the reference's encode_bytes; special-token text, plain
text without --special and the special id with it, as the reference; -n 0;
out-of-range --temp, --top-p, --top-k, --seed, --context, --batch: exit 2, the
option and the value named, nothing on stdout.

item 4, shards changing under a running k3run: at the planner's minimum budget
(every trunk layer streamed, an expert cache of a few slots, so weights are
read on every token) a shard truncated after the first generated token stops
k3run with exit 3 naming the shard, a prefix of the undisturbed text on stdout
and no signal; a shard overwritten in place is corruption (exit 1); a shard
replaced by rename or deleted is not seen (k3run keeps reading the file it
opened) and the text is the undisturbed one."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import unittest

from runlib import BIN, CANON_PROMPT, REF, TMP, k3run, load_dump, make_pack, minimum_budget

sys.path.insert(0, REF)
from kimi_tokenizer import Tokenizer      # noqa: E402

K3RUN = os.path.join(BIN, "k3run")




class TestPrompts(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ck, cls.pk = make_pack("tiny", 29)
        cls.tok = Tokenizer.from_dir(cls.ck)
        cls.work = os.path.join(TMP, "k3run-robust")
        os.makedirs(cls.work, exist_ok=True)
        # a pack with its manifest and tokenizer but no shard: anything that reads a weight fails (exit 3)
        cls.bare = os.path.join(cls.work, "bare.k3pack")
        shutil.rmtree(cls.bare, ignore_errors=True)
        os.makedirs(cls.bare)
        for f in ("manifest.json", "tiktoken.model", "tokenizer_config.json"):
            shutil.copy(os.path.join(cls.pk, f), cls.bare)

    def path(self, name, data):
        p = os.path.join(self.work, name)
        with open(p, "wb") as f:
            f.write(data)
        return p

    def usage(self, args, *names, stdin=None, pack=None):
        """exit 2, nothing on stdout, an error naming every one of `names`"""
        p = k3run(["-m", pack or self.pk] + args, check=False, stdin=stdin)
        self.assertEqual(p.returncode, 2, "%s: exit %d (%s)" % (args, p.returncode, p.stderr))
        self.assertEqual(p.stdout, b"", args)
        self.assertIn(b"error", p.stderr)
        for n in names:
            self.assertIn(n.encode() if isinstance(n, str) else n, p.stderr, args)
        return p

    def prompt_ids(self, args, stdin=None):
        """The ids k3run processed for the prompt (its --dump; -n 1 feeds nothing back)."""
        dump = os.path.join(self.work, "ids.st")
        k3run(["-m", self.pk, "-n", "1", "-q", "--dump", dump] + args, stdin=stdin)
        return [int(x) for x in load_dump(dump)["ids"]]

    def test_bad_options(self):
        """each refused with exit 2, the option and the value in the message, nothing on stdout"""
        x = ["-p", "x"]
        cases = [
            (["--temp", "-1"], "--temp", "-1"), (["--temp", "-0.5"], "--temp", "-0.5"),
            (["--temp", "nan"], "--temp", "nan"), (["--temp", "inf"], "--temp", "inf"),
            (["--temp", "1e39"], "--temp", "1e39"), (["--temp", "hot"], "--temp", "hot"),
            (["--top-p", "0"], "--top-p", "0"), (["--top-p", "1.5"], "--top-p", "1.5"),
            (["--top-p", "-1"], "--top-p", "-1"), (["--top-p", "nan"], "--top-p", "nan"),
            (["--top-p", "inf"], "--top-p", "inf"), (["--top-p", "1e-50"], "--top-p", "1e-50"),
            (["--top-p", ""], "--top-p", "''"),
            (["--min-p", "1"], "--min-p", "1"), (["--repeat-penalty", "0"], "--repeat-penalty", "0"),
            (["--top-k", "-1"], "--top-k", "-1"), (["--top-k", "2.5"], "--top-k", "2.5"),
            (["--seed", "abc"], "--seed", "abc"), (["--seed", "-1"], "--seed", "-1"),
            (["--seed", "18446744073709551616"], "--seed", "18446744073709551616"),
            (["--context", "0"], "--context", "got 0"), (["--batch", "0"], "--batch", "got 0"),
            (["--threads", "0"], "--threads", "got 0"), (["-n", "-1"], "--n-predict", "-1"),
            (["-n", "x"], "--n-predict", "'x'"), (["--budget", "lots"], "--budget", "lots"),
        ]
        for extra, opt, val in cases:
            with self.subTest(args=extra):
                # the bare pack: the options are checked before anything is read
                self.usage(x + extra, opt, val)
                self.usage(x + extra, opt, val, pack=self.bare)

    def test_unreadable_prompt_file(self):
        """-f of a missing file or a directory: an I/O error (exit 3) naming it, nothing on stdout"""
        for f, why in ((os.path.join(self.work, "no-such-file"), b"No such file"), (self.work, b"directory")):
            p = k3run(["-m", self.bare, "-f", f], check=False)
            self.assertEqual((p.returncode, p.stdout), (3, b""), p.stderr)
            self.assertIn(f.encode(), p.stderr)
            self.assertIn(why, p.stderr)

    def test_temp_minus_zero_is_greedy(self):
        a = k3run(["-m", self.pk, "-p", "x", "-n", "4", "--print-ids", "--temp", "-0"]).stdout
        b = k3run(["-m", self.pk, "-p", "x", "-n", "4", "--print-ids"]).stdout
        self.assertEqual(a, b)

    def test_empty_prompt(self):
        """every source of an empty prompt: exit 2 naming the source, before any weight is read"""
        empty = self.path("empty.txt", b"")
        for pack in (self.pk, self.bare):
            self.usage(["-p", ""], "empty", "(-p)", pack=pack)
            self.usage(["-f", empty], "empty", "-f '%s'" % empty, pack=pack)
            self.usage([], "empty", "(stdin)", stdin=b"", pack=pack)
            self.usage(["--prompt-ids", ""], "empty", "--prompt-ids", pack=pack)
            self.usage(["--prompt-ids", " , ,"], "empty", "--prompt-ids", pack=pack)
        # a prompt that is only whitespace or a NUL is not empty: it has tokens
        self.assertEqual(self.prompt_ids(["-p", " "]), self.tok.encode(" "))
        self.assertEqual(self.prompt_ids(["-f", self.path("nul.txt", b"\0")]), self.tok.encode_bytes(b"\0"))

    def test_prompt_longer_than_context(self):
        """refused (exit 2) with the token count and the context, before any weight is read: on the bare
        pack it is still exit 2, where loading would be exit 3; --verify is not run for a bad prompt"""
        n = len(self.tok.encode(CANON_PROMPT))
        for pack in (self.pk, self.bare):
            with self.subTest(pack=pack):
                p = self.usage(["-p", CANON_PROMPT, "--context", "8"], "(-p)", "%d tokens" % n, "context of 8",
                               "--context", pack=pack)
                p = self.usage(["-p", CANON_PROMPT, "--context", "8", "--verify"], "context of 8", pack=pack)
                # the prompt fits but not with the tokens asked for: also before loading
                self.usage(["-p", CANON_PROMPT, "--context", str(n + 4), "-n", "6"], "6 generated tokens", "-n",
                           "context of %d" % (n + 4), pack=pack)
                # a long prompt (~60 000 tokens) from a file, default context 4096: quick, nothing loaded
                big = self.path("big.txt", b"word7 " * 60000)
                t0 = time.monotonic()
                self.usage(["-f", big], "-f '%s'" % big, "context of 4096", pack=pack)
                self.assertLess(time.monotonic() - t0, 60)
        # exactly full is fine: prompt n tokens + 5 generated (the last one is not fed back) = n + 4 positions
        p = k3run(["-m", self.pk, "-p", CANON_PROMPT, "--context", str(n + 4), "-n", "5", "--print-ids"])
        self.assertEqual(len(p.stdout.split()), 5)
        # and the bare pack does fail (exit 3, the shard named) once the prompt is good
        p = k3run(["-m", self.bare, "-p", "x", "-n", "1"], check=False)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn(b".k3s", p.stderr)

    def test_invalid_utf8_and_nul(self):
        """bytes as they are: every invalid byte is its own single-byte token, NUL is U+0000 (the reference's
        encode_bytes), from -f, stdin and -p (argv cannot hold a NUL)"""
        data = (b"abc \xff\xfe caf\xc3\xa9 \xc3( \xe2\x82 x\xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf end\0mid\0\0"
                b" \xe6\x97\xa5\xe6\x9c\xac tail \xf0\x9f\x99")
        ref = self.tok.encode_bytes(data)
        self.assertEqual(self.prompt_ids(["-f", self.path("bad-utf8.txt", data)]), ref)
        self.assertEqual(self.prompt_ids([], stdin=data), ref)
        noz = data.replace(b"\0", b"")
        refnoz = self.tok.encode_bytes(noz)
        self.assertEqual(self.prompt_ids([b"-p", noz]), refnoz)
        p = subprocess.run([K3RUN, "-m", self.pk, "--tokenize", noz], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual([int(t) for t in p.stdout.split()], refnoz)
        # and it generates (exit 0)
        p = k3run(["-m", self.pk, "-f", os.path.join(self.work, "bad-utf8.txt"), "-n", "3", "--print-ids"])
        self.assertEqual(len(p.stdout.split()), 3)

    def test_special_text(self):
        """without --special, special-token text is ordinary text (the reference's encode(s, False)); with it,
        the special id (encode(s, True)), from -p, -f and --tokenize; text that names no special of this
        tokenizer ('<|im_end|>' is not K3's) is text either way"""
        texts = ["<|end_of_msg|>", "<|im_end|>", "a[BOS]b<|open|>c<|close|>", "<|reserved_token_3850|> x",
                 "<|end_of_msg|", "[EOS][PAD]"]
        for s in texts:
            with self.subTest(text=s):
                plain, spec = self.tok.encode(s, False), self.tok.encode(s, True)
                self.assertTrue(all(i < self.tok.n_ranks for i in plain))
                f = self.path("special.txt", s.encode())
                for flag, want in (([], plain), (["--special"], spec)):
                    self.assertEqual(self.prompt_ids(["-p", s] + flag), want)
                    self.assertEqual(self.prompt_ids(["-f", f] + flag), want)
                    got = k3run(["-m", self.pk, "--tokenize", s] + flag).stdout.split()
                    self.assertEqual([int(t) for t in got], want)
        self.assertEqual(self.tok.encode("<|end_of_msg|>", True), [3842])
        self.assertEqual(self.tok.encode("<|im_end|>", True), self.tok.encode("<|im_end|>", False))

    def test_n0(self):
        """-n 0: the prompt is checked, loaded and processed, nothing is generated; exit 0, no text"""
        p = k3run(["-m", self.pk, "-p", CANON_PROMPT, "-n", "0"])
        self.assertEqual(p.stdout, b"")
        p = k3run(["-m", self.pk, "-p", CANON_PROMPT, "-n", "0", "--print-ids"])
        self.assertEqual(p.stdout, b"\n")
        j = json.loads(k3run(["-m", self.pk, "-p", CANON_PROMPT, "-n", "0", "--json"]).stdout)
        n = len(self.tok.encode(CANON_PROMPT))
        self.assertEqual((j["generated_tokens"], j["generated_ids"], j["text"], j["stop"], j["prompt_tokens"]),
                         (0, [], "", "length", n))
        self.assertEqual(self.prompt_ids(["-p", CANON_PROMPT, "-n", "0"]), self.tok.encode(CANON_PROMPT))
        # a prompt filling the context exactly with -n 0 (or -n 1) fits
        k3run(["-m", self.pk, "-p", CANON_PROMPT, "-n", "0", "--context", str(n)])
        k3run(["-m", self.pk, "-p", CANON_PROMPT, "-n", "1", "--context", str(n)])


class TestShardsChangingUnderK3run(unittest.TestCase):
    N = 96   # tokens, ~30 ms each at the minimum budget: seconds of margin to stop k3run after the first

    @classmethod
    def setUpClass(cls):
        cls.ck, cls.pk = make_pack("tiny", 29)
        cls.work = os.path.join(TMP, "k3run-robust")
        os.makedirs(cls.work, exist_ok=True)
        cls.min = minimum_budget(cls.pk)
        with open(os.path.join(cls.pk, "manifest.json")) as f:
            cls.mf = json.load(f)
        cls.args = ["-p", CANON_PROMPT, "-n", str(cls.N), "-t", "1", "-q"]
        j = json.loads(k3run(["-m", cls.pk, "--budget", str(cls.min), "--json"] + cls.args).stdout)
        # the conditions the test relies on: every layer streamed, experts missed on every token, no early end
        cfg = cls.mf["config"].get("text_config", cls.mf["config"])
        assert j["trunk_units_streamed"] >= cfg["num_hidden_layers"], j["trunk_units_streamed"]
        assert j["expert_misses"] > cls.N * 4 and j["stop"] == "length", (j["expert_misses"], j["stop"])
        cls.text = k3run(["-m", cls.pk, "--budget", str(cls.min)] + cls.args).stdout
        cls.text_all = k3run(["-m", cls.pk] + cls.args).stdout
        assert cls.text == cls.text_all

    def data_offset(self, shard):
        """where the shard's first tensor or record starts (the header ends before)"""
        offs = [t["offset"] for t in self.mf["tensors"] if t["shard"] == shard]
        offs += [x["offset"] for x in self.mf["expert_layers"] if x["shard"] == shard]
        return min(offs)

    def run_changing(self, shard, change, budget=True):
        """k3run on a fresh copy of the pack; after its first generated byte it is stopped, the shard is
        changed, and it continues. Returns (exit code, stdout, stderr, path of the shard)."""
        pk = os.path.join(self.work, "changing.k3pack")
        shutil.rmtree(pk, ignore_errors=True)
        shutil.copytree(self.pk, pk)
        path = os.path.join(pk, shard)
        args = [K3RUN, "-m", pk] + (["--budget", str(self.min)] if budget else []) + self.args
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        first = os.read(p.stdout.fileno(), 1)
        self.assertEqual(len(first), 1, "k3run printed nothing")
        os.kill(p.pid, signal.SIGSTOP)
        try:
            change(path)
        finally:
            os.kill(p.pid, signal.SIGCONT)
        try:
            out, err = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise AssertionError("k3run hung after %s was changed" % shard)
        return p.returncode, first + out, err, path

    def assert_stopped(self, rc, out, err, shard, code):
        self.assertEqual(rc, code, "exit %d (signal if negative): %s" % (rc, err.decode(errors="replace")))
        self.assertIn(shard.encode(), err)
        self.assertIn(b"error", err)
        self.assertTrue(self.text.startswith(out) and len(out) < len(self.text),
                        "stdout is not a prefix of the undisturbed text: %r" % out)

    def truncate_to(self, size):
        def f(path):
            os.truncate(path, size)
        return f

    def test_truncated(self):
        """a truncated expert shard, streamed trunk layer or the embedding table: exit 3, the shard named,
        'ended early' / 'truncated', no signal, the text so far on stdout"""
        for shard in ("experts-layer-004.k3s", "trunk-layer-004.k3s", "trunk-embed.k3s", "experts-layer-001.k3s"):
            for size in (self.data_offset(shard), 0):
                with self.subTest(shard=shard, size=size):
                    rc, out, err, _ = self.run_changing(shard, self.truncate_to(size))
                    self.assert_stopped(rc, out, err, shard, 3)
                    self.assertTrue(b"ended early" in err or b"truncated" in err, err)
                    print("%s truncated to %d: exit %d, %d of %d bytes, %s" % (
                        shard, size, rc, len(out), len(self.text), err.decode(errors="replace").strip()))

    def test_truncated_all_resident(self):
        """without a budget everything but the embedding table is read once at load: a truncated expert
        shard is not read again (the text is undisturbed); the embedding table is read every token"""
        rc, out, err, _ = self.run_changing("experts-layer-004.k3s", self.truncate_to(0), budget=False)
        self.assertEqual((rc, out), (0, self.text), err)
        rc, out, err, _ = self.run_changing("trunk-embed.k3s", self.truncate_to(0), budget=False)
        self.assert_stopped(rc, out, err, "trunk-embed.k3s", 3)

    def test_overwritten_in_place(self):
        """the same size, different bytes: a hash mismatch, corruption (exit 1) naming the shard"""
        shard = "experts-layer-004.k3s"

        def scribble(path):
            with open(path, "r+b") as f:
                f.seek(self.data_offset(shard))
                f.write(b"\x5a" * (os.path.getsize(path) - self.data_offset(shard)))
        rc, out, err, _ = self.run_changing(shard, scribble)
        self.assert_stopped(rc, out, err, shard, 1)
        self.assertIn(b"XXH3-64", err)

    def test_replaced_or_deleted(self):
        """rename() of another file over the shard, or unlink(): k3run keeps reading the file it opened,
        so the text is the undisturbed one and the exit 0"""
        for shard in ("experts-layer-004.k3s", "trunk-layer-004.k3s", "trunk-embed.k3s"):
            def replace(path):
                tmp = path + ".new"
                with open(tmp, "wb") as f:
                    f.write(b"\x5a" * os.path.getsize(path))
                os.rename(tmp, path)

            def delete(path):
                os.unlink(path)
            for name, change in (("replaced", replace), ("deleted", delete)):
                with self.subTest(shard=shard, change=name):
                    rc, out, err, path = self.run_changing(shard, change)
                    self.assertEqual(rc, 0, err)
                    self.assertEqual(out, self.text)
                    # the next run sees the change: exit 1 (a different header) or 3 (missing)
                    p = k3run(["-m", os.path.dirname(path), "-p", "x", "-n", "1"], check=False)
                    self.assertEqual(p.returncode, 1 if name == "replaced" else 3, p.stderr)
                    self.assertIn(shard.encode(), p.stderr)


if __name__ == "__main__":
    unittest.main()
