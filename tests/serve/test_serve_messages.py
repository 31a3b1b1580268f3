"""`k3run serve`'s Anthropic Messages API (ctest serve.messages): POST /v1/messages and
/v1/messages/count_tokens.

A Messages request stands for a chat-completions request (docs/k3run-serve.md gives the mapping;
chat_of below writes it again, independently of the server's C): its answers, plain and streamed,
equal `k3run chat --messages` on that request byte for byte (greedy and sampled, thinking on, off
and with a budget); its prompt is the chat request's id for id (count_tokens equals `k3run
--render-chat`, and the chat request sent after it finds its whole prompt in the server's cache);
stop_sequences and max_tokens give their stop_reason; a stream's events follow Anthropic's grammar
exactly; tool calls (scripted with K3_TEST_ANSWER: the demo model does not call tools) come as
tool_use blocks whose input goes back as the same arguments; bad requests get Anthropic's error
shape and status, and the server keeps serving; x-api-key. Then the official npm
@anthropic-ai/sdk (anthropic_client.mjs), skipped with the reason where node or the SDK is missing."""

import http.client
import json
import os
import shutil
import subprocess
import threading
import time
import unittest

from servelib import BIN, Server, TMP, k3run_chat, kjv_pack, make_pack, need

HERE = os.path.dirname(os.path.abspath(__file__))
SDK = os.path.join(HERE, "node_modules", "@anthropic-ai", "sdk", "package.json")
MSG, COUNT, CHAT = "/v1/messages", "/v1/messages/count_tokens", "/v1/chat/completions"
RAW = "k3_raw_arguments"
Q1, Q2 = "Quote Genesis 1:1.", "What does John 3:16 say?"
MODEL = "k3-kjv.k3pack"

TOOLS = [{"name": "lookup", "description": "Find a verse", "input_schema": {
    "type": "object", "properties": {"ref": {"type": "string"}, "n": {"type": "number"}}, "required": ["ref"]}}]
# Two calls in K3's answer markup (thinking off): arguments, the second a raw json block that does not parse
TOOL_ANSWER = ('<|open|>tools<|sep|><|open|>call tool="lookup" index="1"<|sep|>'
               '<|open|>argument key="ref" type="string"<|sep|>Genesis 1:1<|close|>argument<|sep|>'
               '<|open|>argument key="n" type="number"<|sep|>2.50<|close|>argument<|sep|><|close|>call<|sep|>'
               '<|open|>call tool="lookup" index="2"<|sep|><|open|>json type="object"<|sep|>{"ref": '
               '<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>')
RESULT = "In the beginning God created the heaven and the earth."


def parts(v):
    return v if isinstance(v, str) else [{"type": "text", "text": b["text"]} for b in v]


def chat_of(m):
    """The chat-completions request a Messages request stands for (docs/k3run-serve.md)."""
    out = {k: m[k] for k in ("model", "max_tokens", "temperature", "top_p", "top_k", "seed") if k in m}
    msgs = out["messages"] = []
    if m.get("system"):
        msgs.append({"role": "system", "content": parts(m["system"])})
    for x in m["messages"]:
        c, role = x["content"], x["role"]
        if isinstance(c, str) or role == "system":
            msgs.append({"role": role, "content": parts(c)})
        elif role == "user":
            texts = []
            for b in c:
                if b["type"] == "tool_result":
                    msgs.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": parts(b.get("content", ""))})
                else:
                    texts.append({"type": "text", "text": b["text"]})
            if texts or not c:
                msgs.append({"role": "user", "content": texts})
        else:
            texts = [{"type": "text", "text": b["text"]} for b in c if b["type"] == "text"]
            a = {"role": "assistant", "content": texts or None}
            if any(b["type"] == "thinking" for b in c):
                a["reasoning_content"] = "".join(b["thinking"] for b in c if b["type"] == "thinking")
            calls = [{"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments":
                      b["input"][RAW] if list(b["input"]) == [RAW] else
                      json.dumps(b["input"], separators=(",", ":"), ensure_ascii=False)}}
                     for b in c if b["type"] == "tool_use"]
            if calls:
                a["tool_calls"] = calls
            msgs.append(a)
    if m.get("tools"):
        out["tools"] = [{"type": "function", "function": dict({"name": t["name"]}, **(
            {"description": t["description"]} if "description" in t else {}), parameters=t["input_schema"])}
            for t in m["tools"]]
    tc = m.get("tool_choice")
    if tc:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(tc["type"]) or \
            {"type": "function", "function": {"name": tc.get("name")}}
    th = m.get("thinking")
    if th and th["type"] == "disabled":
        out["reasoning_effort"] = "none"
    elif th:
        out["thinking"] = True
    if m.get("stop_sequences"):
        out["stop"] = m["stop_sequences"]
    return out


