"""The ten worked examples of spec/CHAT-FORMAT.md §13 (exact outputs of the official code),
read straight out of the spec: (i) tests/reference/xtml.py gives exactly their pieces;
(ii) `k3run --tokenizer tests/models/k3-kjv --render-chat case.json --json` gives the same
pieces and the same ids as xtml.py + kimi_tokenizer.py on the test vocabulary (the spec's
ids 163586.. are K3's; the controls are looked up by name, 3842.. here)."""

import json
import re
import unittest

import chatlib
import xtml

_CASE = re.compile(r"### (13\.\d+)\. ([^\n]*)\n\nInput:\n```json\n(.*?)\n```\nPieces:\n```\n(.*?)\n```", re.S)
_PIECE = re.compile(r'\s*(?:\[(\S+) (\d+)\]|("(?:[^"\\]|\\.)*"))')
K3_IDS = {"<|end_of_msg|>": 163586, "<|open|>": 163587, "<|close|>": 163588, "<|sep|>": 163589}


def parse_pieces(block, specials):
    """A "Pieces:" block -> [int | str]: [NAME ID] is the control NAME (its id in SPECIALS),
    "..." a JSON string."""
    out, pos, block = [], 0, block.strip()
    while pos < len(block):
        m = _PIECE.match(block, pos)
        if not m:
            raise ValueError("unparsable pieces at %r" % block[pos:pos + 60])
        pos = m.end()
        if m.group(1):
            if K3_IDS.get(m.group(1)) != int(m.group(2)):
                raise ValueError("[%s %s] is not K3's id" % (m.group(1), m.group(2)))
            out.append(specials[m.group(1)])
        else:
            out.append(json.loads(m.group(3)))
        if pos < len(block) and block[pos] not in " \n":
            raise ValueError("no space after a piece at %r" % block[pos:pos + 60])
    return out


def worked_examples():
    path = chatlib.spec_path()
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        text = f.read()
    sec = text.split("## 13. Worked examples", 1)[1].split("\n## Appendix", 1)[0]
    return [(num, title, inp, pcs) for num, title, inp, pcs in _CASE.findall(sec)]


class WorkedExamples(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cases = worked_examples()
        if cls.cases is None:
            raise unittest.SkipTest("spec/CHAT-FORMAT.md not found (set K3_SHARED)")
        cls.tok = chatlib.tokenizer()

    def test_ten_examples_found(self):
        self.assertEqual([c[0] for c in self.cases], ["13.%d" % i for i in range(1, 11)])

    def test_xtml_pieces(self):
        for num, title, inp, pcs in self.cases:
            with self.subTest(example=num, title=title):
                want = parse_pieces(pcs, self.tok.special_ids)
                got = xtml.pieces(json.loads(inp), self.tok.special_ids)
                self.assertEqual(got, want)

    def test_k3run(self):
        if not chatlib.have_k3run():
            self.fail("%s is missing or has no --render-chat (build it first)" % chatlib.K3RUN)
        for num, title, inp, pcs in self.cases:
            with self.subTest(example=num, title=title):
                doc = chatlib.compare(self, inp, "§" + num)
                # and directly against the spec's piece list
                want = parse_pieces(pcs, self.tok.special_ids)
                got = [p["id"] if "special" in p else p["text"] for p in doc["pieces"]]
                self.assertEqual(got, want, "§%s: k3run's pieces are not the spec's" % num)


if __name__ == "__main__":
    unittest.main()
