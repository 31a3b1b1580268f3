"""Files changing under k3verify (issue 9 item 4): a shard truncated, deleted,
replaced by rename or overwritten in place while k3verify reads it gives exit 3
(an I/O error: verify again) with a FAILED line naming the shard; never a
signal, a sanitizer report, an OK for that shard, or a verdict of damage (exit 1)
about bytes that were not the file's any more.

The moment is exact: an LD_PRELOAD library (pread_hook.c) performs the change
on the file system just before k3verify's first pread of the shard at or past a
given offset, then lets the read happen. The pack (tests/unit/test_verify
--make-pack, 2 layers, 64 experts of width 512) has a 26 MiB expert shard,
which k3verify hashes in 16 MiB reads: the changes land between the first and
the second read of the data pass, or during the header read. A pack at rest
with the same damage (truncated beforehand) is a size error, exit 1."""

import os
import shutil
import subprocess
import unittest

SRC = os.environ.get("K3_SRC", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BIN = os.environ.get("K3_BIN", os.path.join(SRC, "build", "bin"))
TMP = os.environ.get("K3_TEST_TMP", "/tmp")
MKPACK = os.environ.get("K3_MKPACK", os.path.join(BIN, "..", "tests", "test_verify"))
HOOK = os.environ.get("K3_PREAD_HOOK", os.path.join(BIN, "..", "lib", "k3_pread_hook.so"))
K3VERIFY = os.path.join(BIN, "k3verify")
MIB = 1 << 20
SHARD = "experts-layer-001.k3s"


class TestFileChanges(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = os.path.join(TMP, "verify-changes")
        shutil.rmtree(cls.work, ignore_errors=True)
        os.makedirs(cls.work)
        cls.good = os.path.join(cls.work, "good.k3pack")
        subprocess.run([MKPACK, "--make-pack", cls.good, "2", "64", "512", "512"], check=True)
        size = os.path.getsize(os.path.join(cls.good, SHARD))
        assert size > 24 * MIB, size            # two 16 MiB reads at least
        p = subprocess.run([K3VERIFY, cls.good], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert p.returncode == 0, p.stderr

    def fresh(self):
        pk = os.path.join(self.work, "pack")
        shutil.rmtree(pk, ignore_errors=True)
        shutil.copytree(self.good, pk)
        return pk

    def verify(self, pk, file, at, do, opts=()):
        env = dict(os.environ, K3_NO_PROGRESS="1", LD_PRELOAD=HOOK, K3_HOOK_FILE=file, K3_HOOK_AT=str(at),
                   K3_HOOK_DO=do)
        if os.environ.get("K3_SANITIZED") == "1":     # the ASan runtime is not first when a library is preloaded
            env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0").lstrip(":")
        p = subprocess.run([K3VERIFY] + list(opts) + [pk], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=env, timeout=120)
        return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")

    def expect_io(self, rc, out, err, name, why):
        what = "%s\nstdout:\n%s\nstderr:\n%s" % (name, out, err)
        self.assertIn("k3_hook: ", err, "the hook did not act: " + what)
        self.assertIn(": done", err, "the change failed: " + what)
        self.assertGreaterEqual(rc, 0, "killed by signal %d: %s" % (-rc, what))
        self.assertNotIn("Sanitizer", err, what)
        self.assertNotIn("runtime error", err, what)
        self.assertEqual(rc, 3, "exit %d: %s" % (rc, what))
        line = [l for l in out.splitlines() if l.startswith(name + ": ")]
        self.assertEqual(len(line), 1, what)
        self.assertTrue(line[0].startswith(name + ": FAILED ("), what)
        self.assertIn(why, line[0], what)
        others = [l for l in out.splitlines() if not l.startswith(name + ": ")]
        self.assertTrue(all(l.endswith(": OK") for l in others), what)
        print(line[0])

    def test_truncated_mid_read(self):
        for size in (16 * MIB + 4096, 0):
            with self.subTest(size=size):
                pk = self.fresh()
                rc, out, err = self.verify(pk, SHARD, 16 * MIB, "truncate:%d" % size)
                self.expect_io(rc, out, err, SHARD, "changed while k3verify was reading it: it was truncated")

    def test_truncated_during_header_read(self):
        pk = self.fresh()
        rc, out, err = self.verify(pk, SHARD, 0, "truncate:64")
        self.expect_io(rc, out, err, SHARD, "it was truncated")
        pk = self.fresh()
        rc, out, err = self.verify(pk, SHARD, 0, "truncate:64", ["--quick"])
        self.expect_io(rc, out, err, SHARD, "it was truncated")

    def test_deleted_mid_read(self):
        pk = self.fresh()
        rc, out, err = self.verify(pk, SHARD, 16 * MIB, "unlink")
        self.expect_io(rc, out, err, SHARD, "changed while k3verify was reading it: it was deleted")
        self.assertFalse(os.path.exists(os.path.join(pk, SHARD)))

    def test_replaced_mid_read(self):
        """even by an identical copy: what was read is not the file the pack now holds"""
        pk = self.fresh()
        copy = os.path.join(self.work, "replacement.k3s")       # same file system, outside the pack
        shutil.copy(os.path.join(pk, SHARD), copy)
        rc, out, err = self.verify(pk, SHARD, 16 * MIB, "replace:" + copy)
        self.expect_io(rc, out, err, SHARD, "changed while k3verify was reading it: it was replaced by another file")

    def test_overwritten_mid_read(self):
        pk = self.fresh()
        rc, out, err = self.verify(pk, SHARD, 16 * MIB, "scribble:%d" % (20 * MIB))
        self.expect_io(rc, out, err, SHARD, "changed while k3verify was reading it: it was modified")

    def test_other_files(self):
        """the tokenizer file and manifest.json themselves"""
        pk = self.fresh()
        rc, out, err = self.verify(pk, "tiktoken.model", 0, "truncate:10")
        self.expect_io(rc, out, err, "tiktoken.model", "it was truncated")
        pk = self.fresh()
        rc, out, err = self.verify(pk, "manifest.json", 0, "truncate:100")
        self.expect_io(rc, out, err, "manifest.json", "ended early while being read")

    def test_at_rest(self):
        """the same truncation before k3verify starts: the file is damaged, exit 1"""
        pk = self.fresh()
        os.truncate(os.path.join(pk, SHARD), 16 * MIB + 4096)
        p = subprocess.run([K3VERIFY, pk], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn(SHARD + ": FAILED (size ", p.stdout.decode())


if __name__ == "__main__":
    unittest.main()
