"""Independent pure-Python reference of Kimi's tiktoken tokenizer (K3 spec §6).

This is the test-side oracle for k3's C tokenizer. It re-implements, without
tiktoken, what Kimi's ``tokenization_kimi.py`` does:

  text --(≤400 000-char pieces)--> --(runs of ≤25 000 whitespace / non-whitespace
  chars, Kimi's ``_split_whitespaces_or_nonwhitespaces``)--> [optional split on
  special-token strings] --(PAT_STR findall)--> pre-tokens --(byte-level BPE by
  rank, tiktoken's ``_byte_pair_merge``)--> ids

Ids are ranks; 256 reserved special ids follow the last rank. No BOS is added.
Only the standard library and the ``regex`` module are used.

Bytes that are not UTF-8 (k3's rule, not Kimi's: Kimi's encode() takes str
only). ``Tokenizer.encode_bytes(data)`` encodes any byte string: ``data`` is cut
into maximal runs of valid UTF-8 (RFC 3629: no overlong forms, no surrogates,
nothing above U+10FFFF) and the bytes outside them; each run is encoded on its
own exactly as ``encode(run)`` (chunking included, so the 400 000 / 25 000
counts restart after an invalid byte) and each invalid byte becomes the one id
of its single-byte token. Reading left to right, a valid sequence is taken
whole and a byte where none starts is invalid and taken alone; these are
exactly the bytes Python's "surrogateescape" decoding turns into
U+DC80..U+DCFF. decode(encode_bytes(x)) == x for every x,
and encode_bytes(s.encode()) == encode(s) for every str s. NUL is valid UTF-8
(U+0000) and needs no rule. k3's C tokenizer (k3run/tokenizer_encode.c) does
the same; docs/k3run-tokenizer.md has the details.
"""

import base64
import binascii
import heapq
import json
import os
import shutil

import regex

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TIKTOKEN_MODEL = os.path.join(HERE, "data", "tiktoken.model")

# ---------------------------------------------------------------------------
# Pre-tokenisation
# ---------------------------------------------------------------------------

# Kimi's split pattern, exactly as in the spec: 8 alternatives joined by "|".
# `&&` is class intersection (fancy-regex syntax); the `regex` module supports it
# in V1 mode.
PAT_ALTERNATIVES = (
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
)
PAT_STR = "|".join(PAT_ALTERNATIVES)

# V1 enables `&&` set intersection. V1 also turns on *full* Unicode case folding
# for (?i); Rust's regex (used by tiktoken) does simple case folding, so `(?-f)`
# switches full folding off again. `\s` in `regex` is Unicode White_Space and
# `\p{Han}` is Script=Han, both as in Rust.
PAT = regex.compile("(?-f)" + PAT_STR, flags=regex.V1)

# Kimi's encode() chunking constants.
TIKTOKEN_MAX_ENCODE_CHARS = 400_000
MAX_NO_WHITESPACES_CHARS = 25_000


def pretokenize(text):
    """Split text into pre-tokens with PAT_STR (findall semantics)."""
    return PAT.findall(text)


def split_whitespaces_or_nonwhitespaces(s, max_consecutive_slice_len):
    """Kimi's ``_split_whitespaces_or_nonwhitespaces``, same cut points.

    Cuts ``s`` only inside a run of whitespace (str.isspace) or of
    non-whitespace characters that is longer than the limit; every run inside
    a yielded slice is at most ``max_consecutive_slice_len`` long. An empty
    string yields one empty slice (as the original does).
    """
    current_slice_len = 0
    current_slice_is_space = s[0].isspace() if len(s) > 0 else False
    slice_start = 0
    for i in range(len(s)):
        is_now_space = s[i].isspace()
        if current_slice_is_space ^ is_now_space:
            current_slice_len = 1
            current_slice_is_space = is_now_space
        else:
            current_slice_len += 1
            if current_slice_len > max_consecutive_slice_len:
                yield s[slice_start:i]
                slice_start = i
                current_slice_len = 1
    yield s[slice_start:]


