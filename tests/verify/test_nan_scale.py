"""MXFP4 scales of 0xFF (issue 9 item 2): E8M0 code 255 is NaN (docs/FORMAT.md 3)
and has no place in a pack.

  * k3pack on the tiny checkpoint with one weight_scale byte of one expert set
    to 255: exit 1 naming the tensor and "NaN in E8M0", no manifest.json;
  * a pack holding such a byte with every hash matching it (the shard's record
    hash, file hash and the manifest's checksum recomputed, as a buggy or
    hostile writer would): k3verify exits 1 naming the expert, its layer and
    the part (kind "value" in --json); --quick does not read data; k3run
    exits 1 naming the layer and expert before it computes anything (it used
    to print garbage: the kernels map 255 to NaN)."""

import json
import os
import shutil
import struct
import subprocess
import sys
import unittest

import xxhash

SRC = os.environ.get("K3_SRC", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BIN = os.environ.get("K3_BIN", os.path.join(SRC, "build", "bin"))
TMP = os.environ.get("K3_TEST_TMP", "/tmp")
sys.path.insert(0, os.path.join(SRC, "tests", "run"))
sys.path.insert(0, os.path.join(SRC, "tests", "pack"))
from runlib import make_pack      # noqa: E402
from check_pack import seal       # noqa: E402

ENV = dict(os.environ, K3_NO_PROGRESS="1")
LAYER, EXPERT, PART = 2, 5, "w3.weight_scale"


def run(args):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


class TestNanScale(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ck, cls.pk = make_pack("tiny", 29)
        if run([os.path.join(BIN, "k3verify"), "--quick", "-q", cls.pk])[0] != 0:   # an older k3pack's
            shutil.rmtree(cls.pk)
            cls.ck, cls.pk = make_pack("tiny", 29)
        cls.work = os.path.join(TMP, "verify-nan")
        shutil.rmtree(cls.work, ignore_errors=True)
        os.makedirs(cls.work)

    def test_k3pack_refuses(self):
        ck = os.path.join(self.work, "ck")
        shutil.copytree(self.ck, ck)
        idx = json.load(open(os.path.join(ck, "model.safetensors.index.json")))["weight_map"]
        name = [n for n in idx if n.endswith("layers.%d.block_sparse_moe.experts.%d.%s" % (LAYER, EXPERT, PART))][0]
        path = os.path.join(ck, idx[name])
        with open(path, "r+b") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            hdr = json.loads(f.read(n))
            b, e = hdr[name]["data_offsets"]
            f.seek(8 + n + b + (e - b) // 2)
            f.write(b"\xff")
        out = os.path.join(self.work, "out")
        rc, _, err = run([os.path.join(BIN, "k3pack"), "-q", ck, "-o", out])
        self.assertEqual(rc, 1, err)
        self.assertIn("tensor '%s': scale byte %d is 255, NaN in E8M0" % (name, (e - b) // 2), err)
        self.assertFalse(os.path.exists(os.path.join(out, "manifest.json")))
        print(err.strip().splitlines()[-1])

    def test_k3verify_names_it(self):
        pk = os.path.join(self.work, "pack")
        shutil.copytree(self.pk, pk)
        m = json.load(open(os.path.join(pk, "manifest.json")))
        x = [x for x in m["expert_layers"] if x["layer"] == LAYER][0]
        part = [p for p in x["parts"] if p["name"] == PART][0]
        at = x["offset"] + EXPERT * x["stride"] + part["offset"] + 7
        shard = os.path.join(pk, x["shard"])
        with open(shard, "r+b") as f:
            f.seek(at)
            f.write(b"\xff")
        data = open(shard, "rb").read()
        base = x["offset"] + EXPERT * x["stride"]
        x["xxh3_64"][EXPERT] = xxhash.xxh3_64_hexdigest(data[base:base + x["record_size"]])
        s = [s for s in m["shards"] if s["name"] == x["shard"]][0]
        s["xxh3_128"] = xxhash.xxh3_128_hexdigest(data)
        open(os.path.join(pk, "manifest.json"), "wb").write(seal(m))
        k3v = os.path.join(BIN, "k3verify")
        rc, out, err = run([k3v, "--quick", pk])
        self.assertEqual(rc, 0, out + err)                  # sizes and headers are fine
        rc, out, err = run([k3v, pk])
        self.assertEqual(rc, 1, out + err)
        self.assertIn("%s: FAILED (expert %d of layer %d, part '%s': scale byte at offset %d is 255, NaN in E8M0)"
                      % (x["shard"], EXPERT, LAYER, PART, at), out)
        self.assertEqual(out.count("FAILED"), 1, out)
        rc, out, err = run([k3v, "--json", pk])
        self.assertIn('"kind":"value"', out)
        self.assertIn('"expert":%d,"layer":%d' % (EXPERT, LAYER), out)
        print([l for l in out.splitlines() if '"value"' in l][0])
        # k3run reads every record at load (all resident) and refuses it before computing anything
        rc, out, err = run([os.path.join(BIN, "k3run"), "-m", pk, "-p", "hello", "-n", "4"])
        self.assertEqual(rc, 1, err)
        self.assertEqual(out, "")
        self.assertIn("'%s': layer %d expert %d (record at offset %d): an MXFP4 scale is 0xFF (NaN in E8M0)"
                      % (os.path.join(pk, x["shard"]), LAYER, EXPERT, base), err)
        print(err.strip().splitlines()[-1])


if __name__ == "__main__":
    unittest.main()
