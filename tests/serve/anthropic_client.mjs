// The official `@anthropic-ai/sdk` against `k3run serve`'s /v1/messages (driven by test_serve_messages.py).
// Reads the requests from the JSON file argv[2]; prints one JSON document with what the SDK got.
import fs from "node:fs";
import Anthropic from "@anthropic-ai/sdk";
import { LOOKUP, lookup, readBible } from "./kjv_tool.mjs";

const spec = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const opts = { apiKey: spec.api_key || "none", maxRetries: 0, timeout: 120000 };
const client = new Anthropic({ baseURL: spec.base_url, ...opts });
const out = {};

// each request three ways: create, messages.stream (the SDK's accumulator), create({stream: true}) (raw events)
out.plain = [];
for (const req of spec.plain) {
  const message = await client.messages.create(req);
  const s = client.messages.stream(req);
  let text = "", thinking = "";
  s.on("text", (d) => { text += d; });
  s.on("thinking", (d) => { thinking += d; });
  const final = await s.finalMessage();
  const raw = await client.messages.create({ ...req, stream: true });
  const types = [];
  let rawText = "", rawThinking = "", stop = null, usage = null;
  for await (const e of raw) {
    types.push(e.type);
    if (e.type === "content_block_delta" && e.delta.type === "text_delta") rawText += e.delta.text;
    if (e.type === "content_block_delta" && e.delta.type === "thinking_delta") rawThinking += e.delta.thinking;
    if (e.type === "message_delta") { stop = e.delta.stop_reason; usage = e.usage; }
  }
  out.plain.push({ message, stream: { final, text, thinking },
                   raw: { types, text: rawText, thinking: rawThinking, stop_reason: stop, usage } });
}

out.count = await client.messages.countTokens(spec.count);

// a whole tool round trip: the scripted server (tool_url) answers with tool_use blocks, read by the SDK
// streamed and not; their results go back to the real model, which answers
if (spec.tool_url) {
  const tc = new Anthropic({ baseURL: spec.tool_url, ...opts });
  const first = await tc.messages.create(spec.tool_call);
  const streamed = await tc.messages.stream(spec.tool_call).finalMessage();
  const uses = first.content.filter((b) => b.type === "tool_use");
  const back = [...spec.tool_call.messages, { role: "assistant", content: first.content },
                { role: "user", content: uses.map((b) => ({ type: "tool_result", tool_use_id: b.id,
                                                            content: spec.tool_result })) }];
  const answer = await client.messages.create({ ...spec.tool_call, messages: back,
                                                max_tokens: spec.answer_max_tokens ?? spec.tool_call.max_tokens });
  out.tool_call = { first, streamed, messages: back, answer };
}

// the demo model's own tool loop: lookup_verse declared in Anthropic's shape, the model's tool_use
// answered from the King James Bible (kjv_tool.mjs), its tool_result sent back, the model's answer
if (spec.agent) {
  const tools = [{ name: LOOKUP.function.name, description: LOOKUP.function.description,
                   input_schema: LOOKUP.function.parameters }];
  const req = { ...spec.agent.request, tools, messages: [{ role: "user", content: spec.agent.question }] };
  const first = await client.messages.create(req);
  const streamed = await client.messages.stream(req).finalMessage();
  const kjv = readBible();
  const uses = first.content.filter((b) => b.type === "tool_use");
  const results = uses.map((b) => lookup(kjv, JSON.stringify(b.input)));
  const back = [...req.messages, { role: "assistant", content: first.content },
                { role: "user", content: uses.map((b, i) => ({ type: "tool_result", tool_use_id: b.id,
                                                               content: results[i] })) }];
  const answer = uses.length ? await client.messages.create({ ...req, messages: back }) : null;
  out.agent = { tools, first, streamed, results, messages: back, answer };
}

// errors arrive as the SDK's typed errors
try {
  await client.messages.create(spec.bad);
  out.error = null;
} catch (e) {
  out.error = { status: e.status, name: e.constructor.name, body: e.error ?? null,
                is_bad_request: e instanceof Anthropic.BadRequestError };
}
console.log(JSON.stringify(out));
