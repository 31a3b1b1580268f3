"""POST /v1/responses, the OpenAI Responses API of `k3run serve` (ctest serve.responses;
docs/k3run-serve.md): a Responses request is the prompt of the equivalent chat request id for id
(checked through the prompt cache: the chat request first, then the Responses one is served
whole from the snapshot at its prompt's end, cached_tokens = input_tokens) for every mapping
(instructions, developer, parts, reasoning items, calls and their outputs, tools, tool_choice,
reasoning.effort, text.format); its answer, plain and streamed, equals the chat completion's and
`k3run chat`'s byte for byte, greedy and seeded; the exact order of a stream's events and their
sequence numbers; max_output_tokens gives an incomplete response; previous_response_id continues a
stored conversation and equals it sent whole; the store (GET, DELETE, store: false, an unknown id:
404); truncation "auto"; bad requests (400 in the error shape, the server keeps serving); and the
npm `openai` SDK's view of all that (responses_client.mjs: output_text, the stream, its
accumulator, a function call round trip with the scripted answer K3_TEST_ANSWER, since the demo
model was not trained to call tools). The SDK part is skipped, with the reason, where node or the
SDK is missing."""

import http.client
import json
import os
import shutil
import subprocess
import threading
import unittest

from servelib import Server, TMP, k3run_chat, kjv_pack, make_pack, need
from test_serve import TOOL_ANSWER, TOOLS

HERE = os.path.dirname(os.path.abspath(__file__))
SDK = os.path.join(HERE, "node_modules", "openai", "package.json")
RESP = "/v1/responses"
CHAT = "/v1/chat/completions"
MODEL = "k3-kjv.k3pack"
Q1 = "Quote Genesis 1:1."
Q2 = "What does John 3:16 say?"
FLAT_TOOLS = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
               "parameters": t["function"]["parameters"]} for t in TOOLS]
CALL = {"id": "call_7", "type": "function", "function": {"name": "lookup", "arguments": "{\"ref\": \"Genesis 1:1\"}"}}
VERSE = "In the beginning God created the heaven and the earth."


def user(text):
    return {"role": "user", "content": text}


def sse(data):
    """A Responses stream's blocks: [(event name, data document)]."""
    out = []
    for block in data.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        out.append((lines[0][7:], json.loads(lines[1][6:])))
    return out


def collapsed(events):
    """The event names with each run of deltas as one."""
    names = []
    for name, _ in events:
        if not (name.endswith(".delta") and names and names[-1] == name):
            names.append(name)
    return names


def text_of(resp):
    """(output text, reasoning) of a Response's items."""
    text = "".join(c["text"] for i in resp["output"] if i["type"] == "message" for c in i["content"])
    reasoning = "".join(c["text"] for i in resp["output"] if i["type"] == "reasoning" for c in i.get("content", []))
    return text, reasoning


# bad requests and what their errors say (tests/fuzz/seed_requests.py seeds the fuzz corpora with them)
BAD_REQUESTS = [(b'{"input": "x",', "not valid JSON"), (b"[1]", "not a JSON object"), ({}, "no 'input'"),
                ({"input": []}, "'input' is empty"), ({"input": 3}, "'input' is an integer"),
                ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,x"}]}]},
                 "text-only"),
                ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "text-only"),
                ({"input": [{"role": "tool", "content": "x"}]}, "give user, assistant, system or developer"),
                ({"input": [{"type": "web_search_call", "id": "ws"}]}, "'web_search_call' item"),
                ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
                ({"input": [{"type": "function_call", "name": "f"}]}, "call_id"),
                ({"input": "x", "tools": [{"type": "web_search"}]}, "built-in tool ('web_search')"),
                ({"input": "x", "tools": [{"type": "function"}]}, "'tools'[0].name"),
                ({"input": "x", "tool_choice": {"type": "web_search_preview"}}, "'tool_choice'"),
                ({"input": "x", "reasoning": {"effort": "extreme"}}, "'reasoning.effort'"),
                ({"input": "x", "text": {"format": {"type": "xml"}}}, "'text.format'"),
                ({"input": "x", "max_output_tokens": 0}, "'max_output_tokens'"),
                ({"input": "x", "temperature": "hot"}, "'temperature'"),
                ({"input": "x", "store": "yes"}, "'store'"),
                ({"input": "x", "background": True}, "'background'"),
                ({"input": "x", "truncation": "middle"}, "'truncation'"),
                ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
                 "answers no function_call")]