def chunk_text(text, max_chars=None, max_run=None):
    """The chunks Kimi's encode() hands to tiktoken one by one."""
    max_chars = TIKTOKEN_MAX_ENCODE_CHARS if max_chars is None else max_chars
    max_run = MAX_NO_WHITESPACES_CHARS if max_run is None else max_run
    for i in range(0, len(text), max_chars):
        yield from split_whitespaces_or_nonwhitespaces(text[i:i + max_chars], max_run)


def split_utf8_runs(data):
    """Cut bytes into maximal valid UTF-8 runs (yielded as str) and the bytes
    outside them (yielded one by one as int), in order."""
    s = data.decode("utf-8", "surrogateescape")
    run = []
    for ch in s:
        o = ord(ch)
        if 0xDC80 <= o <= 0xDCFF:   # an escaped invalid byte
            if run:
                yield "".join(run)
                run = []
            yield o - 0xDC00
        else:
            run.append(ch)
    if run:
        yield "".join(run)


# ---------------------------------------------------------------------------
# Byte-level BPE by rank
# ---------------------------------------------------------------------------

def bpe_merge(piece, ranks):
    """tiktoken's ``_byte_pair_merge``: returns the ranks of the final parts.

    Starting from single bytes, repeatedly merge the adjacent pair whose
    concatenation has the lowest rank (leftmost on ties) until no adjacent
    concatenation is in ``ranks``. Implemented with a heap and a linked list
    (lazy deletion) so that 25 000-char pieces stay fast; the merge order is
    identical to tiktoken's O(n^2) scan.
    """
    n = len(piece)
    if n == 0:
        return []
    if n == 1:
        return [ranks[piece]]
    # Parts are identified by their start offset; nxt[i] is the end of part i
    # (= start of the next part), prv[i] the start of the previous part.
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    alive = [True] * n
    heap = []

    def push(i):
        j = nxt[i]
        if j >= n:
            return
        r = ranks.get(piece[i:nxt[j]])
        if r is not None:
            heapq.heappush(heap, (r, i, j, nxt[j]))

    for i in range(n - 1):
        push(i)
    while heap:
        r, i, j, k = heapq.heappop(heap)
        # Stale entry: one side has been merged since it was pushed.
        if not alive[i] or not alive[j] or nxt[i] != j or nxt[j] != k:
            continue
        alive[j] = False
        nxt[i] = k
        if k < n:
            prv[k] = i
        if prv[i] >= 0:
            push(prv[i])
        push(i)
    out = []
    i = 0
    while i < n:
        out.append(ranks[piece[i:nxt[i]]])
        i = nxt[i]
    return out


def encode_piece(piece, ranks):
    """One pre-token -> ranks, as tiktoken's ``_encode_native`` does it: a
    pre-token that is itself a token is emitted directly, else BPE-merged."""
    r = ranks.get(piece)
    if r is not None:
        return [r]
    return bpe_merge(piece, ranks)


# ---------------------------------------------------------------------------
# tiktoken.model loading
# ---------------------------------------------------------------------------

def validate_ranks(ranks):
    """Raise ValueError unless ranks are 0..n-1 and all 256 bytes are tokens."""
    seen = {}
    for tok, r in ranks.items():
        if not isinstance(tok, bytes) or len(tok) == 0:
            raise ValueError("token %r is not a non-empty bytes string" % (tok,))
        if not isinstance(r, int) or r < 0:
            raise ValueError("rank %r of token %r is not a non-negative int" % (r, tok))
        if r in seen:
            raise ValueError("duplicate rank %d (tokens %r and %r)" % (r, seen[r], tok))
        seen[r] = tok
    n = len(ranks)
    if n and max(seen) != n - 1:
        missing = min(set(range(n)) - set(seen))
        raise ValueError("ranks are not contiguous: rank %d is missing" % missing)
    for b in range(256):
        if bytes([b]) not in ranks:
            raise ValueError("single byte 0x%02x is not a token" % b)


