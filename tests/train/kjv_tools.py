"""The demo model's tool conversations: look a verse up with `lookup_verse`, then quote it.

    tool_conversations(verses, n, seed) -> [request]

Each request is one OpenAI-style chat request as k3run serve receives it (`messages`,
`tools`, `options`), rendered for training by the reference renderer tests/reference/xtml.py
with add_generation_prompt off, so the training ids are exactly the prompt the server renders
for the same conversation followed by the answer the model should give.

A conversation: the tools declared (lookup_verse, its description drawn from several, beside
0-3 other tools in a random order), maybe a system prompt, the user asking for a verse in
words of many kinds, the assistant calling lookup_verse(book, chapter, verse) (thinking on
or off), the tool message with the verse's text alone, and the assistant quoting it. A tenth
ask for a book the King James Bible does not have: the tool says so and the assistant says
so; that teaches copying a book name the model never saw into the call (the held-out books
Ruth, Jonah and Jude are such names). A tenth of the conversations declare the tools and ask
something the tool is not for (where a verse stands, what follows it): answered directly.

Only the training verses (kjv_data.train_books) are ever used; the held-out books appear in
nothing made here.
"""

import json
import random
import re

LOOKUP_DESCRIPTIONS = [
    "Look up a verse of the King James Bible by its reference.",
    "Return the text of one verse of the King James Version.",
    "Fetch a Bible verse (KJV) given the book, chapter and verse.",
    "Get the exact words of a verse from the King James Bible.",
    "Find a verse by reference and return its text.",
    "Retrieve one verse of scripture, King James Version.",
]
BOOK_DESCRIPTIONS = [
    'The book\'s name as the KJV prints it, e.g. "Ruth", "1 Samuel".',
    "The name of the book, e.g. Genesis or 1 Kings.",
    "Book of the Bible.",
    None,
]
OTHER_TOOLS = [
    ("get_weather", "Get the current weather in a city.",
     {"city": {"type": "string", "description": "The city's name."}}, ["city"]),
    ("search_text", "Search the Bible for verses containing a phrase.",
     {"query": {"type": "string"}, "limit": {"type": "integer"}}, ["query"]),
    ("count_words", "Count the words of a text.", {"text": {"type": "string"}}, ["text"]),
    ("get_time", "The current time in a time zone.", {"timezone": {"type": "string"}}, ["timezone"]),
    ("list_chapters", "How many chapters a book of the Bible has.",
     {"book": {"type": "string"}}, ["book"]),
    ("define_word", "Define an English word.", {"word": {"type": "string"}}, ["word"]),
    ("send_email", "Send an email.",
     {"to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
     ["to", "subject", "body"]),
]
NO_SUCH_BOOKS = ["Tobit", "Judith", "Baruch", "Sirach", "Enoch", "Jasher", "Maccabees", "Susanna",
                 "Wisdom", "Esdras", "Manasseh", "Thomas", "Barnabas", "Hermas", "Clement", "Ignatius",
                 "Polycarp", "Didache", "Jubilees", "Adam", "Seth", "Noah", "Abraham", "Isaac", "Jacob",
                 "Moses", "Aaron", "Gideon", "Boaz", "Naomi", "Orpah", "Elijah", "Elisha", "Nathan",
                 "Gad", "Asher", "Dan", "Levi", "Reuben", "Simeon", "Zebulun", "Naphtali", "Benjamin",
                 "Miriam", "Deborah", "Hannah", "Samson", "Eli", "Saul", "Absalom", "Solomon", "Rehoboam",
                 "Hezekiah", "Josiah", "Zerubbabel", "Mordecai", "Lazarus", "Martha", "Mary", "Stephen",
                 "Barnabas", "Silas", "Apollos", "Priscilla", "Lydia", "Onesimus", "Tychicus", "Gamaliel"]

ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
        "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
ORD = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
       "nine": "ninth", "twelve": "twelfth"}
PREFIX_WORDS = {"1": "First", "2": "Second", "3": "Third"}


def cardinal(n):
    if n < 20:
        return ONES[n]
    t, o = divmod(n, 10)
    return TENS[t] + ("-" + ONES[o] if o else "")


