"""``circle-fx export-llm`` and ``circle-fx generate`` (registered by ``circle_fx.cli``).

``export-llm PATH``: a ``save_pretrained`` directory or a ``.gguf`` file (read by
transformers as float32, :mod:`circle_fx.llm.checkpoint`; its tokenizer goes into the
package), or ``MODULE:FACTORY``: ``FACTORY()`` returns the causal LM, or ``(model, anything)``
as for ``export`` (the example inputs are not needed: export_llm builds its own).
"""
from __future__ import annotations

from ..errors import InputError
from ..quant import options as quant_options
from .quant_check import KL_FLOOR, KL_RATIO


def _load(spec: str, lazy: bool = True):
    """``(model, tokenizer)`` from a checkpoint path (weightless if ``lazy``: its weights read as
    they are packed) or ``MODULE:FACTORY``."""
    import torch

    from ..factory import load_factory
    from .checkpoint import is_checkpoint, load_checkpoint

    if is_checkpoint(spec):
        return load_checkpoint(spec, lazy=lazy)
    factory = load_factory(spec)
    try:
        result = factory()
    except Exception as e:
        raise InputError(f"{spec}() raised {type(e).__name__}: {e}") from e
    model = result[0] if isinstance(result, (tuple, list)) else result
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"{spec}() must return a model or (model, example_inputs), got {type(model).__name__}")
    return model, "auto"


def cmd_export_llm(args) -> int:
    from .export import export_llm

    quantize = quant_options.quantize_from(args)  # bad options fail before the model loads
    if args.calibration and quantize is None:
        raise InputError("--calibration weights a --quantize preset's Q4_0 scales; pass --quantize too")
    model, tokenizer = _load(args.model, lazy=not (args.calibration or args.check))  # those run it in eager
    model, tokenizer = _for_calibration(args, quantize, model, tokenizer)
    if args.tokenizer:
        tokenizer = args.tokenizer
    if args.calibration:
        quantize = _calibrated(quantize, model, tokenizer, args.calibration)
    pkg = export_llm(model, args.max_seq_len, args.prefill_len, rope_op=not args.no_rope, quantize=quantize,
                     tokenizer=tokenizer, buckets={"decode": _buckets(args.decode_buckets),
                                                   "prefill": _buckets(args.prefill_buckets)})
    checked = None
    if args.check:
        checked = _check(pkg, model, args.check) if quantize is None else _check_quantized(pkg, model, args.check)
    pkg.save(args.output)
    m = pkg.manifest
    text = "tokenizer + chat template" if (m.get("text") or {}).get("chat_template") else \
        "tokenizer" if (m.get("text") or {}).get("tokenizer") else "no tokenizer (ids only)"
    print(f"wrote {args.output}: model.circle ({pkg.model.size:,} bytes: prefill and decode entry points, "
          f"each weight once), config.json, manifest.json, {text}; max_seq_len {m['max_seq_len']}, "
          f"prefill_len {m['prefill_len']}, {m['model']['num_layers']} layers, "
          f"ROPE ops in decode: {pkg.decode.op_histogram().get('ROPE', 0)}; decode buckets "
          f"{m['decode']['buckets']['lengths']} cache rows, prefill buckets {m['prefill']['buckets']['lengths']} ids")
    rings = {s["ring"] for s in m["cache"]["states"] if s["carry"] == "ring"}
    if m["cache"]["names"]:
        print(f"KV cache {m['cache']['bytes']:,} bytes" + (
            f" (sliding-window layers: rings of {', '.join(map(str, sorted(rings)))} rows, window "
            f"{m['sliding_window']})" if rings else ""))
    for line in quant_options.override_report(pkg.decode):
        print(line)
    if isinstance(checked, list):
        for line in checked:
            print(line)
    elif checked:
        print(f"--check: onert and transformers generate the same {checked} greedy tokens "
              "(prompt through prefill, and through decode steps)")
    return 0