def cli_args(m):
    """`k3run chat`'s options for a Messages request's sampling (it takes them from its command line)."""
    a = ["-n", str(m["max_tokens"]), "-t", "1"]
    for k, o in (("temperature", "--temp"), ("top_p", "--top-p"), ("top_k", "--top-k"), ("seed", "--seed")):
        if k in m:
            a += [o, str(m[k])]
    if m.get("thinking", {}).get("budget_tokens"):
        a += ["--think-budget", str(m["thinking"]["budget_tokens"])]
    for s in m.get("stop_sequences", []):
        a += ["--stop", s]
    return a


def render_ids(request, work):
    path = os.path.join(work, "render-%d.json" % os.getpid())
    with open(path, "w") as f:
        json.dump(request, f)
    p = subprocess.run([os.path.join(BIN, "k3run"), "--tokenizer", kjv_pack(work), "--render-chat", path, "--json"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    if p.returncode:
        raise AssertionError("--render-chat failed: %s" % p.stderr.decode(errors="replace"))
    return json.loads(p.stdout)["ids"]


def stop_reason(finish):
    return {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}[finish]


def events(srv, body, path=MSG, headers=None):
    """A streamed request: (status, [(event name, data JSON)])."""
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=120)
    c.request("POST", path, body=json.dumps(dict(body, stream=True)).encode(),
              headers=dict({"Content-Type": "application/json"}, **(headers or {})))
    r = c.getresponse()
    data, st, ctype = r.read().decode(), r.status, r.getheader("Content-Type")
    c.close()
    if st != 200:
        return st, [("", json.loads(data))]
    assert ctype == "text/event-stream", ctype
    out = []
    for block in data.split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        out.append((lines[0][7:], json.loads(lines[1][6:])))
    return st, out


# bad requests and what their errors say (tests/fuzz/seed_requests.py seeds the fuzz corpora with them)
_GOOD = {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
BAD_REQUESTS = [(MSG, b"{bad json", "not valid JSON"), (MSG, b"", "empty"), (MSG, b"[1]", "not a JSON object"),
                (MSG, {"messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
                (MSG, dict(_GOOD, messages="hi"), "'messages' is a string"),
                (MSG, dict(_GOOD, messages=[]), "empty"), (MSG, {"max_tokens": 5}, "no 'messages'"),
                (MSG, dict(_GOOD, messages=[{"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]),
                 "text-only"),
                (MSG, dict(_GOOD, messages=[{"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document", "source": {}}]}]}]),
                 "text-only"),
                (MSG, dict(_GOOD, messages=[{"role": "wizard", "content": "hi"}]), "role"),
                (MSG, dict(_GOOD, messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}]),
                 "prefilled"),
                (MSG, dict(_GOOD, messages=[{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b",
                                                                         "input": {}}]}]), "'tool_use' block"),
                (MSG, dict(_GOOD, messages=[{"role": "user", "content": [{"text": "no type"}]}]), "'type'"),
                (MSG, dict(_GOOD, max_tokens=0), "max_tokens"), (MSG, dict(_GOOD, max_tokens="9"), "max_tokens"),
                (MSG, dict(_GOOD, temperature="hot"), "temperature"), (MSG, dict(_GOOD, stream="yes"), "stream"),
                (MSG, dict(_GOOD, stop_sequences="x"), "stop_sequences"), (MSG, dict(_GOOD, stop_sequences=[""]), "empty"),
                (MSG, dict(_GOOD, thinking={"type": "enabled"}), "budget_tokens"),
                (MSG, dict(_GOOD, thinking={"type": "sometimes"}), "thinking"),
                (MSG, dict(_GOOD, tools=[{"name": "x"}]), "input_schema"),
                (MSG, dict(_GOOD, tools=[{"type": "web_search_20250305", "name": "web_search"}]), "server tools"),
                (MSG, dict(_GOOD, tool_choice={"type": "maybe"}), "tool_choice"),
                (MSG, dict(_GOOD, tool_choice={"type": "tool"}), "name"),
                (COUNT, b"{bad", "not valid JSON"), (COUNT, {"messages": 5}, "'messages'"),
                (COUNT, {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "text-only")]