def load_tiktoken_bpe(path):
    """Strictly parse a tiktoken.model file into {token_bytes: rank}.

    Format: one line per token, ``base64(token_bytes) <space> rank``. Empty
    lines are skipped (as tiktoken does). Raises ValueError on bad base64,
    bad rank, wrong field count, duplicate token or rank, rank gaps, or a
    missing single byte.
    """
    with open(path, "rb") as f:
        data = f.read()
    ranks = {}
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line:
            continue
        fields = line.split(b" ")
        if len(fields) != 2:
            raise ValueError("%s:%d: expected 'base64 rank', got %r" % (path, lineno, line[:80]))
        b64, rank_s = fields
        try:
            tok = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ValueError("%s:%d: bad base64 %r: %s" % (path, lineno, b64[:80], e)) from None
        if not tok:
            raise ValueError("%s:%d: empty token" % (path, lineno))
        if not rank_s.isdigit():
            raise ValueError("%s:%d: bad rank %r" % (path, lineno, rank_s))
        if tok in ranks:
            raise ValueError("%s:%d: duplicate token %r" % (path, lineno, tok))
        ranks[tok] = int(rank_s)
    try:
        validate_ranks(ranks)
    except ValueError as e:
        raise ValueError("%s: %s" % (path, e)) from None
    return ranks


def dump_tiktoken_bpe(ranks):
    """Serialise {token: rank} to tiktoken.model bytes, in rank order."""
    validate_ranks(ranks)
    lines = [base64.b64encode(t) + b" " + str(r).encode()
             for t, r in sorted(ranks.items(), key=lambda kv: kv[1])]
    return b"\n".join(lines) + b"\n"


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------

NUM_RESERVED_SPECIAL_TOKENS = 256


class Tokenizer:
    """Kimi tiktoken tokenizer: BPE ranks + 256 reserved special ids.

    ``named_specials`` maps special id -> content string (from
    ``added_tokens_decoder``); every other id in n_ranks..n_ranks+255 is called
    ``<|reserved_token_{id}|>``.
    """

    def __init__(self, mergeable_ranks, named_specials=None):
        validate_ranks(mergeable_ranks)
        self.ranks = dict(mergeable_ranks)
        self.n_ranks = len(self.ranks)
        self.n_vocab = self.n_ranks + NUM_RESERVED_SPECIAL_TOKENS
        self._id_bytes = [b""] * self.n_ranks
        for tok, r in self.ranks.items():
            self._id_bytes[r] = tok
        named_specials = dict(named_specials or {})
        for i in named_specials:
            if not self.n_ranks <= i < self.n_vocab:
                raise ValueError("special id %d outside the reserved range %d..%d"
                                 % (i, self.n_ranks, self.n_vocab - 1))
        # special_ids: content string -> id (Kimi's ``special_tokens``).
        self.special_ids = {}
        for i in range(self.n_ranks, self.n_vocab):
            name = named_specials.get(i, "<|reserved_token_%d|>" % i)
            if name in self.special_ids:
                raise ValueError("special token %r appears twice" % name)
            self.special_ids[name] = i
        self.special_names = {i: s for s, i in self.special_ids.items()}
        # Longest first, so no special can shadow a longer one sharing its prefix.
        alts = sorted(self.special_ids, key=lambda s: (-len(s), s))
        self._special_re = regex.compile("|".join(regex.escape(s) for s in alts))

    @classmethod
    def from_dir(cls, model_dir):
        """Load ``tiktoken.model`` and ``tokenizer_config.json`` from a model dir."""
        ranks = load_tiktoken_bpe(os.path.join(model_dir, "tiktoken.model"))
        cfg_path = os.path.join(model_dir, "tokenizer_config.json")
        with open(cfg_path, "r", encoding="utf-8") as f:
            cfg = json.load(f)
        named = {}
        for key, entry in cfg.get("added_tokens_decoder", {}).items():
            if not key.isdigit() or not isinstance(entry, dict) or "content" not in entry:
                raise ValueError("%s: bad added_tokens_decoder entry %r" % (cfg_path, key))
            named[int(key)] = entry["content"]
        return cls(ranks, named)

    # -- encoding ----------------------------------------------------------

    def _encode_ordinary(self, text, out):
        for piece in PAT.findall(text):
            out.extend(encode_piece(piece.encode("utf-8"), self.ranks))

    def _encode_chunk(self, chunk, allow_special, out):
        if not allow_special:
            self._encode_ordinary(chunk, out)
            return
        # tiktoken: split on special strings first, pre-tokenise the text between.
        pos = 0
        for m in self._special_re.finditer(chunk):
            self._encode_ordinary(chunk[pos:m.start()], out)
            out.append(self.special_ids[m.group()])
            pos = m.end()
        self._encode_ordinary(chunk[pos:], out)

    def encode(self, text, allow_special=False):
        """Encode ``text`` (str) to ids; never adds BOS/EOS.

        allow_special=False encodes special strings as ordinary text
        (tiktoken ``disallowed_special=()``); True maps them to their ids
        (``allowed_special="all"``). Kimi chunks before looking for specials,
        so a special string cut by a chunk boundary stays ordinary text.
        """
        if not isinstance(text, str):
            raise TypeError("encode() takes str, got %s" % type(text).__name__)
        out = []
        for chunk in chunk_text(text):
            self._encode_chunk(chunk, allow_special, out)
        return out

    def encode_bytes(self, data, allow_special=False):
        """Encode any bytes (see the module docstring): valid UTF-8 runs as
        ``encode(run, allow_special)``, every other byte as its single-byte id."""
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError("encode_bytes() takes bytes, got %s" % type(data).__name__)
        out = []
        for part in split_utf8_runs(bytes(data)):
            if isinstance(part, int):
                out.append(self.ranks[bytes([part])])
            else:
                out.extend(self.encode(part, allow_special))
        return out

    # -- decoding ----------------------------------------------------------

    def id_to_bytes(self, i):
        """Bytes of one id (a special decodes to its content's UTF-8)."""
        if 0 <= i < self.n_ranks:
            return self._id_bytes[i]
        if self.n_ranks <= i < self.n_vocab:
            return self.special_names[i].encode("utf-8")
        raise ValueError("id %r outside 0..%d" % (i, self.n_vocab - 1))

    def decode(self, ids):
        """Concatenated bytes of ``ids`` (may be invalid UTF-8 mid-character)."""
        return b"".join(self.id_to_bytes(i) for i in ids)


