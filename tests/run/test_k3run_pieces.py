"""Row pieces (issue 16 part 3): a streamed unit larger than a chunk (K3_CHUNK) is read as row
pieces of its large matrices plus a small part, so real K3's floor is two chunks instead of two
2.19 GiB units. Here the chunk is made small enough (8 KiB, 16 KiB, 64 KiB) that the trained demo
model's and tiny's units are all split, and at the planner's minimum for that chunk (everything
streamed, a minimal expert cache) k3run writes the same ids as with the whole model in memory:
greedy and seeded sampling, 1 and 2 threads, prompt batches of 1, 3 and 64 rows, and speculative
verify passes. Pieces of 8 KiB rows are not 4 KiB-aligned (buffered reads), those of 16 KiB are
(O_DIRECT where the file system has it). A byte flipped inside one piece of a tensor (its first,
one in the middle, its last) fails the run with exit 1 naming the shard, the tensor and its
offset, before any token is written; the hash is the whole tensor's (the manifest's), checked
as its last piece lands."""

import json
import os
import re
import shutil
import unittest
from math import gcd

from runlib import BIN, TMP, k3run, kjv_pack, make_pack, run

SANITIZED = os.environ.get("K3_SANITIZED") == "1"
SAMPLING = ["--temp", "0.9", "--top-p", "0.95", "--seed", "5"]
KJV_PROMPT = "In the beginning God created the heaven and the earth. And the earth was without form"


def minimum(pack, chunk, extra=()):
    p = k3run(["-m", pack, "-p", "x", "--budget", "1M"] + list(extra), env={"K3_CHUNK": chunk}, check=False)
    m = re.search(rb"minimum of [0-9.]+ GiB \((\d+) bytes", p.stderr)
    assert p.returncode == 2 and m, p.stderr
    return int(m.group(1))


def n_units(pack):
    """the number of trunk units (layers and the head) from k3inspect's plan"""
    p = run([os.path.join(BIN, "k3inspect"), "--plan", "--budget", "1G", "--json", pack])
    return len(json.loads(p.stdout)["trunk"]["unit_bytes"])


