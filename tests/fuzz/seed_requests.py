"""Write the seed corpora of the request-decoder fuzz targets (tests/fuzz/corpus/req_*/seed_*) from the
serve tests' requests: their bad-request lists (BAD_REQUESTS of test_serve, test_serve_messages,
test_serve_responses), their tools and tool round trips, `k3run batch`'s request lines, and requests of
every field each API reads. Run by hand after a test gains requests (seeds are committed, findings are
added by scripts/fuzz.sh):
    K3_BIN=build/bin K3_SRC=. K3_TEST_TMP=/tmp /usr/bin/python3 tests/fuzz/seed_requests.py"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "serve"))
import test_batch  # noqa: E402
import test_serve  # noqa: E402
import test_serve_messages as tm  # noqa: E402
import test_serve_responses as tr  # noqa: E402

U = [{"role": "user", "content": "Quote Genesis 1:1."}]


def raw(body):
    return body if isinstance(body, bytes) else json.dumps(body).encode()


def chat():
    out = [{"messages": U}, {"messages": U, "max_tokens": 80, "temperature": 0},
           {"messages": [{"role": "system", "content": "Answer briefly."}] + U, "temperature": 0.8, "top_p": 0.9,
            "seed": 5, "top_k": 40, "min_p": 0.05, "repeat_penalty": 1.1, "stop": ["\n", "LORD"], "n": 3},
           {"messages": U, "stream": True, "stream_options": {"include_usage": True}, "max_completion_tokens": 9},
           {"messages": U, "reasoning_effort": "none"}, {"messages": U, "reasoning_effort": "high"},
           {"messages": U, "tools": test_serve.TOOLS, "tool_choice": "auto"},
           {"messages": U, "tools": test_serve.TOOLS, "tool_choice": {"type": "function",
                                                                       "function": {"name": "lookup"}}},
           {"messages": U + [{"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "function", "function": {"name": "lookup",
                                                                 "arguments": "{\"ref\": \"Genesis 1:1\"}"}}]},
                             {"role": "tool", "tool_call_id": "call_1", "content": tm.RESULT}],
            "tools": test_serve.TOOLS},
           {"messages": U + [{"role": "assistant", "content": "In the beginning", "reasoning_content": "easy"},
                             {"role": "user", "content": [{"type": "text", "text": "And the next?"}]}]},
           {"messages": U, "response_format": {"type": "json_object"}},
           {"messages": [{"role": "user", "content": "x" * 3000}]}]
    out += [b for p, m, b, st in test_serve.BAD_REQUESTS if p == test_serve.CHAT and b is not None]
    return out


def completion():
    out = [{"prompt": "In the beginning God"}, {"prompt": ["And the LORD said"], "max_tokens": 30, "temperature": 0},
           {"prompt": "Blessed", "stream": True, "stop": "\n", "seed": 3}, {"prompt": "\u00e9\u4e2d \U0001F600"}]
    out += [b for p, m, b, st in test_serve.BAD_REQUESTS if p == "/v1/completions" and b is not None]
    return out


def messages():
    m = [{"role": "user", "content": "Quote Genesis 1:1."}]
    out = [{"max_tokens": 5, "messages": m}, {"max_tokens": 50, "system": "Answer briefly.", "messages": m,
                                               "temperature": 0.7, "top_p": 0.9, "top_k": 20, "stream": True},
           {"max_tokens": 50, "system": [{"type": "text", "text": "Be brief."}], "messages": m,
            "stop_sequences": ["LORD"], "thinking": {"type": "enabled", "budget_tokens": 16}},
           {"max_tokens": 50, "messages": m, "thinking": {"type": "disabled"}},
           {"max_tokens": 50, "messages": m, "tools": tm.TOOLS, "tool_choice": {"type": "auto"}},
           {"max_tokens": 50, "messages": m, "tools": tm.TOOLS, "tool_choice": {"type": "tool", "name": "lookup"}},
           {"max_tokens": 50, "tools": tm.TOOLS, "messages": m + [
               {"role": "assistant", "content": [{"type": "thinking", "thinking": "look it up", "signature": "x"},
                                                 {"type": "tool_use", "id": "toolu_1", "name": "lookup",
                                                  "input": {"ref": "Genesis 1:1"}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                             "content": [{"type": "text", "text": tm.RESULT}]}]}]},
           {"messages": m, "tools": tm.TOOLS, "system": "count me"}]
    out += [b for p, b, w in tm.BAD_REQUESTS]
    return out


def responses():
    out = [{"input": "Quote Genesis 1:1."}, {"input": "x", "instructions": "Be brief.", "max_output_tokens": 20,
                                             "temperature": 0, "stream": True},
           {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Quote Genesis 1:1."}]}],
            "reasoning": {"effort": "low"}, "store": False},
           {"input": "x", "tools": tr.FLAT_TOOLS, "tool_choice": "required"},
           {"input": [{"role": "user", "content": "Quote Genesis 1:1."},
                      {"type": "function_call", "call_id": "call_7", "name": "lookup",
                       "arguments": "{\"ref\": \"Genesis 1:1\"}"},
                      {"type": "function_call_output", "call_id": "call_7", "output": tr.VERSE}],
            "tools": tr.FLAT_TOOLS},
           {"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]},
                      {"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}],
            "text": {"format": {"type": "json_object"}}, "truncation": "auto"},
           {"input": "x", "previous_response_id": "resp_0123"}]
    out += [b for b, w in tr.BAD_REQUESTS]
    return out


def batch_lines():
    out = [json.dumps(r).encode() for r in test_batch.requests(6)]
    out += [b"{not json", b"[1]", b'{"custom_id": "a", "method": "GET", "url": "/v1/chat/completions", "body": {}}',
            b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}',
            b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": "x"}',
            b'{"method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}',
            b'{"custom_id": "a", "custom_id": "b", "method": "POST", "url": "/v1/completions", "body": {}}']
    return out


def main():
    for name, seeds in (("req_chat", chat()), ("req_completion", completion()), ("req_messages", messages()),
                        ("req_responses", responses()), ("req_batch_line", batch_lines())):
        d = os.path.join(HERE, "corpus", name)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            if f.startswith("seed_"):
                os.remove(os.path.join(d, f))
        for i, s in enumerate(seeds):
            with open(os.path.join(d, "seed_%03d.json" % i), "wb") as f:
                f.write(raw(s))
        print("%-16s %d seeds" % (name, len(seeds)))


if __name__ == "__main__":
    main()
