"""`k3run serve` through the official npm `openai` SDK (issue 17; ctest serve.sdk): chat completions,
non-streamed and streamed, whose text equals `k3run chat --messages` on the same request byte for
byte (greedy and seeded sampling); a tool round trip; the same seed twice; the second turn of a
conversation served from the cache (usage says so); a whole tool round trip (a call read by
the SDK, streamed and not, from a server whose answer is scripted with K3_TEST_ANSWER, since the
demo model was not trained to call tools; its result answered by the model); a raw completion equal to `k3run -p`; a bad
request as the SDK's BadRequestError. Skipped, with the reason, where node or the SDK is missing
(scripts/setup.sh installs it into tests/serve/node_modules)."""

import json
import os
import shutil
import subprocess
import unittest

from servelib import BIN, Server, TMP, k3run_chat, kjv_pack, need

HERE = os.path.dirname(os.path.abspath(__file__))
SDK = os.path.join(HERE, "node_modules", "openai", "package.json")


def msgs(*turns):
    return [{"role": r, "content": c} for r, c in turns]


@need(shutil.which("node"), "node is not installed (scripts/setup.sh installs Debian's nodejs)")
@need(os.path.exists(SDK), "the openai SDK is not installed: run scripts/setup.sh (npm ci in tests/serve)")
class TestSdk(unittest.TestCase):
    def test_sdk(self):
        work = os.path.join(TMP, "k3run-serve-sdk")
        os.makedirs(work, exist_ok=True)
        pack = kjv_pack(work)
        greedy = {"model": "k3-kjv.k3pack", "messages": msgs(("user", "Quote Genesis 1:1.")), "max_tokens": 80}
        sampled = {"model": "k3-kjv.k3pack", "messages": msgs(("system", "Answer briefly."),
                                                             ("user", "What does John 3:16 say?")),
                   "max_tokens": 60, "temperature": 0.8, "top_p": 0.9, "seed": 5}
        tools = {"model": "k3-kjv.k3pack", "max_tokens": 50, "tools": [
            {"type": "function", "function": {"name": "lookup", "description": "Find a verse", "parameters": {
                "type": "object", "properties": {"ref": {"type": "string"}}, "required": ["ref"]}}}],
            "messages": [{"role": "user", "content": "Quote Genesis 1:1."},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "call_1", "type": "function",
                              "function": {"name": "lookup", "arguments": "{\"ref\": \"Genesis 1:1\"}"}}]},
                         {"role": "tool", "tool_call_id": "call_1",
                          "content": "In the beginning God created the heaven and the earth."}]}
        turn1 = {"model": "k3-kjv.k3pack", "messages": msgs(("user", "Quote Genesis 1:1.")), "max_tokens": 80,
                 "reasoning_effort": "none"}
        spec = {"chat": [greedy, sampled], "seeded": dict(sampled, temperature=1.3, seed=21), "tools": tools,
                "turn1": turn1, "second_question": "What does John 3:16 say?",
                "completion": {"model": "k3-kjv.k3pack", "prompt": "In the beginning God", "max_tokens": 30,
                               "temperature": 0}}
        from test_serve import TOOL_ANSWER, TOOLS
        spec["tool_call"] = {"model": "k3-kjv.k3pack", "messages": msgs(("user", "Quote Genesis 1:1.")),
                             "tools": TOOLS, "reasoning_effort": "none", "max_tokens": 60}
        spec["tool_result"] = "In the beginning God created the heaven and the earth."
        # keep-alives every 3 ms: SSE comments among the SDK's streams, which it must take in its stride
        srv = Server(pack, ["-t", "2"], env={"K3_TEST_KEEPALIVE_MS": "3"})
        scripted = Server(pack, ["-t", "1"], env={"K3_TEST_ANSWER": TOOL_ANSWER})
        try:
            spec["base_url"] = srv.url("/v1")
            spec["tool_url"] = scripted.url("/v1")
            path = os.path.join(work, "sdk-spec.json")
            with open(path, "w") as f:
                json.dump(spec, f)
            p = subprocess.run(["node", os.path.join(HERE, "sdk_client.mjs"), path], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=300, cwd=HERE)
            self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
            got = json.loads(p.stdout)
        finally:
            rc = srv.stop()
            self.assertEqual(scripted.stop(), 0, scripted.stderr())
        self.assertEqual(rc, 0, srv.stderr())
        tc = got["tool_call"]
        self.assertEqual(tc["finish"], "tool_calls")
        self.assertEqual(tc["stream"]["finish"], "tool_calls")
        self.assertEqual(len(tc["calls"]), 1)
        self.assertEqual(tc["calls"][0]["function"]["name"], "lookup")
        self.assertEqual(json.loads(tc["calls"][0]["function"]["arguments"]), {"ref": "Genesis 1:1"})
        self.assertEqual(tc["stream"]["deltas"][0]["function"], tc["calls"][0]["function"])
        want = k3run_chat(pack, dict(spec["tool_call"], messages=tc["messages"]), ["-n", "60"], work)
        self.assertEqual(tc["answer"], want["message"]["content"])
        self.assertEqual(got["models"], ["k3-kjv.k3pack"])
        for req, args, res in ((greedy, ["-n", "80"], got["chat"][0]),
                               (sampled, ["-n", "60", "--temp", "0.8", "--top-p", "0.9", "--seed", "5"], got["chat"][1])):
            want = k3run_chat(pack, req, args, work)
            for r in (res, res["stream"]):
                self.assertEqual(r["content"], want["message"]["content"])
                self.assertEqual(r["reasoning"], want["message"]["reasoning_content"])
                self.assertEqual(r["finish"], want["finish_reason"])
                self.assertEqual(r["usage"]["completion_tokens"], want["usage"]["completion_tokens"])
            self.assertGreater(res["stream"]["chunks"], 3)
            print("SDK: %r" % res["content"])
        a, b = got["seeded"]
        self.assertEqual(a, b)
        want = k3run_chat(pack, tools, ["-n", "50"], work)
        self.assertEqual(got["tools"]["content"], want["message"]["content"])
        self.assertEqual(got["tools"]["usage"]["prompt_tokens"], want["usage"]["prompt_tokens"])
        t = got["turns"]
        self.assertEqual(t["first"]["prompt_tokens_details"]["cached_tokens"], 0)
        self.assertGreater(t["second"]["prompt_tokens_details"]["cached_tokens"], t["first"]["prompt_tokens"])
        want = k3run_chat(pack, dict(turn1, messages=t["messages"]), ["-n", "80"], work)
        self.assertEqual(t["answer"], want["message"]["content"])
        raw = subprocess.run([os.path.join(BIN, "k3run"), "-m", pack, "-p", "In the beginning God", "-n", "30", "-q"],
                             stdout=subprocess.PIPE, timeout=120).stdout
        self.assertEqual(got["completion"].encode(), raw)
        self.assertEqual(got["error"]["status"], 400, got["error"])
        self.assertEqual(got["error"]["name"], "BadRequestError")
        self.assertIn("at most 16 choices", got["error"]["message"])

    def test_sdk_parallel(self):
        """serve --parallel 4 with 4 SDK clients at once: each answer, streamed and not, equals
        `k3run chat` on its request alone; n = 3 gives the answers of seeds 70, 71, 72; a client that
        aborts mid-stream frees its slot (the server is idle again)."""
        work = os.path.join(TMP, "k3run-serve-sdk")
        os.makedirs(work, exist_ok=True)
        pack = kjv_pack(work)
        qs = ["Quote Genesis 1:1.", "Who was Moses?", "What does John 3:16 say?", "Tell me of Noah."]
        reqs = [{"model": "k3-kjv.k3pack", "messages": msgs(("user", q)), "max_tokens": 30 + 5 * i,
                 "temperature": 0.8 if i % 2 else 0, "seed": 9 + i} for i, q in enumerate(qs)]
        srv = Server(pack, ["-t", "2", "--parallel", "4"])
        try:
            spec = {"base_url": srv.url("/v1"), "parallel": reqs}
            path = os.path.join(work, "sdk-parallel.json")
            with open(path, "w") as f:
                json.dump(spec, f)
            p = subprocess.run(["node", os.path.join(HERE, "sdk_client.mjs"), path], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=600, cwd=HERE)
            self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
            got = json.loads(p.stdout)
            import time
            t0 = time.time()
            while time.time() - t0 < 30:
                st, _, body = srv.request("GET", "/health")
                if json.loads(body)["slots_busy"] == 0:
                    break
                time.sleep(0.05)
            self.assertEqual(json.loads(body)["slots_busy"], 0, "the slot of the client that left is free")
        finally:
            self.assertEqual(srv.stop(), 0, srv.stderr())
        def chat(req):                  # k3run chat takes the sampling from its command line
            return k3run_chat(pack, req, ["-n", str(req["max_tokens"]), "--temp", str(req["temperature"]),
                                          "--seed", str(req["seed"])], work)
        for i, req in enumerate(reqs):
            want = chat(req)
            for r in (got["parallel"][i], got["parallel"][i]["stream"]):
                self.assertEqual(r["content"], want["message"]["content"], qs[i])
                self.assertEqual(r["reasoning"], want["message"]["reasoning_content"], qs[i])
                self.assertEqual(r["finish"], want["finish_reason"], qs[i])
        self.assertEqual([c["index"] for c in got["n3"]], [0, 1, 2])
        for i in range(3):
            want = chat(dict(reqs[0], temperature=0.9, seed=70 + i))
            self.assertEqual(got["n3"][i]["content"], want["message"]["content"], "n = 3, choice %d" % i)


if __name__ == "__main__":
    unittest.main()
