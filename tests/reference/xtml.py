"""Independent Python reference of Kimi K3's chat format "XTML" (spec/CHAT-FORMAT.md §3-§8).

Written from the specification alone (no code shared with k3run/text/chat_*.c). It is the
test-side oracle of `k3run --render-chat`.

    pieces(request, specials)  -> the piece list: int = one control id, str = one text piece
                                  (empty strings never make a piece, §3.1)
    render(request, tok)       -> {"pieces", "ids", "thinking", "n_ids"}: every text piece is
                                  encoded on its own with special recognition off, after the
                                  §3.3 cuts (400 000 code points, runs of 25 000 by
                                  str.isspace), lone surrogates as U+FFFD (kimi_tokenizer.py)
    XtmlError                  -> a refused request (k3run exits 2)

The request is one JSON object: the OpenAI fields `messages`, `tools`, `tool_choice`,
`response_format`, `reasoning_effort` (low|high|max; "none" turns thinking off) and a
boolean `thinking`, plus an `options` object with the official apply_chat_template names
(`thinking`, `thinking_effort` (an explicit null means no effort message),
`add_generation_prompt`, `tool_choice`, `response_format`, `response_schema`), as the worked
examples of §13 use. Where both give a value, `options` wins. `image_prompts` (either place)
is refused: k3 is a text-only engine (§6.7, §10.3). The request layer is not the spec's
subject; where the spec leaves it open this follows docs/k3run-chat-format.md (see
_options). Values the official code prints with str() (names, reasoning, a part's text, tool
names, call ids) print as Python does; a list or an object there is refused, as k3run does.

Command line (the same output as `k3run --render-chat FILE --json`):
    python3 xtml.py --tokenizer DIR FILE [--json]
"""

import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

OPEN, CLOSE, SEP, EOM = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"
CONTROL_NAMES = (OPEN, CLOSE, SEP, EOM)
IMAGE_PLACEHOLDER = "<|kimi_image_placeholder|>"

EFFORT_BODY = ("`thinking_effort` guides on how much to think in your thinking channel (not including "
               "the response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
               "Now the system is invoked with `thinking_effort=%s`.")
TOOL_CHOICE_BODY = {
    "required": "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.",
    "none": "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.",
}
JSON_OBJECT_BODY = ("The system is invoked with `response_format=json_object`.\nYour response must be raw "
                    "JSON data without markdown code blocks (```json) or any additional formatting.")
JSON_SCHEMA_BODY = ("The system is invoked with `response_format=json_schema`.\nYour response must be raw "
                    "JSON data without markdown code blocks (```json) or any additional formatting.\n"
                    "The JSON data must match the following schema:\n```json\n%s\n```")
TOOL_DECLARE_BODY = "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n%s\n```"
DYNAMIC_DECLARE_BODY = ("## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
                        "You have access to all existing and extended tools.\n"
                        "Here are the specs for the extended tools.\n\n```json\n%s\n```")

ROLES = ("system", "user", "assistant", "tool")
EFFORTS = ("low", "high", "max")
_ABSENT = object()


class XtmlError(ValueError):
    """The request is refused (the official code raises; k3run exits 2)."""


# ---------------------------------------------------------------------------
# JSON as Python writes it (§7.3)
# ---------------------------------------------------------------------------

