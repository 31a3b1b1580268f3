"""Three things a newcomer to k3run hits first (issue 14), on the tiny preset
(tests/run/runlib.py builds the fixture pack):

  - a pack without tokenizer files (k3pack makes one, with a warning, from a
    checkpoint that has none) runs on ids: --prompt-ids and --print-ids give
    the ids the whole pack gives; everything that needs text (-p, -f, stdin,
    text output, --json, --tokenize) is refused with exit 2, saying the pack
    has no tokenizer and naming tiktoken.model, nothing on stdout;
  - -m naming a directory that does not exist says the pack does not exist
    (exit 3, README's I/O row), not that a file inside it cannot be opened;
  - --help prints its exit status table once."""

import os
import shutil
import unittest

from runlib import TMP, k3run, make_pack

IDS = "7,300,12,4000,5"


class TestPackWithoutTokenizer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ck, cls.pk = make_pack("tiny", 29)
        cls.bare = os.path.join(TMP, "k3run-cli", "no-tokenizer.k3pack")
        shutil.rmtree(cls.bare, ignore_errors=True)
        os.makedirs(cls.bare)
        for f in os.listdir(cls.pk):                   # the same pack less its tokenizer files
            if f not in ("tiktoken.model", "tokenizer_config.json"):
                shutil.copy(os.path.join(cls.pk, f), cls.bare)

    def refused(self, args, *names, stdin=None):
        p = k3run(["-m", self.bare] + args, check=False, stdin=stdin)
        self.assertEqual(p.returncode, 2, "%s: exit %d (%s)" % (args, p.returncode, p.stderr))
        self.assertEqual(p.stdout, b"", args)
        for n in ("no tokenizer", os.path.join(self.bare, "tiktoken.model")) + names:
            self.assertIn(n.encode(), p.stderr, args)

    def test_runs_on_ids(self):
        """--prompt-ids and --print-ids: exit 0 and the ids of the pack with its tokenizer"""
        args = ["--prompt-ids", IDS, "-n", "8", "--print-ids", "-q"]
        want = k3run(["-m", self.pk] + args).stdout
        got = k3run(["-m", self.bare] + args)
        self.assertEqual(got.stdout, want)
        self.assertEqual(len(got.stdout.split()), 8)

    def test_refuses_what_needs_text(self):
        """each option that needs text: exit 2, the pack has no tokenizer, tiktoken.model and the option named"""
        self.refused(["-p", "hello", "--print-ids"], "-p")
        prompt = os.path.join(TMP, "k3run-cli", "prompt.txt")
        with open(prompt, "w") as f:
            f.write("hello")
        self.refused(["-f", prompt, "--print-ids"], "-f")
        self.refused(["--print-ids"], "stdin", stdin=b"hello")
        self.refused(["--prompt-ids", IDS], "text output", "--print-ids")
        self.refused(["--prompt-ids", IDS, "--json"], "--json")
        self.refused(["--tokenize", "hello"], "--tokenize")

    def test_ids_outside_the_vocabulary(self):
        """without a tokenizer the model's vocabulary bounds the prompt ids: exit 2, nothing run"""
        p = k3run(["-m", self.bare, "--prompt-ids", "1,99999999", "--print-ids"], check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(b"99999999 is outside the vocabulary", p.stderr)
        self.assertEqual(p.stdout, b"")


class TestMissingPack(unittest.TestCase):
    def test_says_the_pack_does_not_exist(self):
        """-m /no/such/dir: exit 3, 'the pack does not exist', no file inside it named"""
        for args in (["-p", "x"], [], ["--prompt-ids", "1", "--print-ids"], ["--tokenize", "x"]):
            p = k3run(["-m", "/no/such/dir"] + args, check=False, stdin=b"hello")
            self.assertEqual(p.returncode, 3, "%s: exit %d (%s)" % (args, p.returncode, p.stderr))
            self.assertIn(b"'/no/such/dir': the pack does not exist", p.stderr, args)
            self.assertNotIn(b"tiktoken.model", p.stderr, args)
            self.assertEqual(p.stdout, b"", args)

    def test_a_file_is_not_a_pack(self):
        """-m naming a file: exit 3, it is not a pack"""
        f = os.path.join(TMP, "k3run-cli", "a-file")
        os.makedirs(os.path.dirname(f), exist_ok=True)
        with open(f, "w") as fh:
            fh.write("x")
        p = k3run(["-m", f, "-p", "x"], check=False)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn(b"is not a pack", p.stderr)


class TestHelp(unittest.TestCase):
    def test_exit_status_table_once(self):
        """--help on stdout, exit 0; the exit status table once, 130 said once"""
        p = k3run(["--help"])
        out = p.stdout.decode()
        self.assertEqual(out.count("Exit status"), 1, out)
        for row in ("0  success", "1  data damaged", "2  usage error", "3  i/o or environment error",
                    "4  internal error"):
            self.assertEqual(out.count(row), 1, row)
        self.assertEqual(out.count("130"), 1, out)

    def test_usage_error_points_to_the_subcommand(self):
        """a usage error of a subcommand points to that subcommand's --help (it said 'k3run --help')"""
        for sub in ("chat", "serve", "batch"):
            p = k3run([sub, "--no-such-option"], check=False)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(("Try 'k3run %s --help'" % sub).encode(), p.stderr)
        p = k3run(["--no-such-option"], check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(b"Try 'k3run --help'", p.stderr)
        self.assertIn(b"k3run batch -m PACK IN.jsonl -o OUT.jsonl", k3run(["--help"]).stdout)


if __name__ == "__main__":
    unittest.main()
