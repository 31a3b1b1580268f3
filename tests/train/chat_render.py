"""K3's chat format ("XTML", spec/CHAT-FORMAT.md) for the demo model's training conversations.

A small renderer, enough for the conversations of kjv_data.py: system, user and assistant
messages, thinking on (a think channel, the thinking-effort message) or off, the generation
prompt. Every text piece is encoded on its own with special-token recognition off; the four
markers are single ids. pieces() returns the pieces (str = text, int = control id), render()
the ids. The C renderer of k3run is checked against the official worked examples, not this.
"""

EFFORT_BODY = ("`thinking_effort` guides on how much to think in your thinking channel (not including "
               "the response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
               "Now the system is invoked with `thinking_effort=%s`.")


class Markers:
    def __init__(self, tok):
        ids = tok.special_ids
        self.open, self.close = ids["<|open|>"], ids["<|close|>"]
        self.sep, self.eom = ids["<|sep|>"], ids["<|end_of_msg|>"]


def _esc(v):
    return str(v).replace("&", "&amp;").replace('"', "&quot;")


def open_tag(m, name, attrs=()):
    out = [m.open, name]
    for k, v in attrs:
        out += [" " + k, '="', _esc(v), '"']
    return out + [m.sep]


def close_tag(m, name):
    return [m.close, name, m.sep]


def message(m, attrs, body):
    return open_tag(m, "message", attrs) + body + close_tag(m, "message") + [m.eom]


def pieces(m, messages, thinking=True, effort="max", add_generation_prompt=True):
    out = []
    if thinking and effort is not None:
        if effort not in ("low", "high", "max"):
            raise ValueError("thinking effort must be low, high, max or None")
        out += message(m, [("role", "system"), ("type", "thinking-effort")], [EFFORT_BODY % effort])
    for msg in messages:
        role = msg["role"]
        attrs = [("role", role)] + ([("name", msg["name"])] if msg.get("name") else [])
        if role in ("system", "user"):
            out += message(m, attrs, [msg.get("content") or ""])
        elif role == "assistant":
            body = []
            if thinking:
                r = msg.get("reasoning_content") or msg.get("reasoning") or ""
                body += open_tag(m, "think") + [r] + close_tag(m, "think")
            body += open_tag(m, "response") + [msg.get("content") or ""] + close_tag(m, "response")
            out += message(m, attrs, body)
        else:
            raise ValueError("role %r is not rendered by this small renderer" % role)
    if add_generation_prompt:
        out += open_tag(m, "message", [("role", "assistant")]) + open_tag(m, "think" if thinking else "response")
    return [p for p in out if p != ""]                      # empty strings make no piece


def render(tok, messages, thinking=True, effort="max", add_generation_prompt=True):
    m = Markers(tok)
    ids = []
    for p in pieces(m, messages, thinking, effort, add_generation_prompt):
        if isinstance(p, int):
            ids.append(p)
        else:
            ids.extend(tok.encode(p, allow_special=False))
    return ids
