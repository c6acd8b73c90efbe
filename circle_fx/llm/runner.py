""":class:`LLMRunner`: generation with an exported package, in onert: token ids
(:meth:`LLMRunner.generate`) or text (:meth:`LLMRunner.generate_text`, streamed by
:meth:`LLMRunner.stream_text`), greedy or sampled (:mod:`circle_fx.llm.sampling`).

The caches live in numpy arrays owned by the runner and are bound to the decode session
once (``nnfw_session.set_input`` keeps a pointer to the caller's buffer: no copy per
step); after each step the runner writes the new K/V row (a model output) into the
caches in place. The token id and position inputs are bound the same way. This is the
cheapest design measured in onert 0.1.0 (shared matrix §6: 3.3–4.0 ms vs 8 ms for 22
layers when the caches are passed through ``infer()``). The low-level session API
(``prepare``/``set_input``/``run``/``get_output``) also sidesteps onert's Python ``infer()``
bug with uint8 inputs (matrix, note 1), should a quantized package ever take one.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from ..circle.runtime import check_index_range, check_loadable
from ..errors import InputError, RuntimeFailure
from . import manifest as mf
from .sampling import Chooser, Sampling


class _Session:
    """The low-level onert session: prepare once, bind inputs by pointer, run, read outputs."""

    def __init__(self, path: str):
        check_loadable(path)  # a corrupt file would segfault onert and the host with it
        os.environ.setdefault("USE_MMAPED_DATA", "1")
        import onert
        from onert.native.libnnfw_api_pybind import prepare_config

        from ..circle.ggml_support import check_ggml_runs, ggml_threads

        ggml = check_ggml_runs(path)  # a CPU onert's ggml kernels cannot run on would SIGILL the process
        try:
            self.s = onert.infer.session(path).session
            self.s.set_prepare_config(prepare_config.ENABLE_INTERNAL_OUTPUT_ALLOC)
            with ggml_threads(ggml):  # onert reads NUM_THREADS when it prepares
                self.s.prepare()
        except Exception as e:
            raise RuntimeFailure(f"onert could not load {path}: {e}") from e
        self.path = path
        self._bound: dict[int, np.ndarray] = {}  # keep bound buffers alive

    def bind(self, index: int, array: np.ndarray) -> None:
        assert array.flags["C_CONTIGUOUS"]
        self.s.set_input(index, array)
        self._bound[index] = array

    def run(self) -> None:
        try:
            self.s.run()
        except Exception as e:
            raise RuntimeFailure(f"onert failed to run {self.path}: {e}") from e

    def output(self, index: int) -> np.ndarray:
        return self.s.get_output(index)


class LLMRunner:
    """Drive a saved package (see :mod:`circle_fx.llm.manifest` for the protocol)."""

    def __init__(self, directory, runtime=None):
        """``runtime``: another onert to run in, an object with ``bound_session(path)`` (the
        interface of :class:`_Session`), such as :class:`circle_fx.circle.arm64.Arm64Runtime`."""
        self.directory = os.fspath(directory)
        m = self.manifest = mf.read(self.directory)
        self.max_seq_len, self.prefill_len = m["max_seq_len"], m["prefill_len"]
        self.eos_token_ids = list(m.get("eos_token_ids") or [])
        self.pad = m.get("pad_token_id") or 0
        self._text = None
        session = _Session if runtime is None else runtime.bound_session
        self._entry = None
        if mf.one_file(m):  # model.circle: one session serves both entry points (its IF)
            self.decode = self.prefill = session(os.path.join(self.directory, m["file"]))
            self._entry = np.zeros((1,), np.bool_)
            self.decode.bind(m["entry"]["index"], self._entry)
            self._entry_value = {part: bool(m["entry"][part]) for part in ("prefill", "decode")}
        else:  # version 1: prefill.circle + decode.circle, a session each
            self.decode = session(os.path.join(self.directory, m["decode"]["file"]))
            self.prefill = session(os.path.join(self.directory, m["prefill"]["file"]))
        din = {e["name"]: e["index"] for e in m["decode"]["inputs"]}
        self._dout = {e["name"]: e["index"] for e in m["decode"]["outputs"]}
        pin = {e["name"]: e["index"] for e in m["prefill"]["inputs"]}
        self._pout = {e["name"]: e["index"] for e in m["prefill"]["outputs"]}
        names = m["cache"]["names"]
        shapes = m["cache"].get("shapes") or {n: m["cache"]["shape"] for n in names}
        self.caches = {n: np.zeros(shapes[n], np.float32) for n in names}
        # (output, cache, carry, axis, ring rows): "position" rows go to the token's position on ``axis``
        # (3 = a value cache kept [1, H, D, S], version 3), "ring" rows (a sliding-window layer's K/V,
        # version 3) to position % ring, "replace" states are replaced
        self._writes = [(w["output"], w["cache"], w.get("carry", "position"), w.get("axis", 2), w.get("ring"))
                        for w in m["decode"]["cache_writes"]]
        unknown = {c for _, _, c, _, _ in self._writes} - {"position", "ring", "replace"}
        if unknown:
            raise InputError(f"{self.directory}: cache carry {sorted(unknown)} is not one this circle_fx knows "
                             f"(manifest version {m.get('version')})")
        # a model with conv / recurrent states prefills exact prompts only (manifest prefill.pads)
        self.prefill_pads = m["prefill"].get("pads", True)
        # prompt lengths the prefill computes (manifest prefill.buckets; older packages: prefill_len):
        # the graph picks the bucket by last_index, the host only needs the lengths for its cost estimate
        self.prefill_buckets = list((m["prefill"].get("buckets") or {}).get("lengths") or [self.prefill_len])
        # bound once; later only written in place. A package that recomputes (manifest
        # decode.recompute) takes the whole window of ids and the position to read the logits at
        self.recompute = bool(m["decode"].get("recompute"))
        self._id = np.full((1, self.max_seq_len if self.recompute else 1), self.pad, np.int32)
        self._pos = np.zeros((1,), np.int32)
        self.decode.bind(din["input_ids"], self._id)
        self.decode.bind(din["last_index" if self.recompute else "position"], self._pos)
        for n in names:
            self.decode.bind(din[n], self.caches[n])
        # valid id ranges (circle_fx.limits, also in each file): the models clamp ids by default,
        # which would still be a silently wrong answer, so out-of-range ids are refused here
        self._id_range = {part: _index_range(m[part], "input_ids", m["model"]["vocab_size"])
                          for part in ("decode", "prefill")}
        self._pids = np.zeros((1, self.prefill_len), np.int32)
        self._plast = np.zeros((1,), np.int32)
        self.prefill.bind(pin["input_ids"], self._pids)
        self.prefill.bind(pin["last_index"], self._plast)

    # ----------------------------------------------------------------- steps
    def reset(self) -> None:
        for c in self.caches.values():
            c.fill(0.0)
        if self.recompute:
            self._id.fill(self.pad)

    def run_prefill(self, ids: list[int]) -> np.ndarray:
        """Prefill positions ``0..len(ids)-1`` (``len(ids) <= prefill_len``); returns the last logits [V]."""
        n = len(ids)
        if not 1 <= n <= self.prefill_len:
            raise InputError(f"prefill takes 1..{self.prefill_len} ids, got {n}")
        check_index_range("input_ids", np.asarray(ids), self._id_range["prefill"])
        self._pids.fill(self.pad)
        self._pids[0, :n] = ids
        self._plast[0] = n - 1
        if self.recompute:  # the decode window holds every id so far
            self._id[0, :n] = ids
        self._run(self.prefill, "prefill")
        if n < self.prefill_len and not self.prefill_pads:
            raise InputError(f"this model carries conv / recurrent state: its prefill takes exactly "
                             f"{self.prefill_len} ids (a padded prompt would leave the state after the padding), got {n}")
        for out, cache, carry, axis, ring in self._writes:
            if carry == "position" and axis == 3:
                self.caches[cache][:, :, :, :n] = np.swapaxes(self.prefill.output(self._pout[out])[:, :, :n, :], 2, 3)
            elif carry == "position":
                self.caches[cache][:, :, :n, :] = self.prefill.output(self._pout[out])[:, :, :n, :]
            elif carry == "ring":  # the last `ring` positions, each at its slot (the ring holds nothing older)
                first = max(0, n - ring)
                self.caches[cache][:, :, np.arange(first, n) % ring, :] = self.prefill.output(self._pout[out])[:, :, first:n, :]
            else:
                self.caches[cache][...] = self.prefill.output(self._pout[out])
        return self.prefill.output(self._pout["logits"]).reshape(-1)

    def step(self, token: int, position: int) -> np.ndarray:
        """One decode step: feed ``token`` at ``position``, write its K/V rows; returns the logits [V]."""
        if not 0 <= position < self.max_seq_len:
            raise InputError(f"position {position} is past the KV cache (max_seq_len {self.max_seq_len}); "
                             "export with a larger --max-seq-len")
        if not self._id_range["decode"][0] <= token <= self._id_range["decode"][1]:
            check_index_range("input_ids", np.asarray([token]), self._id_range["decode"])
        self._id[0, position if self.recompute else 0] = token
        self._pos[0] = position
        self._run(self.decode, "decode")
        for out, cache, carry, axis, ring in self._writes:
            if carry == "position" and axis == 3:
                self.caches[cache][:, :, :, position] = self.decode.output(self._dout[out])[:, :, 0, :]
            elif carry == "position":
                self.caches[cache][:, :, position, :] = self.decode.output(self._dout[out])[:, :, 0, :]
            elif carry == "ring":
                self.caches[cache][:, :, position % ring, :] = self.decode.output(self._dout[out])[:, :, 0, :]
            else:
                self.caches[cache][...] = self.decode.output(self._dout[out])
        return self.decode.output(self._dout["logits"]).reshape(-1)

    def _run(self, session: _Session, part: str) -> None:
        if self._entry is not None:
            self._entry[0] = self._entry_value[part]
        session.run()

    # ------------------------------------------------------------ generation
    #: one prefill call costs about FIXED + PER_ROW * prefill_len decode steps (the padded
    #: prompt is always computed in full). Measured on the 125M Llama in onert: prefill_len 16
    #: ~6 steps, 128 ~15 steps (benchmarks/README.md).
    PREFILL_COST_FIXED, PREFILL_COST_PER_ROW = 5.0, 0.08

    def prefill_pays(self, prompt_len: int) -> bool:
        """Is one (padded) prefill call cheaper than feeding the prompt's first
        ``prefill_len`` tokens as decode steps? A short prompt in a long prefill model is not;
        with prefill buckets the call computes the smallest bucket that holds the prompt."""
        if self.recompute:  # a decode step runs a whole max_seq_len window: never cheaper
            return True
        n = min(prompt_len, self.prefill_len)
        rows = min((b for b in self.prefill_buckets if b >= n), default=self.prefill_len)
        cost = self.PREFILL_COST_FIXED + self.PREFILL_COST_PER_ROW * rows
        return n >= cost

    def generate(self, input_ids, max_new_tokens: int, eos_token_ids=None, return_logits: bool = False,
                 use_prefill: bool | None = None, **sampling):
        """Returns the prompt followed by the new tokens (as ``model.generate``); greedy unless
        sampling is asked for.

        Stops after ``max_new_tokens`` or at an EOS id (``eos_token_ids``, default the
        manifest's; pass ``[]`` to never stop early). ``return_logits=True`` returns
        ``(tokens, logits)`` with the [V] logits each new token was picked from.
        ``use_prefill``: run the prompt through the prefill model (True) or through decode
        steps one token at a time (False); None picks by cost, see :meth:`prefill_pays`. A
        model with conv / recurrent state (manifest ``prefill.pads`` false) prefills only a
        prompt of at least ``prefill_len`` tokens; a shorter one always goes through decode steps.
        Both give the same tokens. ``sampling``: ``do_sample``, ``temperature``, ``top_k``,
        ``top_p``, ``repetition_penalty``, ``seed`` with transformers' meaning
        (:mod:`circle_fx.llm.sampling`).
        """
        ids = _as_ids(input_ids)
        out, seen = list(ids), []
        for token, logits in self.iter_tokens(ids, max_new_tokens, eos_token_ids, use_prefill, **sampling):
            out.append(token)
            seen.append(logits)
        return (out, seen) if return_logits else out

    def iter_tokens(self, input_ids, max_new_tokens: int, eos_token_ids=None, use_prefill: bool | None = None,
                    **sampling):
        """Yields ``(token, logits)`` for each new token as soon as it is chosen (arguments as
        :meth:`generate`); everything is checked before the first model call."""
        ids = _as_ids(input_ids)
        chooser = Chooser(Sampling.make(**sampling))
        if max_new_tokens < 0:
            raise InputError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if len(ids) > self.max_seq_len:
            raise InputError(f"the prompt has {len(ids)} tokens; the package was exported with "
                             f"max_seq_len {self.max_seq_len}")
        need = len(ids) + max_new_tokens - 1  # the last new token is never fed back
        if need > self.max_seq_len:
            raise InputError(f"a {len(ids)}-token prompt plus {max_new_tokens} new tokens needs {need} cache "
                             f"positions; the package was exported with max_seq_len {self.max_seq_len}")
        vocab = self.manifest["model"]["vocab_size"]
        if any(not 0 <= t < vocab for t in ids):
            raise InputError(f"token ids must be in 0..{vocab - 1}, got {[t for t in ids if not 0 <= t < vocab][:5]}")
        return self._tokens(ids, max_new_tokens, eos_token_ids, use_prefill, chooser)

    def _tokens(self, ids, max_new_tokens, eos_token_ids, use_prefill, chooser):
        if max_new_tokens == 0:
            return
        eos = set(self.eos_token_ids if eos_token_ids is None else eos_token_ids)
        self.reset()
        prefill = self.prefill_pays(len(ids)) if use_prefill is None else use_prefill
        head = ids[:self.prefill_len] if prefill else []
        if len(head) < self.prefill_len and not self.prefill_pads:
            head = []  # conv / recurrent state: prefill only exact prompts, else decode steps
        logits = self.run_prefill(head) if head else None
        for p in range(len(head), len(ids)):  # decode steps: a short prompt, or one longer than the prefill model
            logits = self.step(ids[p], p)
        out = list(ids)
        for k in range(max_new_tokens):
            token = chooser(logits, out)
            out.append(token)
            yield token, logits
            if token in eos or k == max_new_tokens - 1:
                break
            logits = self.step(token, len(out) - 1)

    # ------------------------------------------------------------------ text
    @property
    def text(self):
        """The package's :class:`~circle_fx.llm.text.TextCodec` (tokenizer + chat template)."""
        if self._text is None:
            from .text import TextCodec

            self._text = TextCodec(self.directory, self.manifest.get("text"))
        return self._text

    def encode(self, prompt, chat: bool = False) -> list[int]:
        """Prompt ids as transformers' tokenizer (``chat=True``: its ``apply_chat_template``) gives them."""
        return self.text.encode(prompt, chat)

    def stream_text(self, prompt, max_new_tokens: int = 256, chat: bool = False, **kwargs):
        """Yields the generated text piece by piece as tokens are chosen (their concatenation is
        :meth:`generate_text`'s result). ``prompt``: a string, or with ``chat=True`` a string
        (one user message) or a list of ``{"role", "content"}`` messages. Other arguments as
        :meth:`generate` (EOS stops generation; sampling settings)."""
        kwargs.pop("return_logits", None)
        tokens = self.iter_tokens(self.encode(prompt, chat), max_new_tokens, **kwargs)
        eos = set(self.eos_token_ids if kwargs.get("eos_token_ids") is None else kwargs["eos_token_ids"])
        return self.text.stream(t for t, _ in tokens if t not in eos)

    def generate_text(self, prompt, max_new_tokens: int = 256, chat: bool = False, **kwargs) -> str:
        """The generated text (special tokens skipped), arguments as :meth:`stream_text`."""
        return "".join(self.stream_text(prompt, max_new_tokens, chat, **kwargs))


def _index_range(part: dict, name: str, vocab: int) -> tuple[int, int]:
    """The valid range of ``name`` from the part's ``limits`` (manifest), else the vocabulary."""
    entry = ((part.get("limits") or {}).get("inputs") or {}).get(name) or {}
    lo, hi = entry.get("index_range") or (0, vocab - 1)
    return int(lo), int(hi)


def _as_ids(input_ids) -> list[int]:
    torch = sys.modules.get("torch")  # a torch tensor implies torch is loaded: never import it here
    if torch is not None and isinstance(input_ids, torch.Tensor):
        input_ids = input_ids.detach().cpu().numpy()
    arr = np.asarray(input_ids)
    if arr.ndim == 2:
        if arr.shape[0] != 1:
            raise InputError(f"batch size {arr.shape[0]}: the runner generates one sequence (batch 1)")
        arr = arr[0]
    if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
        raise InputError(f"input_ids must be a non-empty 1-D (or [1, n]) sequence of integers, got shape "
                         f"{list(arr.shape)} dtype {arr.dtype}")
    return [int(t) for t in arr]