class Grammar:
    def blocks(self, evs):
        """Check a stream's events against Anthropic's grammar, exactly: message_start, ping, then per
        content block its start, its deltas (a thinking block's last one its signature) and its stop,
        the indexes 0, 1, ...; message_delta, message_stop. Returns (the content blocks put together,
        message_start's message, message_delta)."""
        names = [n for n, _ in evs]
        for n, d in evs:
            self.assertEqual(d["type"], n)
        self.assertEqual(names[:2], ["message_start", "ping"], names)
        self.assertEqual(names[-2:], ["message_delta", "message_stop"], names)
        start = evs[0][1]["message"]
        self.assertEqual((start["type"], start["role"], start["content"], start["stop_reason"], start["stop_sequence"]),
                         ("message", "assistant", [], None, None))
        self.assertTrue(start["id"].startswith("msg_"))
        blocks, i = [], 2
        kinds = {"thinking": ("thinking_delta", "thinking"), "text": ("text_delta", "text"),
                 "tool_use": ("input_json_delta", "partial_json")}
        while i < len(evs) - 2:
            n, d = evs[i]
            self.assertEqual((n, d["index"]), ("content_block_start", len(blocks)), evs[i])
            b = dict(d["content_block"])
            dtype, key = kinds[b["type"]]
            acc, i = "", i + 1
            while evs[i][0] == "content_block_delta":
                delta = evs[i][1]["delta"]
                self.assertEqual(evs[i][1]["index"], len(blocks))
                if delta["type"] == "signature_delta":
                    self.assertEqual(b["type"], "thinking")
                    self.assertEqual(evs[i + 1][0], "content_block_stop")     # the block's last delta
                    b["signature"] = delta["signature"]
                else:
                    self.assertEqual(delta["type"], dtype)
                    self.assertTrue(delta[key], "an empty delta")
                    acc += delta[key]
                i += 1
            self.assertEqual(evs[i], ("content_block_stop", {"type": "content_block_stop", "index": len(blocks)}))
            i += 1
            if b["type"] == "tool_use":
                self.assertEqual(b["input"], {})
                b["input"] = json.loads(acc)
            else:
                self.assertEqual(b[key], "")
                b[key] = acc
            blocks.append(b)
        delta = evs[-2][1]
        self.assertEqual(set(delta["delta"]), {"stop_reason", "stop_sequence"})
        return blocks, start, delta


