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
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import OpenAI from "openai";

export const LOOKUP = {
  type: "function",
  function: {
    name: "lookup_verse",
    description: "Look up a verse of the King James Bible by its reference.",
    parameters: {
      type: "object",
      properties: {
        book: { type: "string", description: 'The book\'s name as the KJV prints it, e.g. "Ruth", "1 Samuel".' },
        chapter: { type: "integer" },
        verse: { type: "integer" },
      },
      required: ["book", "chapter", "verse"],
    },
  },
};

// The whole KJV as Debian ships it: {book: {chapter: {verse: text}}}.
function readBible() {
  const out = execFileSync("bible", ["-l0", "Gen1:1-Rev22:21"], { env: { ...process.env, COLUMNS: "0" },
                                                                  maxBuffer: 64 << 20 }).toString("utf8");
  const kjv = {};
  let book = null, chap = null;
  for (const line of out.split("\n")) {
    if (!line.trim()) continue;
    if (line.startsWith("  ")) {
      const t = line.trim(), sp = t.indexOf(" ");
      kjv[book][chap][Number(t.slice(0, sp))] = t.slice(sp + 1).trim();
    } else {
      const at = line.lastIndexOf(" ");
      book = line.slice(0, at);
      chap = Number(line.slice(at + 1));
      kjv[book] ??= {};
      kjv[book][chap] = {};
    }
  }
  return kjv;
}

// The tool: a verse's text alone, or what is wrong with the reference.
function lookup(kjv, args) {
  let a;
  try { a = JSON.parse(args); } catch { return "error: the arguments are not JSON"; }
  const b = kjv[a.book];
  if (!b) return `error: no book named ${a.book} in the King James Bible`;
  if (!b[a.chapter]) return `error: ${a.book} has no chapter ${a.chapter}`;
  const v = b[a.chapter][a.verse];
  return v ?? `error: ${a.book} ${a.chapter} has no verse ${a.verse}`;
}

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