def compact_sorted(value):
    """Compact sorted JSON: ',' ':' separators, keys sorted recursively, non-ASCII raw,
    integers exact, reals as Python repr (1e400 -> Infinity)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def dict_value_text(value):
    """A non-string dict-argument value: Python's json.dumps with its default ', ' ': '
    separators and non-ASCII kept raw (§7.2)."""
    return json.dumps(value, ensure_ascii=False)


def json_type(value):
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    raise XtmlError("argument value of type %s" % type(value).__name__)


# ---------------------------------------------------------------------------
# The one-level argument parser (§7.2)
# ---------------------------------------------------------------------------

_WS = " \t\n\r"
_DECODER = json.JSONDecoder(strict=False)      # raw control characters allowed, NaN/Infinity accepted


class _Raw(Exception):
    pass


def _skip(s, i):
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def parse_arguments_string(s):
    """[(key, type, value_text), ...] for a JSON object string, or None for a RAW block.

    Only the top level is parsed: keys are decoded strings, strings are decoded, every other
    value is its exact source slice. Duplicate keys are all kept; text after the closing '}'
    is ignored; a trailing comma, a non-string key or anything unexpected means RAW."""
    try:
        i = _skip(s, 0)
        if i >= len(s) or s[i] != "{":
            raise _Raw()
        i = _skip(s, i + 1)
        if i < len(s) and s[i] == "}":
            return []
        out = []
        while True:
            if i >= len(s) or s[i] != '"':
                raise _Raw()
            key, i = json.decoder.scanstring(s, i + 1, False)
            i = _skip(s, i)
            if i >= len(s) or s[i] != ":":
                raise _Raw()
            i = _skip(s, i + 1)
            start = i
            value, i = _DECODER.scan_once(s, i)
            text = value if isinstance(value, str) else s[start:i]
            out.append((key, json_type(value), text))
            i = _skip(s, i)
            if i >= len(s):
                raise _Raw()
            c = s[i]
            i = _skip(s, i + 1)
            if c == "}":
                return out
            if c != ",":
                raise _Raw()
    except (_Raw, ValueError, StopIteration, IndexError):
        return None
    except RecursionError:
        raise XtmlError("tool call arguments nested too deeply") from None


# ---------------------------------------------------------------------------
# Pieces
# ---------------------------------------------------------------------------

def pystr(value, what):
    """str() of a value the official code prints (a name, a reasoning, a part's text, a tool
    name, a call id): None, True, 3, 2.5 as Python prints them. A list or an object (Python
    would print its repr) is refused, as k3run does (docs/k3run-chat-format.md)."""
    if isinstance(value, (list, dict)):
        raise XtmlError("%s is a %s" % (what, "list" if isinstance(value, list) else "object"))
    return str(value)


def escape_attr(value):
    return pystr(value, "an attribute value").replace("&", "&amp;").replace('"', "&quot;")


class _Out:
    def __init__(self, specials):
        try:
            self.o, self.c, self.s, self.e = (specials[n] for n in CONTROL_NAMES)
        except KeyError as e:
            raise XtmlError("the tokenizer has no special %s" % e) from None
        self.p = []

    def text(self, t):
        if not isinstance(t, str):
            raise XtmlError("text of type %s" % type(t).__name__)
        if t != "":
            self.p.append(t)

    def open_tag(self, name, attrs=()):
        self.p.append(self.o)
        self.text(name)
        for k, v in attrs:
            self.text(" " + k)
            self.text('="')
            self.text(escape_attr(v))
            self.text('"')
        self.p.append(self.s)

    def close_tag(self, name):
        self.p.append(self.c)
        self.text(name)
        self.p.append(self.s)

    def eom(self):
        self.p.append(self.e)

    def internal(self, typ, body):
        self.open_tag("message", [("role", "system"), ("type", typ)])
        self.text(body.strip())
        self.close_tag("message")
        self.eom()

    def declaration(self, template, tools):
        # The tool declaration's body is not stripped (§7.1).
        self.open_tag("message", [("role", "system"), ("type", "tool-declare")])
        self.text(template % compact_sorted(tools))
        self.close_tag("message")
        self.eom()

    def content(self, content, what):
        if content is None:
            return
        if isinstance(content, str):
            self.text(content)
            return
        if isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    raise XtmlError("%s: a content part is not an object" % what)
                # A part needs a "type" (the official code reads part["type"]; §6.7 does
                # not say so).
                if "type" not in part:
                    raise XtmlError("%s: a content part has no type" % what)
                if part["type"] in ("image", "image_url"):
                    # A control segment, but not a vocabulary token: it is BPE'd as text.
                    self.text(IMAGE_PLACEHOLDER)
                    continue
                if "text" not in part:
                    raise XtmlError("%s: a content part has no text" % what)
                self.text(pystr(part["text"], "%s: a part's text" % what))
            return
        raise XtmlError("%s: content of type %s" % (what, type(content).__name__))

    def reasoning(self, msg):
        # reasoning_content, else (when falsy) reasoning; None renders nothing (§6.3)
        r = msg.get("reasoning_content") or msg.get("reasoning")
        if r is not None:
            self.text(pystr(r, "reasoning"))


def _attrs(role, msg):
    a = [("role", role)]
    if msg.get("name"):
        a.append(("name", msg["name"]))
    return a


def _tool_calls(msg):
    tc = msg.get("tool_calls")
    if not tc:
        return []
    if not isinstance(tc, list):
        raise XtmlError("tool_calls is not a list")
    return tc


def _call_function(call):
    if not isinstance(call, dict):
        raise XtmlError("a tool call is not an object")
    f = call["function"] if "function" in call else call
    if not isinstance(f, dict):
        raise XtmlError("a tool call's function is not an object")
    return f


def _call_name(call):
    f = _call_function(call)
    if "name" not in f:
        raise XtmlError("a tool call has no name")
    return pystr(f["name"], "a tool call's name")


def _render_call(out, call, index):
    f = _call_function(call)
    out.open_tag("call", [("tool", _call_name(call)), ("index", index)])
    args = f.get("arguments")
    if args is None or args == "":
        pass
    elif isinstance(args, str):
        parsed = parse_arguments_string(args)
        if parsed is None:
            out.open_tag("json", [("type", "object")])
            out.text(args)
            out.close_tag("json")
        else:
            for key, typ, text in parsed:
                out.open_tag("argument", [("key", key), ("type", typ)])
                out.text(text)
                out.close_tag("argument")
    elif isinstance(args, dict):
        for key, value in args.items():
            typ = json_type(value)
            out.open_tag("argument", [("key", key), ("type", typ)])
            out.text(value if isinstance(value, str) else dict_value_text(value))
            out.close_tag("argument")
    else:
        raise XtmlError("tool call arguments of type %s" % type(args).__name__)
    out.close_tag("call")


def _resort_tool_runs(messages):
    """§6.5 on copies of the messages: every run of consecutive tool messages whose ids all
    match a call of the most recent assistant message is stably sorted by the call's
    position, and takes the call's function name as `tool` (and as `name` if it has one)."""
    msgs = [dict(m) for m in messages]
    calls = []
    i = 0
    while i < len(msgs):
        m = msgs[i]
        if m.get("role") == "assistant":
            calls = _tool_calls(m)
        if m.get("role") != "tool":
            i += 1
            continue
        j = i
        while j < len(msgs) and msgs[j].get("role") == "tool":
            j += 1
        pos = {}
        for n, call in enumerate(calls, 1):             # id-less calls take a number too
            cid = call.get("id") if isinstance(call, dict) else None
            if cid is not None:
                # compared as strings; the first of equal ids wins
                pos.setdefault(pystr(cid, "a call id"), n)
        keyed = []
        for m in msgs[i:j]:
            cid = m["tool_call_id"] if "tool_call_id" in m else m.get("id")
            n = pos.get(pystr(cid, "a tool_call_id")) if cid is not None else None
            if n is None:
                keyed = None
                break
            keyed.append((n, m))
        if keyed is not None:
            keyed.sort(key=lambda nm: nm[0])          # stable
            for k, (n, m) in enumerate(keyed):
                c = calls[n - 1]
                f = c.get("function")
                name = f.get("name") if isinstance(f, dict) else c.get("name")
                if name is not None:                  # a nameless call renames nothing
                    m["tool"] = name
                    if "name" in m:
                        m["name"] = name
                msgs[i + k] = m
        i = j
    return msgs


