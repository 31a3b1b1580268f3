"""k3run across MPI ranks (issue 19; k3run/dist/dist.h): `mpirun -n R k3run ...` divides the routed
experts of every MoE layer among R processes (expert e on rank e % R), each reading, caching and
multiplying only its own within its own --budget, and rank 0 combines their outputs in k3's order.

  - the text is the single process's, byte for byte, at 1, 2, 3 and 4 ranks, greedy and seeded, on
    tiny, small and the trained demo model, at the planner's minimum budget per rank (below each
    rank's share of the experts), and resident; with speculative decoding; a chat session saved at
    2 ranks and continued at 3 equals one process that never stopped;
  - rank 0 acquires only its own experts (its expert count falls as 1/R);
  - a rank given another pack is refused before any weight is read, by rank 0, naming the rank;
  - a rank whose expert shard is damaged stops every rank with rank 0's message naming that rank
    and the shard;
  - a rank killed mid-generation: every process is gone within seconds, the job exits non-zero
    and says which rank died.
TestTrunkSplit: the trunk's large matrices split by rows among the ranks too (K3_TRUNK=split; the
default, auto, splits it wherever every rank's slices fit, so most of TestMpi runs that way and its
minimum-budget cases on rank 0): the same text on tiny, small, kjv and a Q8 trunk, sampled, drafted
and in chat; bytes sent exactly k3inspect's; rank 0 keeps only its slices (its RSS falls); a budget
that cannot hold a rank's slices is refused under split and puts the trunk on rank 0 under auto.
One process per rank, on this machine (--oversubscribe). Where k3run is built without MPI
(K3_MPI_BUILT=0: K3_MPI=OFF or no Open MPI), only TestWithoutMpi runs: under mpirun such a k3run
refuses to start (each rank would otherwise run the whole model alone) and says how to get MPI."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import unittest

from runlib import BIN, TMP, kjv_pack, make_pack, minimum_budget, run

K3RUN = os.path.join(BIN, "k3run")
ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1",
       "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMP_WAIT_POLICY": "passive"}


def mpirun(n, args, check=True, timeout=300, mpmd=None, env=None):
    cmd = ["mpirun"] + sum((["-x", k] for k in (env or {})), []) + ["-n", str(n), K3RUN] + args
    if mpmd:                                   # another program for the last ranks: [(n, args)]
        for m, a in mpmd:
            cmd += [":", "-n", str(m), K3RUN] + a
    e = dict(os.environ)
    e.update(ENV)
    e.update(env or {})
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError("%s failed (%d): %s" % (" ".join(cmd), p.returncode, p.stderr.decode(errors="replace")))
    return p


def one(args):
    return run([K3RUN] + args).stdout


BUILT = os.environ.get("K3_MPI_BUILT", "1") == "1"


@unittest.skipIf(BUILT, "k3run has MPI support")
class TestWithoutMpi(unittest.TestCase):
    def test_refused(self):
        tiny = make_pack("tiny", 1)[1]
        p = mpirun(2, ["-m", tiny, "-p", "x", "-n", "2"], check=False)
        err = p.stderr.decode(errors="replace")
        self.assertNotEqual(p.returncode, 0, err)
        self.assertIn("built without MPI", err)
        self.assertIn("libopenmpi-dev", err)
        self.assertEqual(p.stdout, b"", "a k3run without MPI generated under mpirun")


@unittest.skipUnless(BUILT, "k3run is built without MPI")
class TestMpi(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = os.path.join(TMP, "k3run-mpi")
        os.makedirs(cls.work, exist_ok=True)
        cls.tiny = make_pack("tiny", 1)[1]
        cls.kjv = kjv_pack(cls.work)

    def same(self, pack, args, ranks, what):
        want = one(["-m", pack] + args)
        self.assertTrue(want.strip(), "no output")
        for r in ranks:
            got = mpirun(r, ["-m", pack] + args).stdout
            self.assertEqual(got, want, "%s at %d ranks: other output than one process" % (what, r))

    def test_tiny_every_rank_count(self):
        b = str(minimum_budget(self.tiny))
        base = ["-p", "The quick brown fox", "-n", "24", "--print-ids", "-t", "1"]
        self.same(self.tiny, base, (1, 2, 3, 4), "tiny resident")
        self.same(self.tiny, base + ["--budget", b], (2, 3, 4), "tiny at the minimum budget")
        self.same(self.tiny, base + ["--budget", b, "--temp", "0.9", "--seed", "5"], (2, 3, 4), "tiny sampled")

    def test_small(self):
        small = make_pack("small", 7)[1]
        b = str(minimum_budget(small))
        self.same(small, ["-p", "Once upon a time", "-n", "8", "--print-ids", "-t", "1", "--budget", b], (2, 3),
                  "small at the minimum budget")

    def test_kjv_text_and_speculation(self):
        b = str(minimum_budget(self.kjv))
        base = ["-p", "In the beginning God created", "-n", "40", "-t", "1"]
        self.same(self.kjv, base, (2, 4), "kjv text")
        self.same(self.kjv, base + ["--budget", b, "--temp", "0.8", "--seed", "11"], (3,), "kjv sampled")
        self.same(self.kjv, base + ["--draft", "4", "--budget", b], (2, 3), "kjv with speculation")

    def test_rank0_only_its_share(self):
        b = str(minimum_budget(self.tiny))
        args = ["-m", self.tiny, "-p", "hello there", "-n", "12", "--budget", b, "--json", "-t", "1"]
        acq = {}
        for r in (1, 2, 4):
            d = json.loads(mpirun(r, args).stdout)
            acq[r] = d["expert_hits"] + d["expert_misses"]
        self.assertLess(acq[2], acq[1] * 0.65, acq)
        self.assertLess(acq[4], acq[1] * 0.4, acq)

    def test_network_bytes_as_planned(self):
        """What rank 0 sends per decoded token is what k3inspect --plan --ranks predicts, exactly;
        what it receives depends on the routing and lies within the plan's bounds."""
        for R in (2, 3):
            docs = [json.loads(mpirun(R, ["-m", self.kjv, "-p", "In the beginning", "-n", str(n), "-t", "1",
                                          "--json"]).stdout) for n in (6, 14)]
            dn = len(docs[1]["generated_ids"]) - len(docs[0]["generated_ids"])
            self.assertEqual(dn, 8)
            sent = (docs[1]["network_bytes_sent"] - docs[0]["network_bytes_sent"]) / dn
            recv = (docs[1]["network_bytes_received"] - docs[0]["network_bytes_received"]) / dn
            plan = json.loads(run([os.path.join(BIN, "k3inspect"), "--plan", "--budget", "4G", "--ranks", str(R),
                                   "--json", self.kjv]).stdout)
            self.assertEqual(sent, plan["network_sent_bytes_per_token"], "rank 0's bytes sent per token")
            status = plan["experts"]["moe_layers"] * 260 * (R - 1)    # every rank's status, every layer
            rows = (plan["network_received_bytes_per_token"] - status) * R / (R - 1)   # if no slot were rank 0's
            self.assertGreater(recv, status)
            self.assertLessEqual(recv, status + rows + 1e-6)
            self.assertEqual(docs[1]["ranks"], R)

    def test_rank0_without_experts(self):
        """K3_RANK0_EXPERTS=0: rank 0 keeps only the trunk (it acquires no expert), the others share
        the experts; the same output; bytes sent as k3inspect --plan --ranks R --rank0-experts no says"""
        b = str(minimum_budget(self.tiny))
        base = ["-p", "The quick brown fox", "-n", "16", "--print-ids", "-t", "1", "--budget", b]
        want = one(["-m", self.tiny] + base)
        no0 = {"K3_RANK0_EXPERTS": "0"}
        for R in (2, 3):
            self.assertEqual(mpirun(R, ["-m", self.tiny] + base, env=no0).stdout, want, "%d ranks" % R)
            docs = [json.loads(mpirun(R, ["-m", self.kjv, "-p", "In the beginning", "-n", str(n), "-t", "1", "--json"],
                                      env=no0).stdout) for n in (6, 14)]
            self.assertEqual(docs[1]["expert_hits"] + docs[1]["expert_misses"], 0, "rank 0 acquired experts")
            sent = (docs[1]["network_bytes_sent"] - docs[0]["network_bytes_sent"]) / 8
            plan = json.loads(run([os.path.join(BIN, "k3inspect"), "--plan", "--budget", "4G", "--ranks", str(R),
                                   "--rank0-experts", "no", "--json", self.kjv]).stdout)
            self.assertEqual(sent, plan["network_sent_bytes_per_token"])
            self.assertFalse(plan["rank0_experts"])
            self.assertEqual(plan["experts"]["total"], 0)
            recv = (docs[1]["network_bytes_received"] - docs[0]["network_bytes_received"]) / 8
            self.assertEqual(recv, plan["network_received_bytes_per_token"], "every slot comes from another rank")

    def test_chat_session_across_rank_counts(self):
        sess = os.path.join(self.work, "a.k3session")
        chat = ["chat", "-m", self.kjv, "--think", "off", "-n", "40", "-t", "1"]
        want1 = one(chat + ["-p", "Quote Genesis 1:1.", "--save-session", sess + ".1"])
        want2 = one(chat + ["-p", "And John 3:16?", "--load-session", sess + ".1"])
        got1 = mpirun(2, chat + ["-p", "Quote Genesis 1:1.", "--save-session", sess]).stdout
        got2 = mpirun(3, chat + ["-p", "And John 3:16?", "--load-session", sess]).stdout
        self.assertEqual(got1, want1)
        self.assertEqual(got2, want2)
        with open(sess, "rb") as a, open(sess + ".1", "rb") as c:
            self.assertEqual(a.read(), c.read(), "the sessions saved at 2 ranks and by one process differ")

    def test_serve(self):
        """k3run serve under mpirun answers /v1/completions with one process's text, and stops on SIGTERM"""
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "serve"))
        import servelib
        for k, v in ENV.items():
            os.environ.setdefault(k, v)
        prompts = ["In the beginning God", "And the LORD said unto Moses", "Blessed is the man"]
        # the last one sampled (the same seed, the same text as k3run -p alone)
        sampling = [{"temperature": 0}, {"temperature": 0}, {"temperature": 0.8, "top_p": 0.95, "seed": 9}]
        want = [one(["-m", self.kjv, "-p", p, "-n", "40", "-q"] +
                    (["--temp", "0.8", "--top-p", "0.95", "--seed", "9"] if i == 2 else []))
                for i, p in enumerate(prompts)]
        # one slot, then three sharing the passes (issue 33) at 3 and 2 ranks: the ranks see rows,
        # not conversations
        for par, ranks in (("1", "3"), ("3", "3"), ("3", "2")):
            srv = servelib.Server(self.kjv, ["-t", "1", "--parallel", par], prefix=["mpirun", "-n", ranks])
            try:
                got = [None] * len(prompts)

                def ask(i):
                    st, _, body = srv.post("/v1/completions", dict(sampling[i], prompt=prompts[i], max_tokens=40))
                    got[i] = (st, body)
                ts = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts) if par != "1" else 1)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join(300)
                for i in range(len(ts)):
                    st, body = got[i]
                    self.assertEqual(st, 200, body)
                    self.assertEqual(json.loads(body)["choices"][0]["text"].encode(), want[i],
                                     "--parallel %s, %s ranks, request %d" % (par, ranks, i))
                if par != "1":
                    st, _, body = srv.request("GET", "/metrics")
                    m = dict(re.findall(r"^(k3_pass(?:es|_sequences)_total) (\S+)$", body.decode(), re.M))
                    self.assertGreater(float(m["k3_pass_sequences_total"]), float(m["k3_passes_total"]),
                                       "%s ranks: no pass carried two conversations" % ranks)
            finally:
                t0 = time.time()
                srv.stop()
                self.assertLess(time.time() - t0, 20)

    def test_other_pack_refused(self):
        p = mpirun(1, ["-m", self.tiny, "-p", "x", "-n", "2"], check=False,
                   mpmd=[(1, ["-m", self.kjv, "-p", "x", "-n", "2"])])
        err = p.stderr.decode(errors="replace")
        self.assertEqual(p.returncode, 2, err)
        self.assertIn("rank 1 has another pack than rank 0", err)
        self.assertEqual(err.count("another pack"), 1, "more than one rank said it: " + err)

    def test_damaged_shard_on_one_rank(self):
        bad = os.path.join(self.work, "tiny-bad")
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(self.tiny, bad)
        shard = sorted(f for f in os.listdir(bad) if f.startswith("experts-"))[0]
        with open(os.path.join(bad, shard), "r+b") as f:
            f.truncate(os.path.getsize(os.path.join(bad, shard)) - 4096)
        p = mpirun(1, ["-m", self.tiny, "-p", "x", "-n", "2"], check=False,
                   mpmd=[(1, ["-m", bad, "-p", "x", "-n", "2"])])
        err = p.stderr.decode(errors="replace")
        self.assertNotEqual(p.returncode, 0, err)
        self.assertIn("rank 1 of 2", err)
        self.assertIn(shard, err)

    def test_rank_killed(self):
        e = dict(os.environ)
        e.update(ENV)
        t0 = time.time()
        p = subprocess.Popen(["mpirun", "-n", "2", K3RUN, "-m", self.kjv, "-p", "In the beginning", "-n", "16000",
                              "-t", "1", "--context", "16384"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=e)
        victim = None
        while victim is None and time.time() - t0 < 60:   # rank 1's process, once it serves
            time.sleep(0.5)
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    with open("/proc/%s/environ" % pid, "rb") as f:
                        env = f.read().split(b"\0")
                    exe = os.readlink("/proc/%s/exe" % pid)
                except OSError:
                    continue
                if exe.endswith("/k3run") and b"OMPI_COMM_WORLD_RANK=1" in env:
                    victim = int(pid)
        self.assertIsNotNone(victim, "rank 1 never started")
        time.sleep(2)                                    # mid-generation
        os.kill(victim, signal.SIGKILL)
        t1 = time.time()
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            self.fail("the job was still running 30 s after rank 1 died")
        took = time.time() - t1
        err = err.decode(errors="replace")
        self.assertNotEqual(p.returncode, 0, err)
        self.assertRegex(err, r"rank 1", err)
        self.assertLess(took, 15, "every process gone only after %.1f s" % took)
        print("rank 1 killed: the job ended %.1f s later, exit %d" % (took, p.returncode))


SPLIT = {"K3_TRUNK": "split", "K3_SPLIT_MIN": "0"}      # every matrix of two blocks or more split


def plan_json(pack, R, budget="4G", extra=()):
    return json.loads(run([os.path.join(BIN, "k3inspect"), "--plan", "--budget", budget, "--ranks", str(R), "--json"]
                          + list(extra) + [pack]).stdout)


def split_budget(pack, R):
    """The smallest budget per rank (to 64 KiB) at which every rank of R keeps its slices of the split
    trunk in memory, by k3inspect's plan: below it, k3run refuses the split."""
    lo, hi = 1 << 20, 1 << 33
    def fits(b):
        try:
            p = plan_json(pack, R, str(b), ["--trunk", "split", "--split-min", "0"])
        except AssertionError:
            return False
        return not p["trunk"]["streamed"] and not p["other_ranks"]["trunk"]["streamed"]
    while hi - lo > 65536:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


@unittest.skipUnless(BUILT, "k3run is built without MPI")
class TestTrunkSplit(unittest.TestCase):
    """K3_TRUNK=split: every large trunk matrix cut by rows among the ranks (plan.h), each rank
    multiplying its own slice; the text is still the single process's, byte for byte."""

    @classmethod
    def setUpClass(cls):
        cls.work = os.path.join(TMP, "k3run-mpi")
        os.makedirs(cls.work, exist_ok=True)
        cls.tiny = make_pack("tiny", 1)[1]
        cls.kjv = kjv_pack(cls.work)

    def same(self, pack, args, ranks, what, env=SPLIT, budget=None):
        """budget: each rank's, below what one process needs (the budget never changes the text)"""
        cmd = args[:1] + ["-m", pack] + args[1:] if args[0] == "chat" else ["-m", pack] + args
        want = one(cmd)
        self.assertTrue(want.strip(), "no output")
        for r in ranks:
            p = mpirun(r, cmd + (["--budget", str(budget)] if budget else []), env=env)
            self.assertEqual(p.stdout, want, "%s at %d ranks, the trunk split: other output than one process" % (what, r))

    def test_tiny_and_small(self):
        base = ["-p", "The quick brown fox", "-n", "24", "--print-ids", "-t", "1"]
        self.same(self.tiny, base, (2, 3, 4), "tiny resident")
        self.same(self.tiny, base + ["--temp", "0.9", "--seed", "5"], (2, 4), "tiny sampled")
        b = split_budget(self.tiny, 3)                        # the experts through a cache
        self.assertLess(b, minimum_budget(self.tiny), "the split minimum is not below one process's")
        self.same(self.tiny, base, (3,), "tiny at the split minimum", budget=b)
        small = make_pack("small", 7)[1]
        self.same(small, ["-p", "Once upon a time", "-n", "8", "--print-ids", "-t", "2"], (2, 3), "small")

    def test_compact_trunk(self):
        """A Q8 trunk (k3pack --trunk q8): each rank keeps its rows of the codes and of their scales."""
        q8 = os.path.join(self.work, "tiny-q8.k3pack")
        if not os.path.exists(os.path.join(q8, "manifest.json")):
            run([os.path.join(BIN, "k3pack"), "-q", "--trunk", "q8", make_pack("tiny", 1)[0], "-o", q8])
        self.same(q8, ["-p", "The quick brown fox", "-n", "24", "--print-ids", "-t", "1"], (2, 3), "tiny, Q8 trunk")
        plan = plan_json(q8, 3, extra=["--trunk", "split", "--split-min", "0"])
        d = json.loads(mpirun(3, ["-m", q8, "-p", "x", "-n", "2", "--json", "-t", "1"], env=SPLIT).stdout)
        self.assertEqual(d["trunk_resident_bytes"], plan["trunk"]["resident_bytes"])

    def test_kjv_text_speculation_chat(self):
        base = ["-p", "In the beginning God created", "-n", "40", "-t", "1"]
        self.same(self.kjv, base, (2, 3, 4), "kjv text")
        self.same(self.kjv, base + ["--temp", "0.8", "--seed", "11", "--draft", "4"], (3,), "kjv sampled, drafted")
        self.same(self.kjv, base, (2,), "kjv, the default K3_SPLIT_MIN", env={"K3_TRUNK": "split"})
        chat = ["chat", "--think", "off", "-n", "30", "-t", "1", "-p", "Quote Genesis 1:1."]
        self.same(self.kjv, chat, (2,), "kjv chat")

    def test_network_and_memory_as_planned(self):
        """Bytes sent per decoded token are k3inspect --trunk split's exactly, and bytes received lie
        within its bounds; each rank keeps only its slices: rank 0's trunk is the plan's, and its
        peak RSS falls by what its plan drops."""
        for R, env in ((2, SPLIT), (3, SPLIT), (3, {"K3_TRUNK": "split"})):
            docs = [json.loads(mpirun(R, ["-m", self.kjv, "-p", "In the beginning", "-n", str(n), "-t", "1",
                                          "--json"], env=env).stdout) for n in (6, 14)]
            self.assertEqual(docs[1]["trunk_placement"], "split")
            sent = (docs[1]["network_bytes_sent"] - docs[0]["network_bytes_sent"]) / 8
            recv = (docs[1]["network_bytes_received"] - docs[0]["network_bytes_received"]) / 8
            plan = plan_json(self.kjv, R, extra=["--trunk", "split", "--split-min", env.get("K3_SPLIT_MIN", "1M")])
            self.assertEqual(plan["trunk_placement"], "split")
            self.assertEqual(sent, plan["network_sent_bytes_per_token"], "%d ranks, %s" % (R, env))
            moe = plan_json(self.kjv, R, extra=["--trunk", "rank0"])
            self.assertGreater(sent, moe["network_sent_bytes_per_token"], "no trunk exchange")
            split_recv = plan["network_received_bytes_per_token"] - moe["network_received_bytes_per_token"]
            status = moe["experts"]["moe_layers"] * 260 * (R - 1)
            self.assertGreater(recv, split_recv + status)
            self.assertLessEqual(recv, split_recv + status + (moe["network_received_bytes_per_token"] - status)
                                 * R / (R - 1) + 1e-6)
            self.assertEqual(docs[1]["trunk_resident_bytes"], plan["trunk"]["resident_bytes"])
        small = make_pack("small", 7)[1]
        args = ["-m", small, "-p", "Once upon a time", "-n", "4", "-t", "1", "--json"]
        whole, split = (json.loads(mpirun(3, args, env=e).stdout) for e in ({"K3_TRUNK": "rank0"}, SPLIT))
        plan = plan_json(small, 3, extra=["--trunk", "split", "--split-min", "0"])
        self.assertEqual(split["trunk_resident_bytes"], plan["trunk"]["resident_bytes"])
        drop = whole["trunk_resident_bytes"] - split["trunk_resident_bytes"]
        self.assertGreater(drop, whole["trunk_resident_bytes"] * 0.5, "rank 0 keeps more than its third and the rest")
        self.assertLess(plan["other_ranks"]["trunk"]["resident_bytes"], whole["trunk_resident_bytes"] * 0.4)
        self.assertLess(split["peak_rss_bytes"], whole["peak_rss_bytes"] - 0.8 * drop,
                        "rank 0's RSS did not fall with its slices: %d -> %d, its plan drops %d" %
                        (whole["peak_rss_bytes"], split["peak_rss_bytes"], drop))

    def test_refused_when_a_slice_does_not_fit_and_auto(self):
        b = str(minimum_budget(self.tiny))
        p = mpirun(2, ["-m", self.tiny, "-p", "x", "-n", "2", "--budget", b], env=SPLIT, check=False)
        err = p.stderr.decode(errors="replace")
        self.assertEqual(p.returncode, 2, err)
        self.assertIn("K3_TRUNK=split", err)
        self.assertIn("does not fit", err)
        self.assertEqual(p.stdout, b"")
        # the default (auto) puts the trunk on rank 0 there, and splits it where the slices fit
        args = ["-m", self.tiny, "-p", "The quick brown fox", "-n", "12", "-t", "1", "--json"]
        d = json.loads(mpirun(2, args + ["--budget", b]).stdout)
        self.assertEqual(d["trunk_placement"], "rank0")
        self.assertEqual(plan_json(self.tiny, 2, b)["trunk_placement"], "rank0", "k3inspect decides otherwise")
        d2 = json.loads(mpirun(2, args).stdout)
        self.assertEqual(d2["trunk_placement"], "split")
        self.assertEqual(plan_json(self.tiny, 2)["trunk_placement"], "split")
        self.assertEqual(d["generated_ids"], d2["generated_ids"])
        self.assertEqual(json.loads(mpirun(2, args, env={"K3_TRUNK": "rank0"}).stdout)["trunk_placement"], "rank0")
        p = mpirun(2, ["-m", self.tiny, "-p", "x", "-n", "2"], env={"K3_TRUNK": "sideways"}, check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("K3_TRUNK='sideways'", p.stderr.decode(errors="replace"))


if __name__ == "__main__":
    unittest.main()
