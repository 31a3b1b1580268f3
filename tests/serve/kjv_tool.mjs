// lookup_verse, the demo model's tool (docs/MODEL-CARD.md "Tool use"): its declaration, and its
// answers from Debian's King James Bible (the `bible` reader, bible-kjv). agent_client.mjs and
// anthropic_client.mjs use it.
import { execFileSync } from "node:child_process";

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
export function readBible() {
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
export function lookup(kjv, args) {
  let a;
  try { a = JSON.parse(args); } catch { return "error: the arguments are not JSON"; }
  const b = kjv[a.book];
  if (!b) return `error: no book named ${a.book} in the King James Bible`;
  if (!b[a.chapter]) return `error: ${a.book} has no chapter ${a.chapter}`;
  const v = b[a.chapter][a.verse];
  return v ?? `error: ${a.book} ${a.chapter} has no verse ${a.verse}`;
}