OPTION_KEYS = ("thinking", "thinking_effort", "add_generation_prompt", "tool_choice", "response_format",
               "response_schema", "image_prompts")


def _options(request):
    """The rendering options of §4 from the request.

    Aligned with docs/k3run-chat-format.md where the spec leaves the request layer open: a key
    in `options` wins over the OpenAI field for the same setting; `options.thinking` and
    `options.add_generation_prompt` are taken by truthiness (they are the official code's
    keyword arguments); the top-level `thinking` must be a boolean (null = absent) and
    `reasoning_effort` a string (null = absent); `thinking: true` with `reasoning_effort:
    "none"` is a contradiction; an unknown `options` key is refused; add_generation_prompt is
    an option only."""
    if not isinstance(request, dict):
        raise XtmlError("the request is not an object")
    opts = request.get("options")
    if opts is None:
        opts = {}
    if not isinstance(opts, dict):
        raise XtmlError("options is not an object")
    for k in opts:
        if k not in OPTION_KEYS:
            raise XtmlError("unknown option %r" % k)
    if "image_prompts" in opts or request.get("image_prompts") is not None:
        raise XtmlError("image_prompts: k3 is a text-only engine")

    def pick(key):
        if key in opts:
            return opts[key]
        return request.get(key)

    thinking = True
    effort = _ABSENT
    re_ = request.get("reasoning_effort")
    top_thinking = request.get("thinking")
    if re_ is not None and not isinstance(re_, str):
        raise XtmlError("reasoning_effort is not a string")
    if top_thinking is not None and not isinstance(top_thinking, bool):
        raise XtmlError("thinking is not a boolean")
    if re_ == "none":
        if top_thinking is True:
            raise XtmlError("thinking: true with reasoning_effort: none")
        thinking = False
    elif re_ is not None:
        effort = re_
    if top_thinking is not None:
        thinking = top_thinking
    if "thinking" in opts:
        thinking = bool(opts["thinking"])
    if "thinking_effort" in opts:
        effort = opts["thinking_effort"]
    if effort is _ABSENT:
        effort = "max"
    return {
        "thinking": thinking,
        "effort": effort,
        "add_generation_prompt": bool(opts.get("add_generation_prompt", True)),
        "tool_choice": pick("tool_choice"),
        "response_format": pick("response_format"),
        "response_schema": opts.get("response_schema", _ABSENT),
        "tools": request.get("tools"),
    }


