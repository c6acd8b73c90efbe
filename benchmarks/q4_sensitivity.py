"""Where Q4_0 loses perplexity on SmolLM2-135M, and which Q4_0 scale choice loses least.

    python benchmarks/q4_sensitivity.py                 # every table (eager PyTorch, a few minutes)
    python benchmarks/q4_sensitivity.py --tables kinds  # one table: kinds | scales | grid | gguf

Eager PyTorch with fake-quantized weights (each weight replaced by its dequantized Q4_0 blocks,
activations float): the "ppl graph" column of ``quant_accuracy.py``, which tracks onert within
~1 % (ggml's activation rounding adds the rest). Text: 512 tokens of ``execmodel``; importance
statistics (``imatrix``) come from the calibration topics, never from the evaluation text.

Tables:

- **gguf**: the checkpoint's own tensor types (the GGUF is "Q4_1": which tensors really are).
- **kinds**: perplexity when only one kind of tensor is Q4_0 (the rest float), per kind: the
  tied table as embedding / as lm_head, q/k/v/o, gate/up/down, the first/last two layers.
- **scales**: the whole model Q4_0 (tied table included) with each per-block scale rule:
  ``plain`` (ggml's reference ``d = m / -8``), ``search`` (circle_fx's, ``quant/ggml.py``),
  ``fine`` (the search ``QuantConfig(importance=...)`` runs, 42 candidate scales per block and two
  least-squares refits, with flat weights), and that search minimising a *weighted* squared error: ``gamma`` (weights = the preceding RMSNorm's gamma², data-free, for the
  linears that read a norm: q/k/v, gate/up, lm_head) and ``imatrix`` (weights = mean x² of each
  input column over the calibration texts, every linear: llama.cpp's importance matrix idea).
- **grid**: does re-quantizing the checkpoint's Q4_1 grid (16 levels ``m + q * d`` per block of 32)
  cost more than quantizing continuous weights? The weights "de-gridded" by uniform noise of one
  Q4_1 step (what Q4_1 rounding removed), then Q4_0 of each; compares the perplexity *increase*.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

BLOCK = 32


def q4_circle_fx(w: np.ndarray, search: bool, importance: np.ndarray | None = None) -> np.ndarray:
    """``w`` through circle_fx's own Q4_0 packing (``quant/ggml.py``: ggml's plain scale, the
    search, or the importance-weighted search), dequantized."""
    from circle_fx.circle.ggml import Q4_0, dequantize
    from circle_fx.quant.ggml import pack

    blocks, _, _ = pack(torch.from_numpy(np.ascontiguousarray(w)), Q4_0, search=search, importance=importance)
    return dequantize(Q4_0, blocks.numpy(), w.shape)


class Bench:
    def __init__(self, tokens: int):
        import checkpoint

        self.ck = checkpoint
        self.model = checkpoint.load_model()
        m = self.model
        # untie so the table's two uses can differ (the tied file stores one table: "both")
        m.lm_head.weight = torch.nn.Parameter(m.model.embed_tokens.weight.detach().clone())
        self.ids = checkpoint.eval_ids(tokens)
        self.orig = {n: p.detach().clone() for n, p in m.named_parameters() if p.dim() == 2}
        with torch.no_grad():
            self.ref = m(self.ids, use_cache=False).logits
        self.float_ppl = checkpoint.perplexity(self.ref, self.ids)
        self.params = dict(m.named_parameters())
        self._imatrix = None

    def ppl(self, new: dict) -> tuple[float, float]:
        with torch.no_grad():
            for n, t in new.items():
                self.params[n].copy_(torch.as_tensor(t))
            lg = self.model(self.ids, use_cache=False).logits
            for n in new:
                self.params[n].copy_(self.orig[n])
        return self.ck.perplexity(lg, self.ids), self.ck.top1_agreement(lg.numpy(), self.ref.numpy())

    def gamma(self, name: str) -> np.ndarray | None:
        """gamma² of the RMSNorm whose output this linear reads (None: not a norm's reader)."""
        m = self.model
        if name == "lm_head.weight":
            return m.model.norm.weight.detach().numpy() ** 2
        parts = name.split(".")
        if parts[:2] == ["model", "layers"]:
            layer = m.model.layers[int(parts[2])]
            if parts[4] in ("q_proj", "k_proj", "v_proj"):
                return layer.input_layernorm.weight.detach().numpy() ** 2
            if parts[4] in ("gate_proj", "up_proj"):
                return layer.post_attention_layernorm.weight.detach().numpy() ** 2
        return None

    def imatrix(self) -> dict:
        """Mean x² per input column of every linear over the calibration texts."""
        if self._imatrix is None:
            acc, hooks = {}, []
            for name, mod in self.model.named_modules():
                if isinstance(mod, torch.nn.Linear):
                    def hook(mod, inp, out, key=name + ".weight"):
                        x = inp[0].detach().reshape(-1, inp[0].shape[-1])
                        s, n = acc.get(key, (0, 0))
                        acc[key] = (s + (x * x).sum(0), n + x.shape[0])
                    hooks.append(mod.register_forward_hook(hook))
            with torch.no_grad():
                for c in self.ck.calibration_ids(512):
                    self.model(c, use_cache=False)
            for h in hooks:
                h.remove()
            self._imatrix = {k: (s / n).numpy() for k, (s, n) in acc.items()}
        return self._imatrix

    def quantized(self, rule: str, names=None) -> dict:
        names = names or [n for n in self.orig if n != "model.embed_tokens.weight"]
        out = {}
        for n in names:
            w = self.orig[n].numpy()
            flat = np.ones(w.shape[1], np.float32)  # the weighted search with every column alike
            if rule == "plain":
                out[n] = q4_circle_fx(w, False)
            elif rule == "search":
                out[n] = q4_circle_fx(w, True)
            elif rule == "fine":
                out[n] = q4_circle_fx(w, True, flat)
            elif rule == "gamma":
                g = self.gamma(n)
                out[n] = q4_circle_fx(w, True, flat if g is None else g)
            elif rule == "imatrix":
                out[n] = q4_circle_fx(w, True, self.imatrix().get(n, flat))
            else:
                raise ValueError(rule)
        if "lm_head.weight" in out:  # the tied table: one set of blocks (the lm_head's) for both uses
            out["model.embed_tokens.weight"] = out["lm_head.weight"]
        return out


KINDS = {
    "table as embedding": lambda n: n == "model.embed_tokens.weight",
    "table as lm_head": lambda n: n == "lm_head.weight",
    "q_proj": lambda n: n.endswith("q_proj.weight"),
    "k_proj": lambda n: n.endswith("k_proj.weight"),
    "v_proj": lambda n: n.endswith("v_proj.weight"),
    "o_proj": lambda n: n.endswith("o_proj.weight"),
    "gate_proj": lambda n: n.endswith("gate_proj.weight"),
    "up_proj": lambda n: n.endswith("up_proj.weight"),
    "down_proj": lambda n: n.endswith("down_proj.weight"),
    "layers 0-1 (all linears)": lambda n: n.startswith(("model.layers.0.", "model.layers.1.")),
    "layers 28-29 (all linears)": lambda n: n.startswith(("model.layers.28.", "model.layers.29.")),
    "every layer linear": lambda n: n.startswith("model.layers."),
}


def row(name, b: Bench, ppl_top1, extra=()):
    p, t = ppl_top1
    return [name, f"{p:.3f} ({100 * (p / b.float_ppl - 1):+.1f}%)", f"{100 * t:.1f}%", *extra]


def gguf_table():
    import gguf

    import checkpoint

    r = gguf.GGUFReader(os.path.join(checkpoint.checkpoint_dir(), checkpoint.GGUF_FILE))
    kinds = {}
    for t in r.tensors:
        key = t.name.split(".")[-2] if t.name.startswith("blk.") else t.name
        kinds.setdefault((key, t.tensor_type.name), []).append(int(t.n_elements))
    return [[k, ty, str(len(v)), f"{sum(v) / 1e6:.2f}"] for (k, ty), v in sorted(kinds.items())]


def main(argv=None) -> int:
    from quant_accuracy import print_table

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tables", nargs="*", default=["gguf", "kinds", "scales", "grid", "rotate"])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rules", nargs="*", default=["plain", "search", "fine", "gamma", "imatrix"])
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)

    if "gguf" in args.tables:
        print("\nGGUF tensor types (blk.* grouped by kind):")
        print_table(["tensor", "type", "count", "M elements"], gguf_table())
    b = Bench(args.tokens)
    print(f"\nSmolLM2-135M-Instruct, {args.tokens} tokens of execmodel: float perplexity {b.float_ppl:.3f}", flush=True)
    search = None
    if "kinds" in args.tables:
        t = time.perf_counter()
        search = b.quantized("search")
        rows = []
        for kind, pick in KINDS.items():
            sel = {n: v for n, v in search.items() if pick(n)}
            rows.append(row(kind, b, b.ppl(sel), [f"{sum(v.size for v in sel.values()) / 1e6:.1f}"]))
            print("  done:", rows[-1], flush=True)
        rows.append(row("everything (tied table Q4_0 for both uses)", b, b.ppl(search),
                        [f"{sum(v.size for v in search.values()) / 2e6 + 0:.1f}"]))
        print(f"\nOnly one kind Q4_0 (circle_fx's search), the rest float ({time.perf_counter() - t:.0f} s):")
        print_table(["Q4_0 tensors", "ppl graph", "top-1", "M weights"], rows)
    if "scales" in args.tables:
        rows = []
        for rule in args.rules:
            t = time.perf_counter()
            q = search if (rule == "search" and search is not None) else b.quantized(rule)
            both = q
            err = sum(float(((q[n] - b.orig[n].numpy()) ** 2).sum()) for n in q if n != "model.embed_tokens.weight")
            head_only = {n: v for n, v in q.items() if n != "lm_head.weight" and n != "model.embed_tokens.weight"}
            rows.append(row(rule, b, b.ppl(both),
                            [row(rule, b, b.ppl(head_only))[1], f"{err:.1f}", f"{time.perf_counter() - t:.0f}"]))
            print("  done:", rows[-1], flush=True)
        print("\nEvery tensor Q4_0 by scale rule (tied table: one set of blocks for both uses):")
        print_table(["scale rule", "ppl graph", "top-1", "ppl, table float", "sum sq err", "s"], rows)
    if "grid" in args.tables:
        rng = np.random.default_rng(0)
        noisy = {}
        for n, w in b.orig.items():
            blocks = w.numpy().reshape(-1, BLOCK)
            step = (blocks.max(-1) - blocks.min(-1)) / 15  # Q4_1: min and max are levels 0 and 15
            noise = (rng.random(blocks.shape, dtype=np.float32) - 0.5) * step[:, None]
            noisy[n] = (blocks + noise).reshape(w.shape)
        levels = np.mean([len(np.unique(r)) for r in b.orig["model.layers.3.mlp.down_proj.weight"].numpy().reshape(-1, BLOCK)[:2000]])
        rows = []
        for label, src in (("checkpoint (Q4_1 grid)", None), ("de-gridded (+U(+-step/2))", noisy)):
            saved = {n: b.orig[n].clone() for n in b.orig}
            if src is not None:
                for n in b.orig:
                    b.orig[n] = torch.from_numpy(src[n])
            base = b.ppl({n: b.orig[n] for n in b.orig})
            q = b.quantized("search")
            rel = np.mean([float(((q[n] - b.orig[n].numpy()) ** 2).sum() / (b.orig[n].numpy() ** 2).sum())
                           for n in q])
            qp = b.ppl(q)
            rows.append([label, f"{base[0]:.3f}", f"{qp[0]:.3f}", f"{100 * (qp[0] / base[0] - 1):+.1f}%", f"{rel:.4f}"])
            b.orig = saved
            b.ppl({n: saved[n] for n in saved})  # puts the checkpoint's weights back
            print("  done:", rows[-1], flush=True)
        print(f"\nRe-quantizing the Q4_1 grid (distinct values per block of a down_proj: {levels:.1f}):")
        print_table(["weights", "ppl", "ppl Q4_0 of them", "increase", "mean rel sq err"], rows)
    if "rotate" in args.tables:
        rows = []
        for seed in (None, 0, 1):
            t = time.perf_counter()
            w, norms = rotated(b.model, seed)
            saved_norms = {n: p.detach().clone() for n, p in norms.items()}
            with torch.no_grad():
                for p in norms.values():
                    p.fill_(1.0)
            saved = dict(b.orig)
            b.orig.update({n: torch.from_numpy(v) for n, v in w.items()})
            base = b.ppl(dict(b.orig))
            q = b.quantized("search")
            q["model.embed_tokens.weight"] = q4_circle_fx(b.orig["model.embed_tokens.weight"].numpy(), True)
            qp = b.ppl(q)
            head_only = {n: v for n, v in q.items() if n not in ("lm_head.weight", "model.embed_tokens.weight")}
            hp = b.ppl(head_only)
            b.orig = saved
            b.ppl(dict(saved))
            with torch.no_grad():
                for n, p in norms.items():
                    p.copy_(saved_norms[n])
            rows.append(["none (gammas folded only)" if seed is None else f"random orthogonal, seed {seed}", f"{base[0]:.3f}", row("", b, qp)[1], f"{100 * qp[1]:.1f}%",
                         row("", b, hp)[1], f"{time.perf_counter() - t:.0f}"])
            print("  done:", rows[-1], flush=True)
        print("\nResidual stream rotated (norm gammas folded into the next linears, h -> h Q), then Q4_0 (search):")
        print_table(["rotation", "ppl float (= float)", "ppl Q4_0", "top-1", "ppl Q4_0, table float", "s"], rows)
    return 0


