#!/usr/bin/python3
"""k3ref: run the NumPy reference of Kimi K3 on a checkpoint directory.

  k3ref.py --model DIR (--prompt TEXT | --ids 1,2,3) --n N [--dump FILE] [--f64 | --bf16]
           [--print-ids] [--stats] [--mla-absorb] [--kda-chunk C] [--expert-cache-mb MB]

Greedy generation (argmax, lowest id on ties); stdout gets ONLY the generated text, as raw
decoded bytes (as k3run prints it, so the two compare byte for byte), or with --print-ids the
generated ids on one line. eos (text_config eos_token_id) stops generation; it is listed by
--print-ids but not printed as text. The prompt is tokenised with the Kimi tokenizer
(tests/reference/kimi_tokenizer.py), specials disallowed, no BOS added.

--dump FILE writes a safetensors file with every processed position (prompt + generated
tokens fed back; the last generated token is not processed): see README.md "Dump format".
--stats prints to stderr: hidden-state RMS per layer, SiTU gate range, routing use and the
smallest top-k selection margin, the logit top-1/top-2 gap, and (fp32 mode) the error of
the same run in f64 (router scores and per-layer states).
"""

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from k3model import Model, generate            # noqa: E402
from safetensors_io import write_safetensors   # noqa: E402

DUMP_FORMAT, DUMP_VERSION = "k3ref-dump", "1"


def dump_tensors(rec):
    """(name, dtype, shape, array) list of a concatenated record (all floats as F32)."""
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)          # noqa: E731
    out = [("ids", "I32", list(rec["ids"].shape), rec["ids"].astype(np.int32)),
           ("logits", "F32", list(rec["logits"].shape), f32(rec["logits"])),
           ("final_hidden", "F32", list(rec["final_hidden"].shape), f32(rec["final_hidden"]))]
    for i, L in enumerate(rec["layers"]):
        for key in ("attn_out", "ffn_out", "out"):
            out.append(("layers.%d.%s" % (i, key), "F32", list(L[key].shape), f32(L[key])))
        if "experts" in L:
            out.append(("layers.%d.experts" % i, "I32", list(L["experts"].shape), L["experts"].astype(np.int32)))
            out.append(("layers.%d.expert_weights" % i, "F32", list(L["expert_weights"].shape),
                        f32(L["expert_weights"])))
            out.append(("layers.%d.expert_margin" % i, "F32", list(L["margin"].shape), f32(L["margin"])))
    return out


def write_dump(path, rec, model, prompt_ids, gen):
    meta = {"format": DUMP_FORMAT, "version": DUMP_VERSION, "model": os.path.abspath(model.model_dir),
            "mode": model.mode, "prompt_ids": ",".join(map(str, prompt_ids)),
            "generated_ids": ",".join(map(str, gen)), "n_prompt": str(len(prompt_ids)),
            "n_positions": str(len(rec["ids"])), "mla": "absorbed" if model.mla_absorb else "expanded",
            "kda": "chunk%d" % model.kda_chunk if model.kda_chunk else "recurrent"}
    write_safetensors(path, dump_tensors(rec), meta)