def _response_format_type(rf):
    if isinstance(rf, str):
        return rf
    if isinstance(rf, dict):
        return rf.get("type")
    return None


def _schema(rf, response_schema):
    """§6.6: an explicit response_schema (even null), else json_schema's "schema" key, else
    its "json_schema" key, else the json_schema object itself; no json_schema is null.
    "Failing that" means the key is absent: a present null is the schema null."""
    if response_schema is not _ABSENT:
        return response_schema
    js = rf.get("json_schema") if isinstance(rf, dict) else None
    if isinstance(js, dict):
        return js.get("schema", js.get("json_schema", js))
    return js


def pieces(request, specials):
    """The piece list of a request (§5 order). `specials` maps a special's name to its id."""
    o = _options(request)
    thinking = o["thinking"]
    msgs = request.get("messages")
    if not isinstance(msgs, list):
        raise XtmlError("messages is not a list")
    for m in msgs:
        if not isinstance(m, dict):
            raise XtmlError("a message is not an object")
        if m.get("role") not in ROLES:
            raise XtmlError("role %r" % (m.get("role"),))
    out = _Out(specials)

    tools = o["tools"]
    if tools:
        out.declaration(TOOL_DECLARE_BODY, tools)
    if thinking:
        e = o["effort"]
        if e is not None:
            if not isinstance(e, str) or e not in EFFORTS:
                raise XtmlError("thinking_effort %r (low, high, max or null)" % (e,))
            out.internal("thinking-effort", EFFORT_BODY % e)

    calls = []
    n_tool = 0
    for m in _resort_tool_runs(msgs):
        role = m["role"]
        if role == "system" and m.get("tools"):
            out.declaration(DYNAMIC_DECLARE_BODY, m["tools"])
            continue
        if role in ("system", "user"):
            out.open_tag("message", _attrs(role, m))
            out.content(m.get("content"), role)
        elif role == "assistant":
            n_tool = 0
            calls = _tool_calls(m)
            out.open_tag("message", _attrs(role, m))
            if thinking:
                out.open_tag("think")
                out.reasoning(m)
                out.close_tag("think")
            out.open_tag("response")
            out.content(m.get("content"), "assistant")
            out.close_tag("response")
            if calls:
                out.open_tag("tools")
                for k, call in enumerate(calls, 1):
                    _render_call(out, call, k)
                out.close_tag("tools")
        else:                                   # tool
            n_tool += 1
            # the tool field, else the name field (a null one counts as absent), else the call
            # at this position (§6.4)
            name = m.get("tool", m.get("name"))
            if name is None:
                if n_tool > len(calls):
                    raise XtmlError("tool message %d: no name (no matching call)" % n_tool)
                name = _call_name(calls[n_tool - 1])
            out.open_tag("message", [("role", "tool"), ("tool", name), ("index", n_tool)])
            out.content(m.get("content"), "tool")
        out.close_tag("message")
        out.eom()

    tc = o["tool_choice"]
    if isinstance(tc, str) and tc in TOOL_CHOICE_BODY:
        out.internal("tool-choice", TOOL_CHOICE_BODY[tc])
    rf = o["response_format"]
    rft = _response_format_type(rf)
    if rft == "json_object":
        out.internal("response-format", JSON_OBJECT_BODY)
    elif rft == "json_schema":
        out.internal("response-format", JSON_SCHEMA_BODY % compact_sorted(_schema(rf, o["response_schema"])))
    if o["add_generation_prompt"]:
        out.open_tag("message", [("role", "assistant")])
        out.open_tag("think" if thinking else "response")
    return out.p


