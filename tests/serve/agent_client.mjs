// A tool loop over the OpenAI API, as an agent runs one: the model is offered `lookup_verse`,
// its call is answered from Debian's King James Bible (the `bible` reader, bible-kjv), and the
// result goes back until the model answers. scripts/demo.sh --agent and test_serve_agent.py.
//
//   node agent_client.mjs BASE_URL QUESTION...        the loop for each question, shown as it goes
//   node agent_client.mjs BASE_URL --json SPEC.json   the loops of SPEC's questions, one JSON document
//
// SPEC: {"questions": [{"q": text, "think": true|false}], "request": {extra request fields}}.
// Per question the document holds the calls made (name, arguments), what the tool returned, the
// final answer and its finish reason.
import fs from "node:fs";
import OpenAI from "openai";
import { LOOKUP, lookup, readBible } from "./kjv_tool.mjs";

async function loop(client, kjv, q, think, extra, show) {
  const messages = [{ role: "user", content: q }];
  const rec = { q, think, calls: [], results: [], answer: null, finish: null, reasoning: [] };
  for (let turn = 0; turn < 3; turn++) {
    const r = await client.chat.completions.create({
      model: "k3", messages, tools: [LOOKUP], max_tokens: 256, ...(think ? {} : { reasoning_effort: "none" }),
      ...extra });
    const m = r.choices[0].message;
    rec.reasoning.push(m.reasoning_content || "");
    rec.finish = r.choices[0].finish_reason;
    if (show && m.reasoning_content) console.log(`\x1b[2m(thinks) ${m.reasoning_content}\x1b[0m`);
    if (!m.tool_calls || !m.tool_calls.length) {
      rec.answer = m.content;
      if (show) console.log(`assistant: ${m.content}\n(finish_reason: ${rec.finish})`);
      return rec;
    }
    messages.push(m);
    for (const c of m.tool_calls) {
      const out = lookup(kjv, c.function.arguments);
      rec.calls.push({ name: c.function.name, arguments: c.function.arguments });
      rec.results.push(out);
      if (show) console.log(`call: ${c.function.name}(${c.function.arguments})\ntool: ${out}`);
      messages.push({ role: "tool", tool_call_id: c.id, content: c.function.name === "lookup_verse" ? out :
                      `error: no tool named ${c.function.name}` });
    }
  }
  return rec;
}

const [base, ...rest] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: process.env.K3_API_KEY || "none", maxRetries: 0,
                            timeout: 600000 });
const kjv = readBible();
if (rest[0] === "--json") {
  const spec = JSON.parse(fs.readFileSync(rest[1], "utf8"));
  const out = [];
  for (const x of spec.questions) out.push(await loop(client, kjv, x.q, x.think, spec.request || {}, false));
  console.log(JSON.stringify(out));
} else {
  for (const q of rest) {
    console.log(`\nuser: ${q}`);
    await loop(client, kjv, q, false, {}, true);
  }
}