def rel_err(a, b):
    """max |a-b| / max |b| (scale-relative error of a against reference b)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def routing_stats(model, rec):
    """Per MoE layer: (layer, experts used, min margin, argmin position); and overall."""
    rows = []
    for i, L in enumerate(rec["layers"]):
        if "experts" in L:
            m = L["margin"]
            rows.append((i, len(np.unique(L["experts"])), float(m.min()), int(m.argmin())))
    return rows


def print_stats(model, rec, prompt_ids, log):
    c = model.cfg
    T = len(rec["ids"])
    log("positions %d (prompt %d), mode %s" % (T, len(prompt_ids), model.mode))
    log("layer kind  rms(attn)  rms(ffn)   rms(out)  experts-used  min-margin")
    rms = lambda a: float(np.sqrt(np.mean(np.asarray(a, np.float64) ** 2)))   # noqa: E731
    for i, L in enumerate(rec["layers"]):
        kind = ("KDA" if c.is_kda(i) else "MLA") + ("+MoE" if c.is_moe(i) else "+FFN")
        extra = ""
        if "experts" in L:
            extra = "%4d/%-4d     %.3e" % (len(np.unique(L["experts"])), c.E, float(L["margin"].min()))
        log("%3d %-8s %9.3f %9.3f %9.3f   %s" % (i, kind, rms(L["attn_out"]), rms(L["ffn_out"]), rms(L["out"]), extra))
    log("final_hidden rms %.3f" % rms(rec["final_hidden"]))
    g = model.glu_stats
    log("SiTU gate |g|: max %.2f, fraction > beta(%.0f): %.2e, fraction > beta/2: %.2e"
        % (g["max"], c.beta, g["sat"] / max(g["n"], 1), g["half"] / max(g["n"], 1)))
    rs = routing_stats(model, rec)
    if rs:
        mins = min(rs, key=lambda r: r[2])
        log("routing: min top-k margin %.3e (layer %d, position %d); median of per-layer minima %.3e"
            % (mins[2], mins[0], mins[3], float(np.median([r[2] for r in rs]))))
        log("routing: experts used per layer min %d / %d" % (min(r[1] for r in rs), c.E))
    lg = np.sort(np.asarray(rec["logits"], np.float64), axis=-1)
    gap = lg[:, -1] - lg[:, -2]
    log("logits: std %.3f, min top1-top2 gap %.3e (position %d)" % (float(np.std(lg)), float(gap.min()),
                                                                  int(gap.argmin())))


def compare_f64(model, rec, log):
    """Re-run the same positions in f64 (prefill at once) and report fp32 error."""
    m64 = Model(model.model_dir, mode="f64", mla_absorb=model.mla_absorb, kda_chunk=model.kda_chunk)
    r64 = m64.forward(rec["ids"], m64.new_state())
    worst = 0.0
    log("fp32 vs f64 (same ids): layer  rel-err(out)  max|d sel|  flips")
    for i, (a, b) in enumerate(zip(rec["layers"], r64["layers"])):
        line = "%3d  %.2e" % (i, rel_err(a["out"], b["out"]))
        if "sel" in a:
            d = float(np.abs(a["sel"].astype(np.float64) - b["sel"]).max())
            worst = max(worst, d)
            flips = int((np.sort(a["experts"], 1) != np.sort(b["experts"], 1)).any(1).sum())
            line += "  %.2e  %d" % (d, flips)
        log(line)
    log("fp32 vs f64: logits rel-err %.2e, max |d biased score| %.2e" % (rel_err(rec["logits"], r64["logits"]), worst))
    return r64


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt")
    g.add_argument("--ids")
    ap.add_argument("--n", type=int, required=True, help="tokens to generate")
    ap.add_argument("--dump")
    mg = ap.add_mutually_exclusive_group()
    mg.add_argument("--f64", action="store_true")
    mg.add_argument("--bf16", action="store_true")
    ap.add_argument("--print-ids", action="store_true")
    ap.add_argument("--stats", action="store_true")
    ap.add_argument("--mla-absorb", action="store_true", help="absorbed MLA form (default: expanded K/V)")
    ap.add_argument("--kda-chunk", type=int, default=0, help="chunked WY KDA with this chunk (default: recurrent)")
    ap.add_argument("--expert-cache-mb", type=int, default=1024)
    return ap.parse_args(argv)


def main(argv=None):
    a = parse_args(argv)
    log = lambda s: print(s, file=sys.stderr)                           # noqa: E731
    mode = "f64" if a.f64 else "bf16" if a.bf16 else "fp32"
    t0 = time.time()
    model = Model(a.model, mode=mode, mla_absorb=a.mla_absorb, kda_chunk=a.kda_chunk or None,
                  expert_cache_mb=a.expert_cache_mb)
    tok = None
    if a.prompt is not None:
        from kimi_tokenizer import Tokenizer
        tok = Tokenizer.from_dir(a.model)
        prompt_ids = tok.encode(a.prompt)
    else:
        prompt_ids = [int(x) for x in a.ids.split(",") if x.strip()]
    if not prompt_ids:
        log("k3ref: empty prompt")
        return 2
    gen, rec = generate(model, prompt_ids, a.n, model.cfg.eos)
    if a.print_ids:
        sys.stdout.write(" ".join(map(str, gen)) + "\n")
    else:
        if tok is None:
            from kimi_tokenizer import Tokenizer
            tok = Tokenizer.from_dir(a.model)
        sys.stdout.flush()
        sys.stdout.buffer.write(tok.decode([t for t in gen if t != model.cfg.eos]))
    sys.stdout.flush()
    if a.dump:
        write_dump(a.dump, rec, model, prompt_ids, gen)
    if a.stats:
        log("k3ref: %d prompt + %d generated tokens in %.2f s (%d expert loads)"
            % (len(prompt_ids), len(gen), time.time() - t0, model.w.expert_loads))
        print_stats(model, rec, prompt_ids, log)
        if mode == "fp32":
            compare_f64(model, rec, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