def _for_calibration(args, quantize, model, tokenizer):
    """A streamed (weightless) checkpoint read whole when ``--quantize``'s data-free calibration
    wants to run it and it is small enough (:func:`circle_fx.quant.datafree.calibrates_in_memory`);
    a larger one stays streamed (its export then says it was not calibrated)."""
    from ..quant import resolve_quantize
    from ..quant.datafree import _weightless, calibrates_in_memory

    cfg = resolve_quantize(quantize)
    if cfg is None or not cfg.wants_calibration or args.calibration or not _weightless(model):
        return model, tokenizer
    params = sum(p.numel() for p in model.parameters())
    if not calibrates_in_memory(params):
        print(f"calibration: none: {params / 1e6:.0f}M parameters are streamed from the checkpoint (no float copy); "
              "q4_0 scales get the plain search (--calibration TEXT_FILE reads the model whole to calibrate)")
        return model, tokenizer
    return _load(args.model, lazy=False)


#: calibration text is cut into sequences of this many tokens, at most ``CALIBRATION_TOKENS`` in all
CALIBRATION_CHUNK = 512
CALIBRATION_TOKENS = 16384


def _calibrated(quantize, model, tokenizer, files):
    """``quantize`` with ``importance`` from the model run on the text of ``files`` (tokenized with
    the package's tokenizer): Q4_0 scales weighted by each linear's mean input square."""
    from dataclasses import replace

    import torch

    from ..quant import activation_importance, resolve_quantize
    from .text import _backend, default_tokenizer

    if tokenizer == "auto":
        tokenizer = default_tokenizer(model)
    if tokenizer is None:
        raise InputError("--calibration needs a tokenizer to read the text: the checkpoint has none; "
                         "pass --tokenizer tokenizer.json")
    backend, _ = _backend(tokenizer)
    ids: list[int] = []
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"--calibration {path}: cannot read it as UTF-8 text: {e}") from None
        if not text.strip():
            raise InputError(f"--calibration {path}: the file is empty")
        ids += backend.encode(text).ids
    ids = ids[:CALIBRATION_TOKENS]
    chunks = [ids[i:i + CALIBRATION_CHUNK] for i in range(0, len(ids), CALIBRATION_CHUNK)]
    samples = [{"input_ids": torch.tensor([c]), "use_cache": False} for c in chunks if c]
    importance = activation_importance(model, samples)
    importance.source = f"{len(ids)} tokens of --calibration {', '.join(files)}"
    print(f"calibration: {len(ids)} tokens from {len(files)} file(s): Q4_0 scales weighted by "
          f"activation importance")
    return replace(resolve_quantize(quantize), importance=importance)


