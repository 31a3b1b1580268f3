// The official `openai` SDK against `k3run serve` (driven by test_serve_sdk.py).
// Reads the requests from the JSON file argv[2]; prints one JSON document with what the SDK got.
import fs from "node:fs";
import OpenAI from "openai";

const spec = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const client = new OpenAI({ baseURL: spec.base_url, apiKey: spec.api_key || "none", maxRetries: 0, timeout: 120000 });
const out = {};

// one streamed chat completion: its content, reasoning and finish reason
async function streamed(cl, req) {
  const s = await cl.chat.completions.create({ ...req, stream: true });
  let content = "", reasoning = "", finish = null;
  for await (const c of s) {
    const ch = c.choices[0];
    if (!ch) continue;
    content += ch.delta.content || "";
    reasoning += ch.delta.reasoning_content || "";
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  return { content, reasoning, finish };
}

// --parallel: the requests sent at once by as many clients, streamed and not; n = 3; a client that
// leaves mid-stream
if (spec.parallel) {
  const clients = spec.parallel.map(() => new OpenAI({ baseURL: spec.base_url, apiKey: "none", maxRetries: 0,
                                                         timeout: 300000 }));
  const plain = await Promise.all(spec.parallel.map((req, i) => clients[i].chat.completions.create(req)));
  const str = await Promise.all(spec.parallel.map((req, i) => streamed(clients[i], req)));
  out.parallel = plain.map((r, i) => ({ content: r.choices[0].message.content,
                                        reasoning: r.choices[0].message.reasoning_content,
                                        finish: r.choices[0].finish_reason, stream: str[i] }));
  const n3 = await client.chat.completions.create({ ...spec.parallel[0], n: 3, temperature: 0.9, seed: 70 });
  out.n3 = n3.choices.map((c) => ({ index: c.index, content: c.message.content }));
  const ctl = new AbortController();
  const s = await client.chat.completions.create({ ...spec.parallel[0], max_tokens: 900, stream: true },
                                                 { signal: ctl.signal });
  let got = 0;
  try {
    for await (const c of s) { if (++got === 3) ctl.abort(); }
  } catch (e) { out.left = e.constructor.name; }
  console.log(JSON.stringify(out));
  process.exit(0);
}

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

// non-streamed and streamed chat completions of the same requests
out.chat = [];
for (const req of spec.chat) {
  const r = await client.chat.completions.create(req);
  const m = r.choices[0].message;
  const s = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let content = "", reasoning = "", finish = null, usage = null, chunks = 0;
  for await (const c of s) {
    chunks++;
    if (c.usage) usage = c.usage;
    const ch = c.choices[0];
    if (!ch) continue;
    content += ch.delta.content || "";
    reasoning += ch.delta.reasoning_content || "";
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  out.chat.push({ content: m.content, reasoning: m.reasoning_content, finish: r.choices[0].finish_reason,
                  usage: r.usage, stream: { content, reasoning, finish, usage, chunks } });
}

// the same seed twice
const a = await client.chat.completions.create(spec.seeded);
const b = await client.chat.completions.create(spec.seeded);
out.seeded = [a.choices[0].message.content, b.choices[0].message.content];

// a tool round trip: the call and its result go back, the model answers
const t = await client.chat.completions.create(spec.tools);
out.tools = { content: t.choices[0].message.content, usage: t.usage };

// a whole tool round trip: the scripted server (tool_url) answers with a call, the SDK reads it
// (streamed and not), its result goes back to the real model
if (spec.tool_url) {
  const tc = new OpenAI({ baseURL: spec.tool_url, apiKey: "none", maxRetries: 0, timeout: 120000 });
  const first = await tc.chat.completions.create(spec.tool_call);
  const m = first.choices[0].message;
  const st = await tc.chat.completions.create({ ...spec.tool_call, stream: true });
  const deltas = [];
  let finish = null;
  for await (const c of st) {
    const ch = c.choices[0];
    if (!ch) continue;
    if (ch.delta.tool_calls) deltas.push(...ch.delta.tool_calls);
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  const back = [...spec.tool_call.messages, { role: "assistant", content: m.content, tool_calls: m.tool_calls },
                ...m.tool_calls.map((c) => ({ role: "tool", tool_call_id: c.id, content: spec.tool_result }))];
  const answer = await client.chat.completions.create({ ...spec.tool_call, messages: back });
  out.tool_call = { finish: first.choices[0].finish_reason, calls: m.tool_calls, stream: { deltas, finish },
                    messages: back, answer: answer.choices[0].message.content };
}

// a conversation: the second turn is served from the cache
const turn1 = await client.chat.completions.create(spec.turn1);
const msgs = [...spec.turn1.messages, { role: "assistant", content: turn1.choices[0].message.content },
              { role: "user", content: spec.second_question }];
const turn2 = await client.chat.completions.create({ ...spec.turn1, messages: msgs });
out.turns = { first: turn1.usage, second: turn2.usage, messages: msgs, answer: turn2.choices[0].message.content };

// a raw completion
const c = await client.completions.create(spec.completion);
out.completion = c.choices[0].text;

// errors arrive as the SDK's typed errors
try {
  await client.chat.completions.create({ ...spec.seeded, n: 17 });
  out.error = null;
} catch (e) {
  out.error = { status: e.status, message: e.message, name: e.constructor.name };
}
console.log(JSON.stringify(out));
