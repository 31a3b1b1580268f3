#!/usr/bin/python3
"""The tool-use figures of a checkpoint's pack (docs/MODEL-CARD.md "Tool use"), with serve.agent's
harness (tests/serve/test_serve_agent.py: k3run serve and the openai SDK's tool loop):

    eval_tool.py PACK WORK [--train] [--greedy]

--train: 20 references from the training books instead of the 40 held-out ones (whether the task
is learned at all, apart from copying a name never seen); --greedy: temperature 0 instead of the
model's defaults. Prints each question, the call and whether the answer quotes the verse, then the
figures as JSON; WORK/eval.json keeps every reference and run whole."""
import json, os, random, sys
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "serve"))
sys.path.insert(0, HERE)
os.chdir(os.path.join(HERE, "..", "serve"))
import test_serve_agent as agent, kjv_data, kjv_tools

pack, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
if "--train" in sys.argv:
    tr = kjv_data.train_books(kjv_data.read_bible())
    rnd = random.Random(77)
    refs = []
    for i, k in enumerate(sorted(rnd.sample(range(len(tr)), 20))):
        b, c, v, text = tr[k]
        refs.append({"ref": (b, c, v), "text": text, "q": kjv_tools.ask(rnd, b, c, v), "think": i % 2 == 1})
else:
    refs = agent.references(agent.N_REFS)
got = agent.run_agent(pack, refs, work, dict({"seed": 1}, **({"temperature": 0} if "--greedy" in sys.argv else {})))
for r, g in zip(refs, got):
    print("%-50s call %-55s %s" % (r["q"][:50], g["calls"][0]["arguments"] if g["calls"] else "-",
                                   "quoted" if g["answer"] and r["text"] in g["answer"] else "MISSED"))
with open(os.path.join(work, "eval.json"), "w") as fh:
    json.dump({"refs": refs, "runs": got}, fh, indent=1)
print(json.dumps(agent.figures(refs, got)))
