"""Damage to manifest.json itself (issue 9 item 3): the manifest carries a
checksum of its own content (docs/FORMAT.md 5.1), so any flipped bit anywhere
in it is named by k3verify and refused by k3run.

  * a small synthetic pack's manifest (tests/unit/test_verify --make-pack: 2
    layers, about 8 KB): its first and last 64 bytes, every byte of its config
    block's rms_norm_eps line and 200 bytes spread evenly over the rest flipped
    in turn (bit 0, and bit 5 on every 4th of them): k3verify --quick exits 1 with
    "manifest.json: FAILED (" and nothing reported OK, never a signal. (One
    k3verify run costs 5-10 ms here, 30 ms or more under ASan: every byte of the
    manifest through the CLI would take minutes; test_pack_format flips every
    byte, twice, through the reader k3verify and k3run call.)
  * the tiny reference pack (k3pack of the tiny checkpoint): 24 flips, among
    them the ones the issue names (pad_token_id -> pad_doken_id, a digit of
    rms_norm_eps), a shape digit, a tensor hash digit, the checksum digits and
    the last newline: k3run exits 1 naming manifest.json, prints nothing on
    stdout; k3verify --quick says the same.
The unit test test_pack_format flips every byte of a manifest twice in-process
through the same reader (k3_manifest_parse, which k3_manifest_load calls)."""

import os
import shutil
import subprocess
import sys
import unittest

SRC = os.environ.get("K3_SRC", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BIN = os.environ.get("K3_BIN", os.path.join(SRC, "build", "bin"))
TMP = os.environ.get("K3_TEST_TMP", "/tmp")
MKPACK = os.environ.get("K3_MKPACK", os.path.join(BIN, "..", "tests", "test_verify"))
sys.path.insert(0, os.path.join(SRC, "tests", "run"))
from runlib import make_pack      # noqa: E402

K3VERIFY = os.path.join(BIN, "k3verify")
K3RUN = os.path.join(BIN, "k3run")
ENV = dict(os.environ, K3_NO_PROGRESS="1")


def run(args):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    return p.returncode, p.stdout, p.stderr


def flip_positions(text):
    """24 positions in the tiny pack's manifest: the issue's examples first, then spread."""
    def at(needle, k=0):
        i = text.find(needle)
        assert i >= 0, needle
        return i + k
    pos = [
        at(b'"pad_token_id"', 5),                   # pad_token_id -> pad_doken_id ('t' ^ 0x10)
        at(b'"rms_norm_eps": ', len(b'"rms_norm_eps": ') + 3),   # a digit of the norm epsilon
        at(b'"hidden_size": ', len(b'"hidden_size": ')),
        at(b'"num_experts_per_token": ', len(b'"num_experts_per_token": ')),
        at(b'"format_version": ', len(b'"format_version": ')),
        at(b'"shape": [', len(b'"shape": [') + 5),  # inside the first shape
        at(b'"xxh3_64": "', len(b'"xxh3_64": "') + 7),
        at(b'"header_hash": "', len(b'"header_hash": "')),
        at(b'"offset": ', len(b'"offset": ')),
        at(b'"name_prefix"', 3),
        0, 1, len(text) // 3, len(text) // 2, 2 * len(text) // 3,
    ]
    pos += [len(text) - k for k in (41, 30, 20, 12, 5, 4, 3, 2, 1)]     # the checksum member, digits, end
    assert len(pos) == 24
    return pos


class TestManifestFlip(unittest.TestCase):
    def expect_refused(self, rc, out, err, what):
        self.assertGreaterEqual(rc, 0, "%s: killed by signal %d" % (what, -rc))
        self.assertEqual(rc, 1, "%s: exit %d\n%s%s" % (what, rc, out.decode(errors="replace"), err.decode(errors="replace")))
        self.assertNotIn(b"Sanitizer", err, what)
        self.assertNotIn(b"runtime error", err, what)

    def test_sample_k3verify(self):
        pk = os.path.join(TMP, "verify-flip", "small.k3pack")
        shutil.rmtree(pk, ignore_errors=True)
        os.makedirs(os.path.dirname(pk), exist_ok=True)
        subprocess.run([MKPACK, "--make-pack", pk, "2", "2", "32", "32"], check=True)
        mf = os.path.join(pk, "manifest.json")
        good = open(mf, "rb").read()
        rc, out, err = run([K3VERIFY, "--quick", pk])
        self.assertEqual(rc, 0, err)
        n = len(good)
        eps = good.find(b'"rms_norm_eps"')
        self.assertGreater(eps, 0)
        eps_end = good.find(b"\n", eps)
        pos = sorted(set(range(64)) | set(range(n - 64, n)) | set(range(eps, eps_end + 1)) |
                     set(range(0, n, n // 200)))
        flips = [(i, 0x01) for i in pos] + [(i, 0x20) for i in pos[::4]]
        for i, bit in flips:
            bad = bytearray(good)
            bad[i] ^= bit
            with open(mf, "wb") as f:
                f.write(bad)
            rc, out, err = run([K3VERIFY, "--quick", pk])
            what = "byte %d ^ 0x%02x (%r -> %r)" % (i, bit, chr(good[i]), chr(bad[i]))
            self.expect_refused(rc, out, err, what)
            self.assertTrue(out.startswith(b"manifest.json: FAILED ("), "%s: %r" % (what, out))
            self.assertNotIn(b": OK", out, what)
        print("k3verify --quick refused all %d flips of a %d-byte manifest" % (len(flips), len(good)))

    def test_sample_k3run(self):
        _, cached = make_pack("tiny", 29)
        if run([K3VERIFY, "--quick", "-q", cached])[0] != 0:      # made by an older k3pack: again
            shutil.rmtree(cached)
            _, cached = make_pack("tiny", 29)
        pk = os.path.join(TMP, "verify-flip", "tiny.k3pack")
        shutil.rmtree(pk, ignore_errors=True)
        os.makedirs(pk)
        for n in os.listdir(cached):                # shards shared, the manifest a copy
            if n != "manifest.json":
                os.link(os.path.join(cached, n), os.path.join(pk, n))
        mf = os.path.join(pk, "manifest.json")
        good = open(os.path.join(cached, "manifest.json"), "rb").read()
        shutil.copy(os.path.join(cached, "manifest.json"), mf)
        args = [K3RUN, "-m", pk, "-p", "The quick brown fox", "-n", "2"]
        rc, out, err = run(args)
        self.assertEqual(rc, 0, err)
        self.assertTrue(out)
        pos = flip_positions(good)
        for i in pos:
            bad = bytearray(good)
            bad[i] ^= 0x10 if good[i:i + 1] == b"t" else 0x01     # 't' ^ 0x10 = 'd': pad_doken_id
            with open(mf, "wb") as f:
                f.write(bad)
            what = "byte %d (%r -> %r)" % (i, chr(good[i]), chr(bad[i]))
            rc, out, err = run(args)
            self.expect_refused(rc, out, err, "k3run, " + what)
            self.assertEqual(out, b"", what)
            self.assertIn(b"manifest.json", err, what)
            run_err = err
            rc, out, err = run([K3VERIFY, "--quick", pk])
            self.expect_refused(rc, out, err, "k3verify, " + what)
            self.assertTrue(out.startswith(b"manifest.json: FAILED ("), "%s: %r" % (what, out))
        print("k3run refused all %d sampled flips, e.g. %s" % (len(pos), run_err.decode(errors="replace").strip().splitlines()[-1]))


if __name__ == "__main__":
    unittest.main()
