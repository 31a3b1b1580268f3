// The `openai` SDK over HTTPS (driven by test_serve_door.py; NODE_EXTRA_CA_CERTS trusts the test's
// certificate): one chat completion plain and streamed; prints {"plain", "stream"} (their content).
import fs from "node:fs";
import OpenAI from "openai";

const spec = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const client = new OpenAI({ baseURL: spec.base_url, apiKey: "none", maxRetries: 0, timeout: 60000 });
const r = await client.chat.completions.create(spec.request);
let stream = "";
for await (const c of await client.chat.completions.create({ ...spec.request, stream: true }))
  stream += (c.choices[0] && c.choices[0].delta.content) || "";
console.log(JSON.stringify({ plain: r.choices[0].message.content, stream }));