class ServeMessages(unittest.TestCase, Grammar):
    @classmethod
    def setUpClass(cls):
        cls.work = os.path.join(TMP, "k3run-serve-messages")
        os.makedirs(cls.work, exist_ok=True)
        cls.pack = kjv_pack(cls.work)
        cls.srv = Server(cls.pack, ["--timeout", "5", "-t", "1"])

    @classmethod
    def tearDownClass(cls):
        rc = cls.srv.stop()
        assert rc == 0, "k3run serve exited %d: %s" % (rc, cls.srv.stderr())

    def post(self, body, path=MSG, headers=None):
        st, hd, data = self.srv.post(path, body, headers)
        return st, json.loads(data)

    def healthy(self):
        st, _, body = self.srv.request("GET", "/health")
        self.assertEqual((st, json.loads(body)["status"]), (200, "ok"))

    def check_message(self, got, want, req):
        """A Messages answer against `k3run chat`'s answer to the same conversation."""
        m = want["message"]
        self.assertEqual((got["type"], got["role"], got["model"]), ("message", "assistant", MODEL))
        self.assertTrue(got["id"].startswith("msg_"), got["id"])
        content = []
        if m.get("reasoning_content"):
            content.append({"type": "thinking", "thinking": m["reasoning_content"], "signature": ""})
        if m.get("content"):
            content.append({"type": "text", "text": m["content"]})
        self.assertEqual(got["content"], content)
        self.assertEqual(got["stop_reason"], stop_reason(want["finish_reason"]))
        u, wu = got["usage"], want["usage"]
        self.assertEqual(u["input_tokens"] + u["cache_read_input_tokens"], wu["prompt_tokens"])
        self.assertEqual((u["output_tokens"], u["cache_creation_input_tokens"]), (wu["completion_tokens"], 0))

    def test_equals_chat(self):
        """plain and streamed answers equal `k3run chat --messages` on the equivalent chat request:
        greedy, sampled (top_p, top_k, seed), thinking on (the default), off, and on with a budget;
        a system prompt as a string and as blocks; text blocks"""
        cases = [{"model": "claude-anything", "max_tokens": 60, "temperature": 0, "messages": [{"role": "user", "content": Q1}]},
                 {"max_tokens": 50, "temperature": 0.8, "top_p": 0.9, "seed": 7, "system": "Answer briefly.",
                  "messages": [{"role": "user", "content": Q2}]},
                 {"max_tokens": 40, "temperature": 1.0, "top_k": 20, "thinking": {"type": "disabled"},
                  "system": [{"type": "text", "text": "Answer briefly."}, {"type": "text", "text": " Quote."}],
                  "messages": [{"role": "user", "content": [{"type": "text", "text": "What does"},
                                                           {"type": "text", "text": " John 3:16 say?"}]}]},
                 {"max_tokens": 40, "temperature": 0, "thinking": {"type": "enabled", "budget_tokens": 5},
                  "metadata": {"user_id": "u1"}, "messages": [{"role": "user", "content": Q1}]}]
        for req in cases:
            with self.subTest(req=req):
                want = k3run_chat(self.pack, chat_of(req), cli_args(req), self.work)
                st, got = self.post(req)
                self.assertEqual(st, 200, got)
                self.check_message(got, want, req)
                self.assertIsNone(got["stop_sequence"])
                if req.get("thinking", {}).get("budget_tokens"):
                    self.assertTrue(want["k3"]["think_budget_closed"], want)
                    self.assertTrue(got["content"][0]["thinking"])
                st, evs = events(self.srv, req)
                self.assertEqual(st, 200, evs)
                blocks, start, delta = self.blocks(evs)
                self.assertEqual(blocks, got["content"])
                self.assertEqual(delta["delta"], {"stop_reason": got["stop_reason"], "stop_sequence": None})
                self.assertEqual(delta["usage"]["output_tokens"], got["usage"]["output_tokens"])
                self.assertEqual(start["usage"]["input_tokens"], want["usage"]["prompt_tokens"])
                self.assertEqual(delta["usage"]["input_tokens"] + delta["usage"]["cache_read_input_tokens"],
                                 want["usage"]["prompt_tokens"])
                print("%s -> %r" % (req["messages"][-1]["content"], blocks[-1]))

    def test_same_prompt(self):
        """a Messages request renders to its chat request's prompt, id for id: count_tokens is
        `k3run --render-chat`'s length, and the chat request sent right after the Messages request
        finds its whole prompt in the cache (the server holds the Messages prompt's ids)"""
        prior = [{"role": "user", "content": Q1},
                 {"role": "assistant", "content": [
                     {"type": "thinking", "thinking": "A verse.", "signature": "sig"},
                     {"type": "text", "text": "Let me look."},
                     {"type": "tool_use", "id": "toolu_1", "name": "lookup",
                      "input": {"ref": "Genesis 1:1", "n": 0.1, "deep": {"a": [1, 2.5, "\u00e9\n\"", None, True]}}},
                     {"type": "tool_use", "id": "toolu_2", "name": "lookup", "input": {RAW: "{\"ref\": "}}]},
                 {"role": "user", "content": [
                     {"type": "tool_result", "tool_use_id": "toolu_1", "content": RESULT},
                     {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                      "content": [{"type": "text", "text": "bad"}, {"type": "text", "text": " arguments"}]},
                     {"type": "text", "text": "Now quote it."}]}]
        cases = [{"messages": [{"role": "user", "content": Q1}]},
                 {"system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
                  "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                               {"role": "assistant", "content": "Yes."}, {"role": "system", "content": "Quote."},
                               {"role": "user", "content": Q2}]},
                 {"tools": TOOLS, "messages": prior},
                 {"tools": TOOLS, "tool_choice": {"type": "any"}, "thinking": {"type": "disabled"}, "messages": prior},
                 {"tools": TOOLS, "tool_choice": {"type": "tool", "name": "lookup"},
                  "thinking": {"type": "enabled", "budget_tokens": 2000}, "messages": prior},
                 {"tools": TOOLS, "tool_choice": {"type": "none"}, "messages": prior[:1]},
                 {"tools": TOOLS, "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
                  "thinking": {"type": "adaptive"}, "messages": prior[:1]}]
        for req in cases:
            with self.subTest(req=req):
                chat = chat_of(dict(req, max_tokens=1))
                ids = render_ids(chat, self.work)
                st, n = self.post(req, COUNT)
                self.assertEqual((st, n), (200, {"input_tokens": len(ids)}))
                self.assertEqual(self.srv.chat({"messages": [{"role": "user", "content": "Reset."}], "max_tokens": 1,
                                                "reasoning_effort": "none"})[0], 200)
                st, got = self.post(dict(req, max_tokens=1, temperature=0))
                self.assertEqual(st, 200, got)
                u = got["usage"]
                self.assertEqual(u["input_tokens"] + u["cache_read_input_tokens"], len(ids))
                st, c = self.srv.chat(dict(chat, temperature=0))
                self.assertEqual(st, 200, c)
                self.assertEqual(c["usage"]["prompt_tokens"], len(ids))
                self.assertEqual(c["usage"]["prompt_tokens_details"]["cached_tokens"], len(ids))
                # the same Messages request again: the cache reads it all (the count, not just the sum)
                st, again = self.post(dict(req, max_tokens=1, temperature=0))
                self.assertEqual((again["usage"]["cache_read_input_tokens"], again["usage"]["input_tokens"]),
                                 (len(ids), 0), again["usage"])

    def test_stop_sequences_and_max_tokens(self):
        """stop_sequences end the answer before the first one met: stop_reason stop_sequence with that
        string, the text of the chat endpoint's `stop` (streamed too); max_tokens: stop_reason max_tokens"""
        base = {"max_tokens": 60, "temperature": 0, "thinking": {"type": "disabled"},
                "messages": [{"role": "user", "content": Q1}]}
        st, full = self.post(base)
        self.assertEqual(st, 200, full)
        text = full["content"][0]["text"]
        word = text.split()[4]
        req = dict(base, stop_sequences=["\u00a7never", word])
        st, got = self.post(req)
        self.assertEqual(st, 200, got)
        self.assertEqual((got["stop_reason"], got["stop_sequence"]), ("stop_sequence", word))
        self.assertEqual(got["content"], [{"type": "text", "text": text[:text.index(word)]}])
        st, c = self.srv.chat(chat_of(req))
        self.assertEqual(c["choices"][0]["message"]["content"], got["content"][0]["text"])
        self.assertEqual(c["choices"][0]["finish_reason"], "stop")
        want = k3run_chat(self.pack, chat_of(req), cli_args(req), self.work)
        self.assertEqual(want["message"]["content"], got["content"][0]["text"])
        st, evs = events(self.srv, req)
        blocks, _, delta = self.blocks(evs)
        self.assertEqual(blocks, got["content"])
        self.assertEqual(delta["delta"], {"stop_reason": "stop_sequence", "stop_sequence": word})
        st, got = self.post(dict(base, max_tokens=5))
        self.assertEqual((got["stop_reason"], got["stop_sequence"], got["usage"]["output_tokens"]),
                         ("max_tokens", None, 5))
        self.assertEqual(got["content"], [{"type": "text", "text": full["content"][0]["text"][:len(got["content"][0]["text"])]}])

    def test_bad_requests(self):
        """each gets Anthropic's error shape and its status; the server keeps serving"""
        cases = BAD_REQUESTS
        for path, body, words in cases:
            with self.subTest(path=path, body=body):
                st, hd, data = self.srv.request("POST", path, body)
                self.assertEqual(st, 400, data)
                doc = json.loads(data)
                self.assertEqual(set(doc), {"type", "error"})
                self.assertEqual(doc["type"], "error")
                self.assertEqual(doc["error"]["type"], "invalid_request_error")
                self.assertIn(words, doc["error"]["message"])
        st, evs = events(self.srv, dict(_GOOD, messages=[]))                # refused before the stream began
        self.assertEqual((st, evs[0][1]["type"]), (400, "error"))
        self.healthy()
        st, got = self.post(_GOOD)
        self.assertEqual(st, 200, got)

    def test_tool_use(self):
        """an answer that calls tools (K3_TEST_ANSWER stands in for the model's tokens): tool_use blocks,
        stop_reason tool_use, inputs parsed from the calls' arguments (a raw one kept as its text),
        streamed as input_json_delta; the chat endpoint's calls are the same"""
        srv = Server(self.pack, ["-t", "1"], env={"K3_TEST_ANSWER": TOOL_ANSWER})
        try:
            req = {"max_tokens": 300, "tools": TOOLS, "thinking": {"type": "disabled"},
                   "messages": [{"role": "user", "content": Q1}]}
            st, _, data = srv.post(MSG, req)
            self.assertEqual(st, 200, data)
            got = json.loads(data)
            self.assertEqual(got["stop_reason"], "tool_use")
            uses = got["content"]
            self.assertEqual([(b["type"], b["name"]) for b in uses], [("tool_use", "lookup")] * 2)
            self.assertEqual(uses[0]["input"], {"ref": "Genesis 1:1", "n": 2.5})
            self.assertEqual(uses[1]["input"], {RAW: "{\"ref\": "})
            self.assertTrue(all(b["id"].startswith("toolu_") for b in uses))
            self.assertEqual(len({b["id"] for b in uses}), 2)
            st, c = srv.chat(chat_of(req))
            calls = c["choices"][0]["message"]["tool_calls"]
            self.assertEqual([x["function"]["arguments"] for x in calls], ['{"ref":"Genesis 1:1","n":2.50}', '{"ref": '])
            back = chat_of({"messages": [{"role": "assistant", "content": uses}, {"role": "user", "content": "x"}]})
            self.assertEqual([x["function"]["arguments"] for x in back["messages"][0]["tool_calls"]],
                             ['{"ref":"Genesis 1:1","n":2.5}', '{"ref": '])
            st, evs = events(srv, req)
            blocks, _, delta = self.blocks(evs)
            self.assertEqual(delta["delta"]["stop_reason"], "tool_use")
            self.assertEqual([dict(b, id=None) for b in blocks], [dict(b, id=None) for b in uses])
            partial = [d["delta"]["partial_json"] for n, d in evs if n == "content_block_delta"]
            self.assertEqual(partial, ['{"ref":"Genesis 1:1","n":2.50}', json.dumps({RAW: "{\"ref\": "},
                                                                                     separators=(",", ":"))])
        finally:
            self.assertEqual(srv.stop(), 0, srv.stderr())