def _check_prompt(pkg, new_tokens: int) -> tuple[list[int], int]:
    m = pkg.manifest
    prompt = [t % m["model"]["vocab_size"] for t in range(1, 1 + min(5, m["max_seq_len"] // 2))]
    return prompt, max(1, min(new_tokens, m["max_seq_len"] - len(prompt) + 1))


#: the quantized --check's prompt when the package has a tokenizer (cut to max_seq_len / 2 tokens)
CHECK_TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
              "combined movable metal type, oil-based ink and a wooden press. Within fifty years")


def _check_quantized(pkg, model, new_tokens: int) -> list[str]:
    """A quantized package vs the float ``model`` (:mod:`circle_fx.llm.quant_check`): the report's
    lines, or :class:`CircleFxError` (nothing written) when its KL is over the threshold."""
    import shutil
    import tempfile

    from ..errors import CircleFxError
    from .quant_check import compare, package_runtime

    prompt, new_tokens = _check_prompt(pkg, new_tokens)
    tmp = tempfile.mkdtemp(prefix="circle_fx_llm_check_")
    runtime = None
    try:
        pkg.save(tmp)
        runtime, where = package_runtime(pkg.path())
        runner = pkg.runner(tmp, runtime=runtime)
        if (pkg.manifest.get("text") or {}).get("tokenizer"):  # a real text tells more than ids 1..5
            prompt = runner.encode(CHECK_TEXT)[:max(1, pkg.manifest["max_seq_len"] // 2)]
            new_tokens = max(1, min(new_tokens, pkg.manifest["max_seq_len"] - len(prompt) + 1))
        result = compare(runner, model, prompt, new_tokens, pkg.manifest["weights"].get("decode") or {}, where)
    finally:
        if runtime is not None:
            runtime.close()
        pkg.directory = None  # the package is saved for real by the caller
        shutil.rmtree(tmp, ignore_errors=True)
    if not result.passed:
        raise CircleFxError("\n".join(result.lines()) + f"\n--check failed: the mean KL {result.kl:.4g} nats is over "
                            f"the threshold {result.threshold:.4g}; nothing was written")
    return result.lines()


def _check(pkg, model, new_tokens: int) -> int:
    """Greedy tokens from onert vs ``model.generate`` before anything is written."""
    import shutil
    import tempfile

    import torch

    from ..errors import CircleFxError

    prompt, new_tokens = _check_prompt(pkg, new_tokens)
    tmp = tempfile.mkdtemp(prefix="circle_fx_llm_check_")
    try:
        runner = pkg.runner(tmp)
        with torch.no_grad():
            want = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                                  eos_token_id=None)[0].tolist()
        for use_prefill in (True, False):
            got = runner.generate(prompt, new_tokens, eos_token_ids=[], use_prefill=use_prefill)
            if got != want:
                raise CircleFxError(f"--check: onert generated {got[len(prompt):]} but transformers "
                                    f"{want[len(prompt):]} (prompt {prompt}, use_prefill={use_prefill}); "
                                    "nothing was written")
    finally:
        pkg.directory = None  # the package is saved for real by the caller
        shutil.rmtree(tmp, ignore_errors=True)
    return new_tokens


def _ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise InputError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise InputError("--prompt-ids is empty")
    return ids


def _sampling(args) -> dict:
    return {"do_sample": True if args.sample else None, "temperature": args.temperature, "top_k": args.top_k,
            "top_p": args.top_p, "repetition_penalty": args.repetition_penalty, "seed": args.seed}


def cmd_generate(args) -> int:
    import sys
    import time

    from .runner import LLMRunner

    if (args.prompt is None) == (args.prompt_ids is None):
        raise InputError("give exactly one of --prompt TEXT and --prompt-ids 1,2,3")
    if args.chat and args.prompt is None:
        raise InputError("--chat applies the chat template to --prompt TEXT")
    runner = LLMRunner(args.package)
    eos = [] if args.ignore_eos else None
    if args.prompt_ids is not None:
        out = runner.generate(_ids(args.prompt_ids), args.max_new_tokens, eos_token_ids=eos, **_sampling(args))
        print(",".join(str(t) for t in out))
        return 0
    ids = runner.encode(args.prompt, chat=args.chat)
    start, count = time.perf_counter(), 0
    tokens = runner.iter_tokens(ids, args.max_new_tokens, eos_token_ids=eos, **_sampling(args))
    stop = set(runner.eos_token_ids if eos is None else eos)

    def counted():
        nonlocal count
        for t, _ in tokens:
            count += 1
            if t not in stop:
                yield t

    for piece in runner.text.stream(counted()):
        sys.stdout.write(piece)
        sys.stdout.flush()
    seconds = time.perf_counter() - start
    sys.stdout.write("\n")
    print(f"[{len(ids)} prompt tokens, {count} new tokens in {seconds:.2f} s: {count / max(seconds, 1e-9):.1f} "
          "tokens/s]", file=sys.stderr)
    return 0


def _buckets(value: str):
    """``--decode-buckets`` / ``--prefill-buckets``: "auto", "off" or lengths "256,1024"."""
    if value in ("auto", "off"):
        return value
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"bucket lengths must be 'auto', 'off' or comma-separated integers, got {value!r}") from None


def add_commands(sub) -> None:
    e = sub.add_parser("export-llm", help="export a transformers causal LM as prefill + KV-cache decode models")
    e.add_argument("model", metavar="MODEL", help="a save_pretrained checkpoint directory, a .gguf file, or "
                   "MODULE:FACTORY returning the model (or (model, inputs))")
    e.add_argument("-o", "--output", required=True, help="output directory (created)")
    e.add_argument("--max-seq-len", type=int, default=512, help="KV cache positions per layer (default 512)")
    e.add_argument("--prefill-len", type=int, default=None, help="prompt length of the prefill model "
                   "(default: max-seq-len; longer prompts continue through decode)")
    e.add_argument("--decode-buckets", default="auto", metavar="auto|off|N,N,...",
                   help="decode steps over these cache lengths (sharing the weights; the graph picks the "
                        "smallest that holds the position), so a step costs its position, not max-seq-len. "
                        "auto (default): 256, 1024, 4096, ... below max-seq-len when it is > 256")
    e.add_argument("--prefill-buckets", default="auto", metavar="auto|off|N,N,...",
                   help="prefill models of these prompt lengths (sharing the weights; the graph picks the "
                        "smallest that holds the prompt). auto (default): 32, 128, ... below prefill-len "
                        "when it is >= 256. Each bucket costs one more capture at export")
    e.add_argument("--tokenizer", default=None, help="tokenizer.json or a directory with one (default: the "
                   "checkpoint's own)")
    e.add_argument("--no-rope", action="store_true", help="keep RoPE decomposed in the decode model")
    quant_options.add_arguments(e, "weight quantization of both models (as circle-fx export). ")
    e.add_argument("--calibration", action="append", default=[], metavar="TEXT_FILE",
                   help="with --quantize: text like the model's inputs (repeatable; not the text you evaluate "
                        f"on; up to {CALIBRATION_TOKENS} tokens are used): each Q4_0 block's scale minimises "
                        "its error weighted by the mean square of the linear's input columns on it "
                        "(activation importance) instead of the default data-free calibration (the model run on "
                        "seeded random ids; a checkpoint of more than 600M parameters is streamed and gets none)")
    e.add_argument("--check", type=int, nargs="?", const=16, default=0, metavar="N",
                   help="before writing, generate N (default 16) greedy tokens in onert and in transformers "
                        "and fail unless they are the same. With --quantize: report the first diverging greedy "
                        "token, top-1 agreement and mean KL(float || package) over the check prompt + N steps "
                        "(teacher-forced on the float tokens), and fail only when the KL is over max("
                        f"{KL_RATIO:g} x the yardstick, {KL_FLOOR:g} nats), the yardstick being the float model "
                        "with plain rounding of the same weights (ggml's reference Q4_0/Q8_0, int8 rows) in eager; "
                        "GGML weights run on onert's aarch64 build under qemu when x86 onert cannot")
    e.set_defaults(func=cmd_export_llm)

    g = sub.add_parser("generate", help="generate text (or ids) with an export-llm package, in onert")
    g.add_argument("package", help="directory written by export-llm")
    g.add_argument("--prompt", default=None, help="prompt text; the new text is streamed to stdout, "
                   "tokens/s to stderr")
    g.add_argument("--chat", action="store_true", help="apply the package's chat template to --prompt "
                   "(one user message)")
    g.add_argument("--prompt-ids", default=None, help="comma-separated token ids, e.g. 1,2,3 (prints ids)")
    g.add_argument("--max-new-tokens", type=int, default=32)
    g.add_argument("--ignore-eos", action="store_true", help="do not stop at the EOS token")
    g.add_argument("--sample", action="store_true", help="sample (implied by --temperature/--top-k/--top-p)")
    g.add_argument("--temperature", type=float, default=None)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--repetition-penalty", type=float, default=None)
    g.add_argument("--seed", type=int, default=None, help="seed of the sampler (same choices as "
                   "torch.manual_seed(SEED) before transformers' generate)")
    g.set_defaults(func=cmd_generate, compiler=False)  # torch-free, as the runner (tests/llm/test_llm_no_torch.py)
