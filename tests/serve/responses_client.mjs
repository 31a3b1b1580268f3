// The official `openai` SDK's Responses API against `k3run serve` (driven by test_serve_responses.py).
// Reads the requests from the JSON file argv[2]; prints one JSON document with what the SDK got.
import fs from "node:fs";
import OpenAI from "openai";

const spec = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const opts = { apiKey: "none", maxRetries: 0, timeout: 120000 };
const client = new OpenAI({ ...opts, baseURL: spec.base_url });
const out = {};

// a Response as the test compares it: the SDK's output_text, the reasoning, the items' types
function seen(r) {
  const reasoning = r.output.filter((i) => i.type === "reasoning")
    .map((i) => (i.content || []).map((c) => c.text).join("")).join("");
  const text = r.output.filter((i) => i.type === "message")
    .map((i) => i.content.filter((c) => c.type === "output_text").map((c) => c.text).join("")).join("");
  return { id: r.id, status: r.status, incomplete: r.incomplete_details, output_text: r.output_text, text, reasoning,
           types: r.output.map((i) => i.type), calls: r.output.filter((i) => i.type === "function_call"),
           usage: r.usage, output: r.output };
}

// streamed with create({stream: true}): the events' types, the text and reasoning put together
// from the deltas, the last event's Response; then the SDK's own accumulator (responses.stream)
async function streamed(cl, req) {
  const s = await cl.responses.create({ ...req, stream: true });
  const types = [], seqs = [];
  let text = "", reasoning = "", args = "", last = null;
  for await (const e of s) {
    types.push(e.type);
    seqs.push(e.sequence_number);
    if (e.type === "response.output_text.delta") text += e.delta;
    if (e.type === "response.reasoning_text.delta") reasoning += e.delta;
    if (e.type === "response.function_call_arguments.delta") args += e.delta;
    if (e.type === "response.completed" || e.type === "response.incomplete") last = e.response;
  }
  // 4.104.0's accumulator takes the final Response from response.completed only (an incomplete
  // one stays the snapshot its deltas made)
  const helper = await cl.responses.stream(req).finalResponse();
  return { types, seqs, text, reasoning, args, last: seen(last), helper: seen(helper) };
}

async function chat(cl, req) {
  const r = await cl.chat.completions.create(req);
  const m = r.choices[0].message;
  return { content: m.content, reasoning: m.reasoning_content, tool_calls: m.tool_calls, usage: r.usage,
           finish: r.choices[0].finish_reason };
}

// each case: the Response (plain and streamed) and the chat completion of the same request
out.cases = [];
for (const c of spec.cases) {
  out.cases.push({ plain: seen(await client.responses.create(c.req)), stream: await streamed(client, c.req),
                   chat: await chat(client, c.chat) });
}

// a conversation continued with previous_response_id, and the same conversation sent whole
if (spec.conversation) {
  const cv = spec.conversation;
  const r1 = await client.responses.create(cv.first);
  const r2 = await client.responses.create({ ...cv.first, input: cv.second, previous_response_id: r1.id });
  const input = [{ role: "user", content: cv.first.input }, ...r1.output, { role: "user", content: cv.second }];
  const whole = await client.responses.create({ ...cv.first, input });
  const got = await client.responses.retrieve(r1.id);
  out.conversation = { first: seen(r1), second: seen(r2), whole: seen(whole), retrieved: seen(got) };
}

// a function call round trip: the scripted server (tool_url) answers with a call (plain and
// streamed); the call and its output go back to the real model, with the items as the SDK gave them
if (spec.tool) {
  const tc = new OpenAI({ ...opts, baseURL: spec.tool_url });
  const t = spec.tool;
  const first = await tc.responses.create(t.req);
  const st = await streamed(tc, t.req);
  const call = first.output.find((i) => i.type === "function_call");
  const back = [{ role: "user", content: t.req.input }, call,
                { type: "function_call_output", call_id: call.call_id, output: t.result }];
  const answer = await client.responses.create({ ...t.req, input: back });
  // on the scripted server, the output continues the stored call (its call_id is the stored one)
  const cont = await tc.responses.create({ ...t.req, previous_response_id: first.id,
                                           input: [{ type: "function_call_output", call_id: call.call_id,
                                                     output: t.result }] });
  const contWhole = await tc.responses.create({ ...t.req, input: back });
  out.tool = { first: seen(first), stream: st, answer: seen(answer), back, cont: seen(cont),
               cont_whole: seen(contWhole) };
}

// errors arrive as the SDK's typed errors
out.errors = [];
for (const req of spec.errors || []) {
  try {
    await client.responses.create(req);
    out.errors.push(null);
  } catch (e) {
    out.errors.push({ status: e.status, message: e.message, name: e.constructor.name });
  }
}
console.log(JSON.stringify(out));
