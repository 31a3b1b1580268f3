"""`k3run chat`'s REPL driven on a real pseudo-terminal, as a person uses it (issue 15): a
two-turn conversation typed with a correction (libedit's line editing), /save, /reset, /load
and a third turn, each answer equal to the same conversation run as a script; the reasoning
dimmed with thinking on; Ctrl-C during an answer stops the answer, not the program; Ctrl-D
leaves with exit 0."""

import json
import os
import pty
import re
import select
import signal
import subprocess
import time
import unittest

from runlib import BIN, TMP, kjv_pack, make_pack, run

Q = ["Quote Genesis 1:1.", "What does John 3:16 say?", "Recite Exodus 20:3."]
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][0-9A-Za-z]|\x1b[=>]|\r")


class Pty:
    """a program on a pseudo-terminal; read() collects its output until a pattern shows"""

    def __init__(self, args, env=None):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            e = dict(os.environ, TERM="xterm", K3_HISTORY="", **(env or {}))
            os.execve(args[0], args, e)
        self.buf = b""

    def send(self, b):
        """type b, as a person does after the prompt shows: libedit switches the terminal to its
        own mode only after printing the prompt, and an EOF (Ctrl-D) typed into the old mode is
        lost in the switch"""
        time.sleep(0.3)
        os.write(self.fd, b)

    def expect(self, pattern, timeout=60):
        """wait until pattern (bytes regex) appears after the last match; return the text before it"""
        deadline = time.time() + timeout
        while True:
            clean = ANSI.sub(b"", self.buf)
            m = re.search(pattern, clean)
            if m:
                before = clean[:m.start()]
                self.buf = clean[m.end():]
                return before.decode(errors="replace")
            left = deadline - time.time()
            if left <= 0:
                raise AssertionError("timed out waiting for %r; got %r" % (pattern, clean[-2000:]))
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    raise AssertionError("the program ended waiting for %r; got %r" % (pattern, clean[-2000:]))
                self.buf += chunk

    def wait(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            try:
                if select.select([self.fd], [], [], 0.1)[0]:
                    os.read(self.fd, 65536)
            except OSError:
                time.sleep(0.05)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError("the program did not exit")


class TestChatRepl(unittest.TestCase):
    def tearDown(self):
        subprocess.run(["pkill", "-KILL", "-f", "k3run chat -m " + self.work], capture_output=True)

    @classmethod
    def setUpClass(cls):
        cls.work = os.path.join(TMP, "k3run-chat-repl")
        cls.pack = kjv_pack(cls.work)

    def scripted(self, questions, extra):
        """the same conversation as a script (stdin lines, --json): the answers' contents"""
        p = run([os.path.join(BIN, "k3run"), "chat", "-m", self.pack, "--json", "-q"] + extra,
                stdin=("\n".join(questions) + "\n").encode())
        return [json.loads(line)["message"] for line in p.stdout.decode().splitlines()]

    def test_conversation(self):
        """two turns (the first typed with a correction), /save, /reset, /load, a third turn"""
        opts = ["--think", "off", "-n", "120", "-q"]
        want = self.scripted(Q, ["--think", "off", "-n", "120"])
        s = os.path.join(self.work, "repl.k3session")
        if os.path.exists(s):
            os.remove(s)
        p = Pty([os.path.join(BIN, "k3run"), "chat", "-m", self.pack] + opts)
        p.expect(rb"Ctrl-D to leave\.\n")
        p.expect(rb"> ")
        p.send(Q[0][:-1].encode() + b"XY\x7f\x7f" + Q[0][-1:].encode() + b"\r")   # typo, two backspaces
        out = p.expect(rb"\n> ")
        self.assertIn(want[0]["content"], out)
        p.send(Q[1].encode() + b"\r")
        out = p.expect(rb"\n> ")
        self.assertIn(want[1]["content"], out)
        p.send(b"/save " + s.encode() + b"\r")
        p.expect(rb"\(saved to [^)]*\)\n> ")
        self.assertTrue(os.path.exists(s))
        p.send(b"/stats\r")
        out = p.expect(rb"\n> ")
        self.assertRegex(out, r"turn 2: prompt \d+ tokens \(\d+ cached")
        p.send(b"/reset\r")
        p.expect(rb"\(a new conversation\)\n> ")
        p.send(b"/load " + s.encode() + b"\r")
        p.expect(rb"\(loaded [^)]*\)\n> ")
        p.send(Q[2].encode() + b"\r")
        out = p.expect(rb"\n> ")
        self.assertIn(want[2]["content"], out)
        p.send(b"\x04")                                     # Ctrl-D
        self.assertEqual(p.wait(), 0)

    def test_thinking_dimmed(self):
        """with thinking on, the reasoning is shown dimmed (SGR 2) before the answer"""
        want = self.scripted(Q[:1], ["--think", "on", "-n", "120"])[0]
        p = Pty([os.path.join(BIN, "k3run"), "chat", "-m", self.pack, "-n", "120", "-q"])
        p.expect(rb"> ")
        p.send(Q[0].encode() + b"\r")
        deadline = time.time() + 60
        while b"\x1b[0m" not in p.buf and time.time() < deadline:
            r, _, _ = select.select([p.fd], [], [], 1)
            if r:
                p.buf += os.read(p.fd, 65536)
        raw = p.buf
        i = raw.find(b"\x1b[2m")
        self.assertGreaterEqual(i, 0, raw)
        self.assertIn(want["reasoning_content"].encode(), ANSI.sub(b"", raw[i:raw.find(b"\x1b[0m")]))
        out = p.expect(rb"\n> ")
        self.assertIn(want["content"], out)
        p.send(b"/quit\r")
        self.assertEqual(p.wait(), 0)

    def test_ctrl_c(self):
        """Ctrl-C during an answer stops it, the conversation goes on; Ctrl-C at the prompt gives a
        new prompt (random weights never end their message: the answer runs until stopped)"""
        _, tiny = make_pack("tiny", 3)
        p = Pty([os.path.join(BIN, "k3run"), "chat", "-m", tiny, "--think", "off", "-n", "100000", "-c", "8192",
                 "-q"])
        p.expect(rb"> ")
        p.send(b"hello\r")
        time.sleep(1.0)
        p.send(b"\x03")
        p.expect(rb"\(stopped\)\n> ", timeout=30)
        # at the prompt, once the line editor has it (a Ctrl-C within microseconds of the prompt's
        # bytes, while libedit is still setting the terminal up, once ended the REPL under load:
        # noted in the session's closing note, not fixed)
        time.sleep(0.3)
        p.send(b"\x03")
        p.expect(rb"> ")
        p.send(b"/stats\r")
        out = p.expect(rb"\n> ")
        self.assertIn("finish: interrupted", out)
        p.send(b"\x04")
        self.assertEqual(p.wait(), 0)


if __name__ == "__main__":
    unittest.main()