class Responses(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = os.path.join(TMP, "k3run-serve-responses")
        os.makedirs(cls.work, exist_ok=True)
        cls.pack = kjv_pack(cls.work)
        cls.srv = Server(cls.pack, ["-t", "1", "--context", "512", "--timeout", "5"])
        cls.scripted = Server(cls.pack, ["-t", "1"], env={"K3_TEST_ANSWER": TOOL_ANSWER})

    @classmethod
    def tearDownClass(cls):
        a, b = cls.srv.stop(), cls.scripted.stop()
        assert a == 0, "k3run serve exited %d: %s" % (a, cls.srv.stderr())
        assert b == 0, "k3run serve (scripted) exited %d: %s" % (b, cls.scripted.stderr())

    def post(self, body, path=RESP, srv=None):
        st, _, data = (srv or self.srv).post(path, body)
        return st, json.loads(data)

    def stream(self, body, srv=None):
        st, hd, data = (srv or self.srv).post(RESP, dict(body, stream=True))
        self.assertEqual(st, 200, data)
        self.assertTrue(hd["content-type"].startswith("text/event-stream"))
        return sse(data)

    def healthy(self):
        st, _, body = self.srv.request("GET", "/health")
        self.assertEqual((st, json.loads(body)["status"]), (200, "ok"))

    def same_prompt(self, resp, chat, srv=None):
        """The Responses request renders to the chat request's prompt, id for id: once the chat
        request ran, the Responses one is served whole from the cache."""
        st, c = self.post(dict(chat, max_tokens=1, temperature=0), CHAT, srv)
        self.assertEqual(st, 200, c)
        st, r = self.post(dict(resp, max_output_tokens=1, temperature=0), RESP, srv)
        self.assertEqual(st, 200, r)
        n = c["usage"]["prompt_tokens"]
        self.assertEqual((r["usage"]["input_tokens"], r["usage"]["input_tokens_details"]["cached_tokens"]), (n, n),
                         (resp, chat))

    def test_same_prompt_as_chat(self):
        """every mapping of the request renders the equivalent chat request's prompt"""
        schema = {"type": "object", "properties": {"n": {"type": "number", "minimum": 0.1}}}
        cases = [
            ({"input": Q1}, {"messages": [user(Q1)]}),
            ({"instructions": "Answer briefly.", "input": [
                {"role": "developer", "content": "Use the King James words."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Quote "},
                                                                {"type": "input_text", "text": "Genesis 1:1."}]}]},
             {"messages": [{"role": "system", "content": "Answer briefly."},
                           {"role": "system", "content": "Use the King James words."},
                           {"role": "user", "content": [{"type": "text", "text": "Quote "},
                                                        {"type": "text", "text": "Genesis 1:1."}]}]}),
            ({"input": Q2, "reasoning": {"effort": "none"}}, {"messages": [user(Q2)], "reasoning_effort": "none"}),
            ({"input": Q2, "reasoning": {"effort": "minimal"}}, {"messages": [user(Q2)], "reasoning_effort": "low"}),
            ({"input": Q2, "reasoning": {"effort": "medium"}}, {"messages": [user(Q2)], "reasoning_effort": "high"}),
            ({"input": Q2, "reasoning": {"effort": "high"}}, {"messages": [user(Q2)], "reasoning_effort": "max"}),
            ({"input": Q1, "tools": FLAT_TOOLS + [{"type": "function", "name": "count", "parameters": schema,
                                                   "strict": True}],
              "tool_choice": {"type": "function", "name": "lookup"}},
             {"messages": [user(Q1)], "tools": TOOLS + [{"type": "function", "function": {
                 "name": "count", "parameters": schema, "strict": True}}],
              "tool_choice": {"type": "function", "function": {"name": "lookup"}}}),
            ({"input": Q1, "tools": FLAT_TOOLS, "tool_choice": "required"},
             {"messages": [user(Q1)], "tools": TOOLS, "tool_choice": "required"}),
            ({"input": Q1, "text": {"format": {"type": "json_schema", "name": "verse", "schema": schema}}},
             {"messages": [user(Q1)], "response_format": {"type": "json_schema", "json_schema": {
                 "name": "verse", "schema": schema}}}),
            ({"input": Q1, "text": {"format": {"type": "json_object"}}},
             {"messages": [user(Q1)], "response_format": {"type": "json_object"}}),
            # a whole turn as items: its reasoning, its text, its calls, their outputs
            ({"tools": FLAT_TOOLS, "input": [
                user(Q1),
                {"type": "reasoning", "id": "rs_1", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "A verse to look up."}]},
                {"type": "message", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
                {"type": "function_call", "id": "fc_1", "call_id": "call_7", "name": "lookup",
                 "arguments": "{\"ref\": \"Genesis 1:1\"}", "status": "completed"},
                {"type": "function_call_output", "call_id": "call_7", "output": VERSE},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Quoted."}]},
                {"role": "assistant", "content": "It is quoted."},
                user(Q2)]},
             {"tools": TOOLS, "messages": [
                 user(Q1),
                 {"role": "assistant", "content": "Let me look.", "reasoning_content": "A verse to look up.",
                  "tool_calls": [CALL]},
                 {"role": "tool", "tool_call_id": "call_7", "content": VERSE},
                 {"role": "assistant", "content": "It is quoted.", "reasoning_content": "Quoted."},
                 user(Q2)]}),
        ]
        for resp, chat in cases:
            with self.subTest(resp=resp):
                self.same_prompt(resp, chat)

    def test_answer_equals_chat(self):
        """plain and streamed answers equal the chat completion's and `k3run chat`'s, greedy and seeded"""
        cases = [({"input": Q1, "max_output_tokens": 80, "temperature": 0},
                  {"messages": [user(Q1)], "max_tokens": 80, "temperature": 0}, ["-n", "80", "--temp", "0"]),
                 ({"instructions": "Answer briefly.", "input": Q2, "max_output_tokens": 60, "temperature": 0.8,
                   "top_p": 0.9, "seed": 5},
                  {"messages": [{"role": "system", "content": "Answer briefly."}, user(Q2)], "max_tokens": 60,
                   "temperature": 0.8, "top_p": 0.9, "seed": 5},
                  ["-n", "60", "--temp", "0.8", "--top-p", "0.9", "--seed", "5"])]
        for resp, chat, args in cases:
            with self.subTest(resp=resp):
                want = k3run_chat(self.pack, chat, args, self.work)["message"]
                st, c = self.post(chat, CHAT)
                self.assertEqual(st, 200, c)
                self.assertEqual(c["choices"][0]["message"]["content"], want["content"])
                st, r = self.post(resp)
                self.assertEqual(st, 200, r)
                self.assertEqual(text_of(r), (want["content"], want["reasoning_content"]))
                self.assertEqual(r["usage"]["output_tokens"], c["usage"]["completion_tokens"])
                self.assertEqual(r["usage"]["output_tokens_details"]["reasoning_tokens"],
                                 c["usage"]["completion_tokens_details"]["reasoning_tokens"])
                self.assertEqual(r["status"], "incomplete" if c["choices"][0]["finish_reason"] == "length"
                                 else "completed")
                ev = self.stream(resp)
                deltas = ["".join(d["delta"] for n, d in ev if n == name)
                          for name in ("response.output_text.delta", "response.reasoning_text.delta")]
                self.assertEqual(deltas, [want["content"], want["reasoning_content"]])
                self.assertEqual(text_of(ev[-1][1]["response"]), text_of(r))
                print("responses -> %r" % want["content"])

    def test_stream_events(self):
        """the exact order of a stream's events; sequence numbers; ids and indices that agree"""
        req = {"input": Q1, "max_output_tokens": 40, "temperature": 0}
        ev = self.stream(req)
        final = ev[-1][1]["response"]
        done = "response.completed" if final["status"] == "completed" else "response.incomplete"
        self.assertEqual(collapsed(ev), [
            "response.created", "response.in_progress",
            "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
            "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
            "response.output_item.added", "response.content_part.added", "response.output_text.delta",
            "response.output_text.done", "response.content_part.done", "response.output_item.done", done])
        self.assertEqual([d["sequence_number"] for _, d in ev], list(range(len(ev))))
        self.assertTrue(all(d["type"] == n for n, d in ev))
        self.assertEqual(ev[0][1]["response"]["status"], "in_progress")
        self.assertEqual(ev[0][1]["response"]["output"], [])
        rs, msg = final["output"]
        self.assertEqual((rs["type"], rs["id"][:3], msg["type"], msg["id"][:4]),
                         ("reasoning", "rs_", "message", "msg_"))
        ids = [rs["id"], msg["id"]]
        for n, d in ev[2:-1]:
            self.assertEqual(d["output_index"], ids.index(d["item"]["id"] if "item" in d else d["item_id"]), n)
        added = [d["item"] for n, d in ev if n == "response.output_item.added"]
        self.assertEqual(added[1], dict(msg, status="in_progress", content=[]))
        self.assertEqual([d["item"] for n, d in ev if n == "response.output_item.done"], [rs, msg])
        self.assertEqual(ev[-1][1]["response"]["id"], ev[0][1]["response"]["id"])
        st, plain = self.post(req)
        self.assertEqual(text_of(plain), text_of(final))
        # a call (the scripted answer): its item, its arguments in one delta, completed
        ev = self.stream({"input": Q1, "tools": FLAT_TOOLS, "reasoning": {"effort": "none"}}, self.scripted)
        self.assertEqual([n for n, _ in ev], [
            "response.created", "response.in_progress", "response.output_item.added",
            "response.function_call_arguments.delta", "response.function_call_arguments.done",
            "response.output_item.done", "response.completed"])
        item = ev[-2][1]["item"]
        self.assertEqual((item["type"], item["name"], item["status"]), ("function_call", "lookup", "completed"))
        self.assertEqual(json.loads(item["arguments"]), {"ref": "Genesis 1:1"})
        self.assertEqual(ev[2][1]["item"]["arguments"], "")
        self.assertEqual(ev[3][1]["delta"], item["arguments"])
        self.assertEqual(ev[-1][1]["response"]["output"], [item])

    def test_incomplete(self):
        """max_output_tokens: status incomplete, the reason, the message item incomplete"""
        req = {"input": Q1, "max_output_tokens": 5, "temperature": 0, "reasoning": {"effort": "none"}}
        st, r = self.post(req)
        self.assertEqual(st, 200, r)
        self.assertEqual((r["status"], r["incomplete_details"]), ("incomplete", {"reason": "max_output_tokens"}))
        self.assertEqual([(i["type"], i["status"]) for i in r["output"]], [("message", "incomplete")])
        self.assertEqual(r["usage"]["output_tokens"], 5)
        ev = self.stream(req)
        self.assertEqual(ev[-1][0], "response.incomplete")
        self.assertEqual(ev[-1][1]["response"]["incomplete_details"], {"reason": "max_output_tokens"})

    def test_store(self):
        """previous_response_id continues a stored conversation and equals it sent whole (and the
        chat request of it); GET and DELETE; store: false is not kept; unknown ids are 404"""
        first = {"input": Q1, "max_output_tokens": 40, "temperature": 0}
        st, r1 = self.post(first)
        self.assertEqual(st, 200, r1)
        st, r2 = self.post(dict(first, input=Q2, previous_response_id=r1["id"]))
        self.assertEqual(st, 200, r2)
        self.assertEqual(r2["previous_response_id"], r1["id"])
        st, whole = self.post(dict(first, input=[user(Q1)] + r1["output"] + [user(Q2)]))
        self.assertEqual(text_of(whole), text_of(r2))
        self.assertEqual(whole["usage"]["input_tokens"], r2["usage"]["input_tokens"])
        text, reasoning = text_of(r1)
        st, c = self.post({"messages": [user(Q1), {"role": "assistant", "content": text,
                                                   "reasoning_content": reasoning}, user(Q2)],
                           "max_tokens": 40, "temperature": 0}, CHAT)
        self.assertEqual(c["choices"][0]["message"]["content"], text_of(r2)[0])
        # the stored response, then deleted
        st, _, body = self.srv.request("GET", RESP + "/" + r1["id"])
        self.assertEqual((st, json.loads(body)), (200, r1))
        st, _, body = self.srv.request("DELETE", RESP + "/" + r1["id"])
        self.assertEqual((st, json.loads(body)), (200, {"id": r1["id"], "object": "response", "deleted": True}))
        for method in ("GET", "DELETE"):
            st, _, body = self.srv.request(method, RESP + "/" + r1["id"])
            self.assertEqual(st, 404, body)
        st, e = self.post(dict(first, input=Q2, previous_response_id=r1["id"]))
        self.assertEqual(st, 404, e)
        self.assertIn("is not stored", e["error"]["message"])
        # store: false
        st, r3 = self.post(dict(first, store=False))
        self.assertEqual((st, r3["store"]), (200, False))
        st, _, body = self.srv.request("GET", RESP + "/" + r3["id"])
        self.assertEqual(st, 404, body)
        st, e = self.post(dict(first, input=Q2, previous_response_id=r3["id"]))
        self.assertEqual(st, 404, e)
        st, e = self.post(dict(first, previous_response_id="resp_0123456789abcdef000001"))
        self.assertEqual((st, e["error"]["type"]), (404, "invalid_request_error"))
        # a stored call continued: the output names the call the client was given
        st, t1 = self.post({"input": Q1, "tools": FLAT_TOOLS, "reasoning": {"effort": "none"}}, srv=self.scripted)
        call = t1["output"][0]
        self.assertEqual(call["type"], "function_call")
        out = {"type": "function_call_output", "call_id": call["call_id"], "output": VERSE}
        st, t2 = self.post({"input": [out], "tools": FLAT_TOOLS, "reasoning": {"effort": "none"},
                            "previous_response_id": t1["id"]}, srv=self.scripted)
        self.assertEqual(st, 200, t2)
        self.same_prompt({"input": [user(Q1), call, out], "tools": FLAT_TOOLS, "reasoning": {"effort": "none"}},
                         {"messages": [user(Q1), {"role": "assistant", "content": None, "tool_calls": [
                             {"id": call["call_id"], "type": "function",
                              "function": {"name": "lookup", "arguments": call["arguments"]}}]},
                             {"role": "tool", "tool_call_id": call["call_id"], "content": VERSE}],
                          "tools": TOOLS, "reasoning_effort": "none"}, self.scripted)
        self.assertEqual(t2["usage"]["input_tokens"], self.post(
            {"input": [user(Q1), call, out], "tools": FLAT_TOOLS, "reasoning": {"effort": "none"},
             "max_output_tokens": 1}, srv=self.scripted)[1]["usage"]["input_tokens"])

    def test_store_bound(self):
        """The store keeps the last 256 responses: after 257 more, the first is a 404 that says it may
        have been evicted (for GET and for previous_response_id), never another conversation; the
        second and the last are still there"""
        ids = []
        for i in range(257):
            st, r = self.post({"input": "%s %d" % (Q1, i), "max_output_tokens": 1, "temperature": 0})
            self.assertEqual(st, 200, r)
            ids.append(r["id"])
        st, _, body = self.srv.request("GET", RESP + "/" + ids[0])
        self.assertEqual(st, 404, body)
        self.assertIn("evicted (the server keeps its last 256 responses", json.loads(body)["error"]["message"])
        st, e = self.post({"input": Q2, "previous_response_id": ids[0], "max_output_tokens": 1})
        self.assertEqual(st, 404, e)
        self.assertIn("evicted", e["error"]["message"])
        for i in (1, 256):
            st, _, body = self.srv.request("GET", RESP + "/" + ids[i])
            self.assertEqual((st, json.loads(body)["id"]), (200, ids[i]))
        st, r = self.post({"input": Q2, "previous_response_id": ids[1], "max_output_tokens": 1, "temperature": 0})
        self.assertEqual((st, r["previous_response_id"]), (200, ids[1]))

    def test_store_byte_bound(self):
        """The store's other bound, 64 MiB (9,000 bytes here, K3_TEST_STORE_BYTES): entries of about
        3,500 bytes each, the third pushes out the first though far fewer than 256 are kept; an
        answer larger than the bound is not kept (a 404) and pushes out nothing"""
        srv = Server(self.pack, ["-t", "1"], env={"K3_TEST_STORE_BYTES": "9000"})
        try:
            ids = []
            for i, n in enumerate((50, 50, 50, 200)):        # VERSE is 55 bytes: inputs of 2.8 and 11 KB
                st, r = self.post({"input": "%d. %s" % (i, " ".join([VERSE] * n)), "max_output_tokens": 1,
                                   "temperature": 0}, srv=srv)
                self.assertEqual(st, 200, r)
                ids.append(r["id"])
            got = [srv.request("GET", RESP + "/" + i)[0] for i in ids]
            self.assertEqual(got, [404, 200, 200, 404], srv.stderr())
            st, e = self.post({"input": Q2, "previous_response_id": ids[0], "max_output_tokens": 1}, srv=srv)
            self.assertEqual(st, 404, e)
            self.assertIn("at most 64 MiB", e["error"]["message"])
        finally:
            self.assertEqual(srv.stop(), 0, srv.stderr())

    def test_truncation(self):
        """a conversation longer than the context: refused, or its oldest turns dropped with "auto\""""
        turns = []
        for i in range(12):
            turns += [user("%d. %s" % (i, VERSE)), {"role": "assistant", "content": VERSE + " " + VERSE}]
        req = {"instructions": "Answer briefly.", "input": turns + [user(Q1)], "max_output_tokens": 3,
               "temperature": 0}
        st, e = self.post(req)
        self.assertEqual(st, 400, e)
        self.assertIn("does not fit the context", e["error"]["message"])
        st, r = self.post(dict(req, truncation="auto"))
        self.assertEqual(st, 200, r)
        self.assertEqual(r["truncation"], "auto")
        self.assertLess(r["usage"]["input_tokens"], 512)
        self.assertGreater(r["usage"]["input_tokens"], 300)

    def test_bad_requests(self):
        """400s in OpenAI's error shape, each saying what is wrong; the server keeps serving"""
        cases = BAD_REQUESTS
        for body, want in cases:
            with self.subTest(body=body):
                st, _, data = self.srv.post(RESP, body)
                self.assertEqual(st, 400, data)
                e = json.loads(data)["error"]
                self.assertEqual((e["type"], e["code"]), ("invalid_request_error", 400))
                self.assertIn(want, e["message"])
        st, _, data = self.srv.post(RESP + "/resp_x", {"input": "x"})
        self.assertEqual(st, 405, data)
        self.healthy()
        st, r = self.post({"input": "Hi", "max_output_tokens": 2})
        self.assertEqual(st, 200, r)

    def test_interrupted(self):
        """SIGTERM during a stream (the random-weight tiny model, whose answers run on): the stream
        ends with response.incomplete, reason "interrupted", and the server exits 0"""
        _, pack = make_pack("tiny", 1)
        srv = Server(pack, ["-t", "1"])
        data, stopper = b"", None
        try:
            c = http.client.HTTPConnection(srv.host, srv.port, timeout=60)
            body = {"input": "hi", "stream": True, "max_output_tokens": 3800}
            c.request("POST", RESP, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            while True:
                line = r.readline()
                if not line:
                    break
                data += line
                if stopper is None and b'_text.delta"' in line:          # text flows: stop the server
                    stopper = threading.Thread(target=lambda: setattr(stopper, "rc", srv.stop()))
                    stopper.start()
            c.close()
        finally:
            if stopper is None:
                srv.stop()
        self.assertIsNotNone(stopper, data[-500:])
        stopper.join(30)
        self.assertEqual(stopper.rc, 0, srv.stderr())
        ev = sse(data)
        self.assertEqual(ev[-1][0], "response.incomplete")
        final = ev[-1][1]["response"]
        self.assertEqual((final["status"], final["incomplete_details"]), ("incomplete", {"reason": "interrupted"}))
        self.assertTrue(final["k3"]["interrupted"])
        self.assertEqual([d["sequence_number"] for _, d in ev], list(range(len(ev))))

    @need(shutil.which("node"), "node is not installed (scripts/setup.sh installs Debian's nodejs)")
    @need(os.path.exists(SDK), "the openai SDK is not installed: run scripts/setup.sh")
    def test_sdk(self):
        """the openai SDK: responses.create plain and streamed (and its accumulator) equal to
        chat.completions.create; a conversation continued; a function call round trip; typed errors"""
        cases = [({"model": MODEL, "input": Q1, "max_output_tokens": 80, "temperature": 0},
                  {"model": MODEL, "messages": [user(Q1)], "max_tokens": 80, "temperature": 0}),
                 ({"model": MODEL, "instructions": "Answer briefly.", "input": Q2, "max_output_tokens": 60,
                   "temperature": 0.8, "top_p": 0.9, "seed": 5},
                  {"model": MODEL, "messages": [{"role": "system", "content": "Answer briefly."}, user(Q2)],
                   "max_tokens": 60, "temperature": 0.8, "top_p": 0.9, "seed": 5}),
                 ({"model": MODEL, "input": Q2, "reasoning": {"effort": "none"}, "max_output_tokens": 50,
                   "temperature": 1.0, "seed": 3},
                  {"model": MODEL, "messages": [user(Q2)], "reasoning_effort": "none", "max_tokens": 50,
                   "temperature": 1.0, "seed": 3})]
        tool = {"req": {"model": MODEL, "input": Q1, "tools": FLAT_TOOLS, "reasoning": {"effort": "none"},
                        "max_output_tokens": 60, "temperature": 0}, "result": VERSE}
        spec = {"base_url": self.srv.url("/v1"), "tool_url": self.scripted.url("/v1"),
                "cases": [{"req": r, "chat": c} for r, c in cases],
                "conversation": {"first": {"model": MODEL, "input": Q1, "max_output_tokens": 40, "temperature": 0},
                                 "second": Q2},
                "tool": tool,
                "errors": [{"model": MODEL, "input": "x", "previous_response_id": "resp_unknown"},
                           {"model": MODEL, "input": [{"role": "user", "content": [
                               {"type": "input_image", "image_url": "data:,x"}]}]}]}
        path = os.path.join(self.work, "responses-spec.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        p = subprocess.run(["node", os.path.join(HERE, "responses_client.mjs"), path], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=300, cwd=HERE)
        self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
        got = json.loads(p.stdout)
        for (req, _), g in zip(cases, got["cases"]):
            with self.subTest(req=req):
                c, pl, s = g["chat"], g["plain"], g["stream"]
                for text in (pl["output_text"], pl["text"], s["text"], s["last"]["text"], s["last"]["output_text"],
                             s["helper"]["text"]):
                    self.assertEqual(text, c["content"])
                if pl["status"] == "completed":
                    self.assertEqual(s["helper"]["output_text"], c["content"])
                for reasoning in (pl["reasoning"], s["reasoning"], s["last"]["reasoning"]):
                    self.assertEqual(reasoning, c["reasoning"])
                self.assertEqual(pl["usage"]["input_tokens"], c["usage"]["prompt_tokens"])
                self.assertEqual(pl["usage"]["output_tokens"], c["usage"]["completion_tokens"])
                self.assertEqual(pl["status"], "incomplete" if c["finish"] == "length" else "completed")
                self.assertEqual(s["last"]["status"], pl["status"])
                self.assertEqual(s["seqs"], list(range(len(s["types"]))))
                self.assertEqual(s["types"][:2], ["response.created", "response.in_progress"])
                print("SDK responses: %r" % pl["output_text"])
        cv = got["conversation"]
        self.assertEqual(cv["second"]["output_text"], cv["whole"]["output_text"])
        self.assertEqual(cv["second"]["usage"]["input_tokens"], cv["whole"]["usage"]["input_tokens"])
        self.assertGreater(cv["second"]["usage"]["input_tokens"], cv["first"]["usage"]["input_tokens"])
        self.assertEqual(cv["retrieved"]["output"], cv["first"]["output"])
        t = got["tool"]
        self.assertEqual(t["first"]["types"], ["function_call"])
        call = t["first"]["calls"][0]
        self.assertEqual((call["name"], json.loads(call["arguments"])), ("lookup", {"ref": "Genesis 1:1"}))
        self.assertEqual(t["stream"]["args"], call["arguments"])
        self.assertEqual(t["stream"]["last"]["calls"][0]["name"], "lookup")
        # the round trip's answer is the chat completion of the same conversation
        st, c = self.post({"model": MODEL, "max_tokens": 60, "temperature": 0, "tools": TOOLS,
                           "reasoning_effort": "none", "messages": [
                               user(Q1), {"role": "assistant", "content": None, "tool_calls": [
                                   {"id": call["call_id"], "type": "function",
                                    "function": {"name": "lookup", "arguments": call["arguments"]}}]},
                               {"role": "tool", "tool_call_id": call["call_id"], "content": VERSE}]}, CHAT)
        self.assertEqual(st, 200, c)
        self.assertEqual(t["answer"]["output_text"], c["choices"][0]["message"]["content"])
        self.assertEqual(t["answer"]["usage"]["input_tokens"], c["usage"]["prompt_tokens"])
        self.assertEqual(t["cont"]["usage"]["input_tokens"], t["cont_whole"]["usage"]["input_tokens"])
        print("SDK tool round trip: %r" % t["answer"]["output_text"])
        e404, e400 = got["errors"]
        self.assertEqual((e404["status"], e404["name"]), (404, "NotFoundError"))
        self.assertEqual((e400["status"], e400["name"]), (400, "BadRequestError"))
        self.assertIn("text-only", e400["message"])


if __name__ == "__main__":
    unittest.main()