class ServeKeepAlive(unittest.TestCase):
    """A stream that has begun and then sends nothing for a while (a long prompt being processed)
    gets its API's keep-alive: Anthropic's ping event, an SSE comment for the OpenAI APIs; the
    answer is the one without them. The interval, 15 s, is 20 ms here (K3_TEST_KEEPALIVE_MS)."""

    def test_keepalive(self):
        work = os.path.join(TMP, "k3run-serve-messages")
        os.makedirs(work, exist_ok=True)
        pack = kjv_pack(work)
        long = " ".join(["And the LORD spake unto Moses, saying, Speak unto the children of Israel."] * 90)
        srv = Server(pack, ["-t", "1", "--snapshots", "0"], env={"K3_TEST_KEEPALIVE_MS": "20"})
        try:
            body = {"max_tokens": 12, "temperature": 0, "thinking": {"type": "disabled"},
                    "messages": [{"role": "user", "content": long}]}
            st, evs = events(srv, body)
            self.assertEqual(st, 200, evs)
            names = [e for e, _ in evs]
            self.assertEqual(names[0], "message_start")
            self.assertEqual(names[-1], "message_stop")
            pings = names.count("ping")
            st, _, whole = srv.post(MSG, body)
            text = "".join(d["delta"].get("text", "") for e, d in evs if e == "content_block_delta")
            self.assertEqual(text, json.loads(whole)["content"][0]["text"])
            st, _, data = srv.post("/v1/chat/completions", {"max_tokens": 12, "temperature": 0, "stream": True,
                                                             "reasoning_effort": "none",
                                                             "messages": [{"role": "user", "content": long + " 2"}]})
            comments = data.decode().count(": keep-alive\n\n")
            print("a %d-byte prompt streamed: %d pings (1 is message_start's), %d keep-alive comments"
                  % (len(long), pings, comments))
            self.assertGreater(pings, 1, "no ping while the prompt was processed")
            self.assertGreater(comments, 0)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_keepalive_queued(self):
        """A stream waiting in the queue behind another conversation is kept alive too (its headers
        went out when it was queued; a client or proxy timing out idle reads would drop it): pings
        before its message_start, and the same answer as sent alone"""
        work = os.path.join(TMP, "k3run-serve-messages")
        os.makedirs(work, exist_ok=True)
        pack = kjv_pack(work)
        srv = Server(pack, ["-t", "1", "--snapshots", "0"], env={"K3_TEST_KEEPALIVE_MS": "20"})
        try:
            first = {"prompt": "Genesis 1\n1 In the beginning", "max_tokens": 600, "temperature": 0}
            done = []
            th = threading.Thread(target=lambda: done.append(srv.post("/v1/completions", first)))
            th.start()
            for _ in range(500):
                if json.loads(srv.request("GET", "/health")[2])["slots_busy"]:
                    break
                time.sleep(0.002)
            body = {"max_tokens": 12, "temperature": 0, "thinking": {"type": "disabled"},
                    "messages": [{"role": "user", "content": Q1}]}
            st, evs = events(srv, body)
            th.join()
            self.assertEqual((st, done[0][0]), (200, 200), (evs, done))
            names = [e for e, _ in evs]
            queued = names.index("message_start")
            print("a stream queued behind a 600-token answer: %d pings before its message_start" % queued)
            self.assertGreater(queued, 0, names)
            self.assertEqual(set(names[:queued]), {"ping"})
            self.assertEqual(names[-1], "message_stop")
            st, _, whole = srv.post(MSG, body)
            text = "".join(d["delta"].get("text", "") for e, d in evs if e == "content_block_delta")
            self.assertEqual(text, json.loads(whole)["content"][0]["text"])
        finally:
            self.assertEqual(srv.stop(), 0, srv.stderr())