# ---------------------------------------------------------------------------
# Test-checkpoint tokenizer files laid out like K3's release
# ---------------------------------------------------------------------------

# Named specials at K3's offsets relative to n_ranks (K3: n_ranks = 163584).
K3_NAMED_SPECIAL_OFFSETS = {
    0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>",
    5: "<|sep|>", 6: "[start_header_id]", 7: "[end_header_id]", 9: "[EOT]",
    18: "<|media_begin|>", 19: "<|media_content|>", 20: "<|media_end|>",
    21: "<|media_pad|>", 65: "<osagent_mode>", 254: "[UNK]", 255: "[PAD]",
}


def k3_tokenizer_config(n_ranks):
    """tokenizer_config.json content (a dict, deterministic order)."""
    added = {}
    for off in sorted(K3_NAMED_SPECIAL_OFFSETS):
        added[str(n_ranks + off)] = {
            "content": K3_NAMED_SPECIAL_OFFSETS[off],
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    cfg = {
        "added_tokens_decoder": added,
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "eos_token": "<|end_of_msg|>",
        "model_max_length": 1048576,
        "pad_token": "[PAD]",
        "tokenizer_class": "TikTokenTokenizer",
        "unk_token": "[UNK]",
    }
    return cfg


def write_tokenizer_files(out_dir, tiktoken_model_path=DEFAULT_TIKTOKEN_MODEL):
    """Copy tiktoken.model into out_dir and write a K3-style tokenizer_config.json.

    Returns the ids the checkpoint generator puts into config.json:
    {"bos_token_id", "eos_token_id", "pad_token_id", "vocab_size"}.
    """
    n_ranks = len(load_tiktoken_bpe(tiktoken_model_path))  # validates the file
    os.makedirs(out_dir, exist_ok=True)
    shutil.copyfile(tiktoken_model_path, os.path.join(out_dir, "tiktoken.model"))
    text = json.dumps(k3_tokenizer_config(n_ranks), indent=2, ensure_ascii=False) + "\n"
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8",
              newline="\n") as f:
        f.write(text)
    return {
        "bos_token_id": n_ranks,
        "eos_token_id": n_ranks + 2,
        "pad_token_id": n_ranks + 255,
        "vocab_size": n_ranks + NUM_RESERVED_SPECIAL_TOKENS,
    }