def piece_rows(rows, rb, chunk):
    """rows per piece, from plan.h's definition (independent of plan.c)"""
    r = max(chunk // rb, 1)
    g = 4096 // gcd(rb, 4096)
    if r >= g:
        r -= r % g
    return min(r, rows)


class Pieces:
    """a subclass sets pack, prompt (k3run arguments), n_units and n"""

    def gen(self, extra, chunk=None):
        env = {"K3_CHUNK": chunk} if chunk else {"K3_CHUNK": "off"}
        p = k3run(["-m", self.pack] + self.prompt + ["-n", str(self.n), "--json"] + extra, env=env)
        return json.loads(p.stdout)

    def test_same_ids_at_the_minimum(self):
        # each chunk with one prompt batch: 8 KiB rows unaligned, batch 1 (every row of the prompt
        # its own pass over the pieces); 16 KiB aligned, 3 rows; 64 KiB, the whole prompt at once
        cases = (("16K", "3"),) if SANITIZED else (("8K", "1"), ("16K", "3"), ("64K", "64"))
        budgets = {chunk: minimum(self.pack, chunk, ["-b", batch]) for chunk, batch in cases}   # each its own least
        for sampler in ([], SAMPLING):
            for threads in ("1", "2"):
                ref = self.gen(sampler + ["-t", threads])
                self.assertEqual(ref["trunk_units_streamed"], 0)
                self.assertGreater(len(ref["generated_ids"]), 8)
                for chunk, batch in cases:
                    budget = budgets[chunk]
                    with self.subTest(sampled=bool(sampler), threads=threads, chunk=chunk, batch=batch):
                        d = self.gen(sampler + ["-t", threads, "-b", batch, "--budget", str(budget)], chunk)
                        self.assertEqual(d["generated_ids"], ref["generated_ids"])
                        self.assertGreater(d["trunk_pieces_read"], 0)
                        self.assertGreater(d["trunk_units_in_pieces"], 0)
                        if chunk == "8K":      # every unit is larger: all streamed ones split
                            self.assertEqual(d["trunk_units_in_pieces"], d["trunk_units_streamed"])
                            self.assertGreaterEqual(d["trunk_units_streamed"], self.n_units - 2)

    def test_each_byte_once_per_pass(self):
        """a decode pass reads each streamed tensor once: the bytes of one more generated token are
        the streamed units' tensors and one embedding row exactly (a piece read ahead in the wrong order is read twice;
        an MLA layer's g_proj and o_proj once were, listed among the KDA ids)"""
        for chunk in ("8K", "64K"):
            budget = minimum(self.pack, chunk)
            plan = json.loads(run([os.path.join(BIN, "k3inspect"), "--plan", "--budget", str(budget), "--json",
                                   self.pack], env={"K3_CHUNK": chunk}).stdout)["trunk"]["streamed"]
            units = {"head" if u == "head" else int(u) for u in plan}
            want = 0
            for t in self.manifest["tensors"]:
                m = re.match(r"model\.layers\.(\d+)\.", t["name"])
                if "embed_tokens" in t["name"]:
                    want += t["size"] // t["shape"][0]          # the token's embedding row
                    continue
                if ".experts." in t["name"] and ".shared_experts." not in t["name"]:
                    continue
                if (int(m.group(1)) if m else "head") in units:
                    want += t["size"]
            got = []
            for n in (3, 4):
                d = self.gen(["-n", str(n), "--budget", str(budget)], chunk)
                self.assertEqual(d["generated_tokens"], n)
                got.append(d["trunk_bytes_read"])
            with self.subTest(chunk=chunk):
                self.assertEqual(got[1] - got[0], want)

    def test_verify_passes_in_pieces(self):
        ref = self.gen([])
        budget = minimum(self.pack, "16K") + (1 << 20)     # room for the verify buffers
        ids = ",".join(str(i) for i in ref["generated_ids"])
        for mode in ("oracle", "oracle-spoil"):      # drafts of plain decoding's ids: right, one spoiled
            with self.subTest(drafts=mode):
                p = k3run(["-m", self.pack] + self.prompt + ["-n", str(self.n), "--json", "--budget", str(budget),
                                                             "--draft", "8"],
                          env={"K3_CHUNK": "16K", "K3_DRAFT_TEST": mode + ":" + ids})
                d = json.loads(p.stdout)
                self.assertEqual(d["generated_ids"], ref["generated_ids"])
                self.assertGreater(d["drafted"], 0)
                self.assertGreater(d["trunk_pieces_read"], 0)


class TestKjv(Pieces, unittest.TestCase):
    n = 24

    @classmethod
    def setUpClass(cls):
        cls.pack = kjv_pack(os.path.join(TMP, "k3run-pieces"))
        cls.prompt = ["-p", KJV_PROMPT]
        cls.n_units = n_units(cls.pack)
        with open(os.path.join(cls.pack, "manifest.json")) as f:
            cls.manifest = json.load(f)

    def flip_run(self, tensor, where, chunk):
        """a copy of the pack with one byte flipped in piece `where` (first, middle, last) of
        `tensor`; returns (k3run's result, the tensor's manifest entry)"""
        bad = os.path.join(TMP, "k3run-pieces", "flipped")
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(self.pack, bad)
        m = json.load(open(os.path.join(bad, "manifest.json")))
        t = [t for t in m["tensors"] if t["name"] == tensor][0]
        rows, rb = t["shape"][0], t["size"] // t["shape"][0]
        pr = piece_rows(rows, rb, int(chunk[:-1]) << 10)
        n = (rows + pr - 1) // pr
        self.assertGreater(n, 2, "%s is not in several pieces at %s" % (tensor, chunk))
        piece = {"first": 0, "middle": n // 2, "last": n - 1}[where]
        off = t["offset"] + piece * pr * rb + min(pr * rb, t["size"] - piece * pr * rb) // 2
        with open(os.path.join(bad, t["shard"]), "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0x10]))
        p = k3run(["-m", bad, "-p", KJV_PROMPT, "-n", "4", "--budget", str(minimum(bad, chunk))],
                  env={"K3_CHUNK": chunk}, check=False)
        return p, t

    def test_flipped_byte_in_a_piece_is_named(self):
        cases = [("lm_head.weight", "middle", "8K"), ("lm_head.weight", "first", "16K"),
                 ("model.layers.2.self_attn.q_proj.weight", "last", "8K"),
                 ("model.layers.4.block_sparse_moe.shared_experts.down_proj.weight", "middle", "16K")]
        if SANITIZED:
            cases = cases[:1]
        for tensor, where, chunk in cases:
            with self.subTest(tensor=tensor, piece=where, chunk=chunk):
                p, t = self.flip_run(tensor, where, chunk)
                err = p.stderr.decode(errors="replace")
                self.assertEqual(p.returncode, 1, err)
                self.assertIn("'%s'" % tensor, err)
                self.assertIn(t["shard"], err)
                self.assertIn("at offset %d (%d bytes" % (t["offset"], t["size"]), err)
                self.assertIn("row pieces", err)
                self.assertIn("XXH3-64 does not match the manifest", err)
                self.assertEqual(p.stdout, b"", "output written before the damage was found")

    def test_chunk_setting(self):
        """K3_CHUNK=off streams whole units (no pieces); a size below 4 KiB is 4 KiB; the plan says so"""
        for chunk, split in (("off", 0), ("1K", self.n_units), ("64K", None)):
            p = run([os.path.join(BIN, "k3inspect"), "--plan", "--budget", str(minimum(self.pack, chunk)),
                     "--json", self.pack], env={"K3_CHUNK": chunk})
            tr = json.loads(p.stdout)["trunk"]
            self.assertEqual(tr["chunk_bytes"], {"off": 0, "1K": 4096, "64K": 65536}[chunk])
            big = sum(u > (tr["chunk_bytes"] or 1 << 62) for u in tr["unit_bytes"])
            self.assertEqual(tr["chunked_units"], big if split is None else split)
            self.assertEqual(sum(s > 0 for s in tr["unit_small_bytes"]), tr["chunked_units"])


class TestTiny(Pieces, unittest.TestCase):
    n = 16

    @classmethod
    def setUpClass(cls):
        _, cls.pack = make_pack("tiny", 1)
        cls.prompt = ["-p", "The quick brown fox jumps over the lazy dog"]
        cls.n_units = n_units(cls.pack)
        with open(os.path.join(cls.pack, "manifest.json")) as f:
            cls.manifest = json.load(f)


if __name__ == "__main__":
    unittest.main()