def rotated(model, seed: int):
    """The weights of ``model`` with its residual stream rotated by a random orthogonal Q
    (each RMSNorm's gamma folded into the linears that read it; the norms then have gamma 1):
    embedding E Q, readers of a norm W diag(gamma) Q, writers to the residual Q^T W. The float
    function is unchanged (RMS is rotation invariant)."""
    D = model.config.hidden_size
    if seed is None:  # no rotation: the gammas folded only
        Q = torch.eye(D, dtype=torch.float64)
    else:
        g = torch.Generator().manual_seed(seed)
        Q, r = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))
        Q = Q * torch.sign(torch.diagonal(r))[None, :]
    m = model.model
    f64 = lambda t: t.detach().to(torch.float64)  # noqa: E731
    out, norms = {}, {"model.norm.weight": m.norm.weight}
    out["model.embed_tokens.weight"] = f64(m.embed_tokens.weight) @ Q
    out["lm_head.weight"] = (f64(model.lm_head.weight) * f64(m.norm.weight)) @ Q
    for i, layer in enumerate(m.layers):
        pre = f"model.layers.{i}."
        a, mlp = layer.self_attn, layer.mlp
        g1, g2 = f64(layer.input_layernorm.weight), f64(layer.post_attention_layernorm.weight)
        for k in ("q_proj", "k_proj", "v_proj"):
            out[pre + f"self_attn.{k}.weight"] = (f64(getattr(a, k).weight) * g1) @ Q
        out[pre + "self_attn.o_proj.weight"] = Q.T @ f64(a.o_proj.weight)
        for k in ("gate_proj", "up_proj"):
            out[pre + f"mlp.{k}.weight"] = (f64(getattr(mlp, k).weight) * g2) @ Q
        out[pre + "mlp.down_proj.weight"] = Q.T @ f64(mlp.down_proj.weight)
        norms[pre + "input_layernorm.weight"] = layer.input_layernorm.weight
        norms[pre + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
    return {n: v.to(torch.float32).numpy() for n, v in out.items()}, norms


if __name__ == "__main__":
    sys.exit(main())