class ServeMessagesKey(unittest.TestCase):
    def test_api_key(self):
        """x-api-key as Anthropic's clients send it (or Bearer); a wrong or missing key: 401 in
        Anthropic's shape; the server keeps serving"""
        _, pack = make_pack("tiny", 1)
        srv = Server(pack, ["--api-key", "s3cret", "-t", "1"])
        try:
            body = {"max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
            for path in (MSG, COUNT):
                for headers, status in (({}, 401), ({"x-api-key": "nope"}, 401), ({"x-api-key": "s3cret0"}, 401),
                                        ({"x-api-key": "s3cret"}, 200), ({"Authorization": "Bearer s3cret"}, 200)):
                    st, _, data = srv.post(path, body, headers)
                    self.assertEqual(st, status, (path, headers, data))
                    if status == 401:
                        self.assertEqual(json.loads(data), {"type": "error", "error": {
                            "type": "authentication_error", "message": json.loads(data)["error"]["message"]}})
            st, evs = events(srv, body, headers={"x-api-key": "s3cret"})
            self.assertEqual((st, evs[-1][0]), (200, "message_stop"))
        finally:
            self.assertEqual(srv.stop(), 0, srv.stderr())


@need(shutil.which("node"), "node is not installed (scripts/setup.sh installs Debian's nodejs)")
@need(os.path.exists(SDK), "the @anthropic-ai/sdk is not installed: run scripts/setup.sh "
                     "(npm ci in tests/serve)")
class ServeMessagesSdk(unittest.TestCase):
    def test_sdk(self):
        """the official SDK: messages.create, messages.stream and create({stream: true}) equal `k3run
        chat`; countTokens; a whole tool round trip (tool_use from a scripted server, the tool_result
        answered by the model as `k3run chat` answers its chat request); a BadRequestError"""
        work = os.path.join(TMP, "k3run-serve-messages")
        pack = kjv_pack(work)
        plain = [{"model": MODEL, "max_tokens": 60, "temperature": 0, "messages": [{"role": "user", "content": Q1}]},
                 {"model": MODEL, "max_tokens": 40, "temperature": 0.8, "top_p": 0.9, "system": "Answer briefly.",
                  "thinking": {"type": "disabled"}, "messages": [{"role": "user", "content": Q2}]}]
        tool_call = {"model": MODEL, "max_tokens": 300, "temperature": 0, "tools": TOOLS,
                     "thinking": {"type": "disabled"}, "messages": [{"role": "user", "content": Q1}]}
        spec = {"plain": plain, "count": {"model": MODEL, "system": "Answer briefly.", "tools": TOOLS,
                                          "messages": [{"role": "user", "content": Q2}]},
                "tool_call": tool_call, "tool_result": RESULT, "answer_max_tokens": 50,
                "bad": {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}}
        # keep-alives every 3 ms: ping events among the SDK's streams, which it must take in its stride
        srv = Server(pack, ["-t", "1"], env={"K3_TEST_KEEPALIVE_MS": "3"})
        scripted = Server(pack, ["-t", "1"], env={"K3_TEST_ANSWER": TOOL_ANSWER})
        try:
            spec["base_url"], spec["tool_url"] = srv.url(), scripted.url()
            path = os.path.join(work, "anthropic-spec.json")
            with open(path, "w") as f:
                json.dump(spec, f)
            p = subprocess.run(["node", os.path.join(HERE, "anthropic_client.mjs"), path], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=300, cwd=HERE)
            self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
            got = json.loads(p.stdout)
        finally:
            rc = srv.stop()
            self.assertEqual(scripted.stop(), 0, scripted.stderr())
        self.assertEqual(rc, 0, srv.stderr())
        for req, res in zip(plain, got["plain"]):
            want = k3run_chat(pack, chat_of(req), cli_args(req), work)
            m = want["message"]
            for msg in (res["message"], res["stream"]["final"]):
                self.assertEqual([b.get("text") for b in msg["content"] if b["type"] == "text"], [m["content"]])
                self.assertEqual("".join(b["thinking"] for b in msg["content"] if b["type"] == "thinking"),
                                 m["reasoning_content"] or "")
                self.assertEqual(msg["stop_reason"], stop_reason(want["finish_reason"]))
                self.assertEqual(msg["usage"]["output_tokens"], want["usage"]["completion_tokens"])
                self.assertEqual(msg["usage"]["input_tokens"] + msg["usage"]["cache_read_input_tokens"],
                                 want["usage"]["prompt_tokens"])
            for s in (res["stream"], res["raw"]):
                self.assertEqual((s["text"], s["thinking"]), (m["content"], m["reasoning_content"] or ""))
            types = res["raw"]["types"]
            # (the SDK drops ping events)
            self.assertEqual(types[:2] + types[-2:], ["message_start", "content_block_start", "message_delta",
                                                      "message_stop"])
            self.assertEqual(res["raw"]["stop_reason"], stop_reason(want["finish_reason"]))
            print("SDK: %r" % m["content"])
        ids = render_ids(chat_of(spec["count"]), work)
        self.assertEqual(got["count"], {"input_tokens": len(ids)})
        tc = got["tool_call"]
        for first in (tc["first"], tc["streamed"]):
            self.assertEqual(first["stop_reason"], "tool_use")
            self.assertEqual([b["input"] for b in first["content"]], [{"ref": "Genesis 1:1", "n": 2.5}, {RAW: "{\"ref\": "}])
        answer = dict(tool_call, messages=tc["messages"], max_tokens=50)
        want = k3run_chat(pack, chat_of(answer), cli_args(answer), work)
        self.assertEqual(tc["answer"]["content"], [{"type": "text", "text": want["message"]["content"]}])
        self.assertEqual(tc["answer"]["usage"]["input_tokens"] + tc["answer"]["usage"]["cache_read_input_tokens"],
                         want["usage"]["prompt_tokens"])
        e = got["error"]
        self.assertEqual((e["status"], e["name"], e["is_bad_request"]), (400, "BadRequestError", True), e)
        self.assertEqual(e["body"]["error"]["type"], "invalid_request_error")
        self.assertIn("text-only", e["body"]["error"]["message"])


if __name__ == "__main__":
    unittest.main()