def thinking_of(request):
    return _options(request)["thinking"]


# ---------------------------------------------------------------------------
# Ids
# ---------------------------------------------------------------------------

_LONE = re.compile("[\ud800-\udfff]")


def fix_surrogates(s):
    """tiktoken's fix-up of text it cannot UTF-8-encode: a UTF-16 round trip, so an adjacent
    high + low pair is joined and every other lone surrogate becomes U+FFFD (§3.3)."""
    if not _LONE.search(s):
        return s
    return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def encode_text(tok, s):
    """One text piece: §3.3 cuts then BPE, special recognition off (kimi_tokenizer.encode)."""
    return tok.encode(fix_surrogates(s), allow_special=False)


def render(request, tok):
    ps = pieces(request, tok.special_ids)
    out, ids = [], []
    for p in ps:
        if isinstance(p, int):
            out.append({"special": tok.special_names[p], "id": p})
            ids.append(p)
        else:
            t = encode_text(tok, p)
            out.append({"text": fix_surrogates(p), "ids": t})
            ids.extend(t)
    o = _options(request)
    return {"ids": ids, "pieces": out, "thinking": o["thinking"], "add_generation_prompt": o["add_generation_prompt"],
            "n_ids": len(ids)}


def main(argv=None):
    import argparse
    import kimi_tokenizer
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("file")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        with open(a.file, "rb") as f:
            request = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as e:
        sys.stderr.write("xtml: %s\n" % e)
        return 1
    tok = kimi_tokenizer.Tokenizer.from_dir(a.tokenizer)
    try:
        r = render(request, tok)
    except XtmlError as e:
        sys.stderr.write("xtml: refused: %s\n" % e)
        return 2
    if a.json:
        sys.stdout.write(json.dumps(r, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(" ".join(map(str, r["ids"])) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