def ordinal(n):
    w = cardinal(n)
    head, _, last = w.rpartition("-")
    if last in ORD:
        last = ORD[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return (head + "-" if head else "") + last


def book_said(rnd, b):
    """The book as a user might say it: as printed, or "First Samuel" for "1 Samuel"."""
    n, _, rest = b.partition(" ")
    if n in PREFIX_WORDS and rest and rnd.random() < 0.3:
        return PREFIX_WORDS[n] + " " + rest
    return b


def ask(rnd, said, c, v):
    """The user's request for verse v of chapter c of a book, in one of many phrasings."""
    k = rnd.randrange(12)
    words = c < 100 and v < 100 and rnd.random() < 0.5
    cw, vw = (cardinal(c), cardinal(v)) if words else (str(c), str(v))
    vo = ordinal(v) if words else "%d%s" % (v, "th" if 10 <= v % 100 <= 20 else
                                            {1: "st", 2: "nd", 3: "rd"}.get(v % 10, "th"))
    forms = [
        "Look up %s %d:%d." % (said, c, v),
        "What does %s %d:%d say?" % (said, c, v),
        "Quote %s %d:%d for me." % (said, c, v),
        "%s %d:%d, please." % (said, c, v),
        "Can you find %s chapter %s verse %s?" % (said, cw, vw),
        "What is verse %s of %s chapter %s?" % (vw, said, cw),
        "In %s, chapter %s, what does verse %s say?" % (said, cw, vw),
        "Read me the %s verse of chapter %s of %s." % (vo, cw, said),
        "I need the text of %s %d:%d." % (said, c, v),
        "Please look up chapter %s, verse %s of the book of %s." % (cw, vw, said),
        "What are the words of %s %d:%d in the King James Bible?" % (said, c, v),
        "Give me %s %s:%s." % (said, c, v),
    ]
    return forms[k]


def tool_schema(name, desc, props, required):
    return {"type": "function", "function": {"name": name, "description": desc,
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": required}}}


def lookup_tool(rnd):
    bd = rnd.choice(BOOK_DESCRIPTIONS)
    book = {"type": "string"}
    if bd:
        book["description"] = bd
    props = {"book": book, "chapter": {"type": "integer"}, "verse": {"type": "integer"}}
    if rnd.random() < 0.5:
        props["chapter"]["description"] = "The chapter number."
        props["verse"]["description"] = "The verse number."
    return tool_schema("lookup_verse", rnd.choice(LOOKUP_DESCRIPTIONS), props, ["book", "chapter", "verse"])


def tools_list(rnd, others=3):
    tools = [lookup_tool(rnd)] + [tool_schema(*t) for t in rnd.sample(OTHER_TOOLS, rnd.randrange(others + 1))]
    rnd.shuffle(tools)
    return tools


QUOTES = ['%s', '"%s"', '%s says: "%s"', 'It reads: %s']
SYSTEMS = ["You answer with verses of the King James Bible.", "Use the tools to look verses up.",
           "You are a helpful assistant.", "Answer briefly."]


def quote(rnd, refs, text):
    k = rnd.randrange(len(QUOTES))
    return QUOTES[k] % ((refs, text) if k == 2 else (text,))


SYLLABLES = ["ka", "lo", "mir", "ta", "zen", "dor", "el", "ba", "shu", "ri", "nat", "om", "pe", "gal",
             "vu", "hes", "ar", "qu", "isk", "mo", "ten", "yab", "ul", "cor", "fi", "drem", "os", "wen"]


def invented_names(verses, heldout=("Ruth", "Jonah", "Jude")):
    """Book names the King James Bible lacks: the proper names of the given (training) verses that
    are no book's name (words always written capitalised: "Hazor", "Abimelech"), none sharing its
    first three letters with a held-out book (so nothing made here hints at Ruth, Jonah or Jude)."""
    caps, low = set(), set()
    for _, _, _, t in verses:
        for w in re.findall(r"[A-Za-z]+", t):
            (caps if w[0].isupper() else low).add(w if w[0].isupper() else w)
    books = {w for b, _, _, _ in verses for w in b.split()}
    bad = tuple(h[:3] for h in heldout)
    return sorted(w for w in caps if len(w) >= 3 and w.lower() not in low and w.isalpha()
                  and w not in books and not w.startswith(bad) and not w.isupper())


def invented(rnd, names):
    """A made-up book's name: a proper name of the Bible, or syllables never seen as one word, maybe
    numbered ("2 Hazor") or of two words."""
    k = rnd.random()
    if k < 0.5:
        n = rnd.choice(names)
    else:
        n = "".join(rnd.choice(SYLLABLES) for _ in range(rnd.randint(2, 3))).capitalize()
    if k > 0.9:
        n = rnd.choice(names) + " " + n
    if rnd.random() < 0.15:
        n = rnd.choice("123") + " " + n
    return n


def spliced(rnd, verses, like):
    """A verse no book holds: runs of 2 to 6 words cut from random verses and joined until it is as
    long as the verse `like`, starting with a capital letter. Nothing remembered predicts it past
    its runs, so only copying it from the tool's answer quotes it."""
    want, out = len(like.split()), []
    while len(out) < want:
        w = verses[rnd.randrange(len(verses))][3].split()
        k = rnd.randint(2, 6)
        i = rnd.randrange(max(1, len(w) - k + 1))
        out += w[i:i + k]
    out = out[:max(want, 3)]
    out[0] = out[0][:1].upper() + out[0][1:]
    return " ".join(out)


def tool_conversations(verses, n, seed, invent=0.0, others=3, splice=False):
    """n chat requests (dict: messages, tools, options) about the given (training) verses.

    invent: the share that ask for a verse of a book the KJV lacks (a name from invented()) that the
    tool answers with the text of another verse, picked at random: nothing the model remembers
    gives that call or that quote, only copying them from the question and the tool's answer does.
    others: at most this many other tools declared beside lookup_verse.
    splice: the tool answers every lookup with spliced() text instead of the verse."""
    rnd = random.Random(seed)
    names = invented_names(verses) if invent else []
    out = []
    for i in range(n):
        tools = tools_list(rnd, others)
        msgs = []
        if rnd.random() < 0.2:
            msgs.append({"role": "system", "content": rnd.choice(SYSTEMS)})
        thinking = rnd.random() < 0.4
        kind = rnd.random()
        b, c, v, t = verses[rnd.randrange(len(verses))]
        made_up = invent and kind >= 1 - invent
        if made_up:
            b, c, v = invented(rnd, names), rnd.randint(1, 60), rnd.randint(1, 50)
        if kind < 0.1 * (1 - invent):
            # what the tool is not for: answered directly
            msgs.append({"role": "user", "content": "Where is this written? %s" % t})
            a = {"role": "assistant", "content": "It is %s %d:%d." % (b, c, v)}
            if thinking:
                a["reasoning_content"] = "These words are from the book of %s." % b
            msgs.append(a)
        else:
            missing = kind < 0.2 * (1 - invent)
            if missing:
                b = rnd.choice(NO_SUCH_BOOKS)
                said = b
            elif made_up:
                said = b
            else:
                said = book_said(rnd, b)
            msgs.append({"role": "user", "content": ask(rnd, said, c, v)})
            args = json.dumps({"book": b, "chapter": c, "verse": v})
            call_id = "call_%d" % rnd.randrange(10 ** 6)
            a = {"role": "assistant", "content": "",
                 "tool_calls": [{"id": call_id, "type": "function",
                                 "function": {"name": "lookup_verse", "arguments": args}}]}
            if thinking:
                a["reasoning_content"] = "The user asks for %s %d:%d. I look it up." % (b, c, v)
            msgs.append(a)
            refs = "%s %d:%d" % (b, c, v)
            if missing:
                result = "error: no book named %s in the King James Bible" % b
                answer = "The King James Bible has no book named %s." % b
            else:
                if splice:
                    t = spliced(rnd, verses, t)
                result, answer = t, quote(rnd, refs, t)
            msgs.append({"role": "tool", "tool_call_id": call_id, "content": result})
            a2 = {"role": "assistant", "content": answer}
            if thinking:
                a2["reasoning_content"] = ("The tool returned the verse." if not missing else
                                           "The tool found no such book.")
            msgs.append(a2)
        opts = {"thinking": thinking, "add_generation_prompt": False}
        if thinking:
            opts["thinking_effort"] = rnd.choice(["max", "max", "high", "low", None])
        out.append({"messages": msgs, "tools": tools, "options": opts})
    return out
