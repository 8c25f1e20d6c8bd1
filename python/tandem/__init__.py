"""tandem: train GPT-2, Llama and GPT-NeoX models with fully sharded data parallelism, and
generate from them with a KV cache, on CPUs and NVIDIA GPUs.

    import tandem
    config = tandem.TrainConfig(model="gpt2-tiny", data="data.tok", steps=100, lr=2e-3)
    trainer = tandem.Trainer(config)
    trainer.train(callback=lambda m: print(m["step"], m["loss"]))
    trainer.save("ckpt")

    model = tandem.load("ckpt")
    print(model.generate("The ", max_new_tokens=50, temperature=0).text)

Under ``mpirun -np N python3 script.py`` every process is one rank, as ``tandem train`` runs
them: a Trainer trains sharded across them (its ``rank`` and ``world_size`` say which).
Every failure tandem detects is raised as :class:`tandem.Error`.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

# Open MPI loads its components as plugins that expect the MPI library's symbols to be
# global: load the extension (which links MPI) with RTLD_GLOBAL.
_flags = sys.getdlopenflags()
sys.setdlopenflags(_flags | os.RTLD_GLOBAL)
try:
    from . import _tandem
finally:
    sys.setdlopenflags(_flags)

import numpy as np

Error = _tandem.Error
Error.__doc__ = """A failure tandem detected: a bad option, a missing or corrupt file, a plan
that does not fit, a collective that timed out. Attributes: ``message`` (one line, the text
the tandem command prints), ``call`` (the library function that detected it) and ``rank``
(the rank of the process that detected it)."""
Tokenizer = _tandem.Tokenizer

__all__ = [
    "Error",
    "TrainConfig",
    "Trainer",
    "Model",
    "Generation",
    "Tokenizer",
    "load",
    "plan",
    "prepare_text_files",
    "write_token_file",
    "model_presets",
    "hardware_presets",
    "model_info",
    "finalize",
]


class TrainConfig:
    """The options of a training run: the keys of ``tandem train --config FILE``.

    Give them as keyword arguments, with underscores or with the dashes of the JSON keys
    (``global_batch=32`` or ``**{"global-batch": 32}``). Values are checked as the tandem
    command checks them, with the same messages (:class:`tandem.Error`). Each key reads back
    as an attribute (``config.global_batch``); absent keys keep their defaults.

    Keys: model, data, device ("cpu" | "cuda"), batch, global_batch, seq, steps, seed, lr,
    min_lr_ratio, warmup, weight_decay, beta1, beta2, eps, grad_clip, strategy ("full" |
    "grad-op" | "none" | "hybrid"), shard_group, max_gathered, recompute ("none" |
    "attention" | "unit"), recompute_blocks (a number, or "auto"), loss_chunk, reduce_dtype
    ("f32" | "bf16"), cuda_graph ("auto" | "on" | "off"; True / False read as on / off),
    update_at_gather, ranks,
    comm_timeout, mem_limit ("8GiB", or bytes), save, save_every, save_overwrite,
    skip_nonfinite, resume,
    init_from, metrics, progress ("auto" | "bar" | "lines" | "none"; default "none"),
    log_every, trace, trace_steps. docs/usage.md describes each one.
    """

    def __init__(self, **options: Any) -> None:
        given = {k.replace("_", "-"): v for k, v in options.items()}
        self._json: Dict[str, Any] = json.loads(
            _tandem.train_config_normalize(json.dumps(given)))

    @classmethod
    def from_json(cls, source: Union[str, os.PathLike, Dict[str, Any]]) -> "TrainConfig":
        """A config from a JSON file (the ``--config`` file of ``tandem train``), a JSON
        text, or a dict of its keys."""
        if isinstance(source, dict):
            return cls(**source)
        text = str(source)
        if not text.lstrip().startswith("{"):
            try:
                with open(text, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                raise Error(f"cannot read training config '{source}': {e.strerror}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise Error(f"training config '{source}' is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise Error(f"training config must be a JSON object, got {type(data).__name__}")
        return cls(**data)

    def to_dict(self) -> Dict[str, Any]:
        """Every key (with its JSON spelling) and its value."""
        return dict(self._json)

    def to_json(self) -> str:
        return json.dumps(self._json)

    def replace(self, **options: Any) -> "TrainConfig":
        """A copy with some keys changed."""
        merged = dict(self._json)
        merged.update({k.replace("_", "-"): v for k, v in options.items()})
        return TrainConfig(**merged)

    def __getattr__(self, name: str) -> Any:
        key = name.replace("_", "-")
        data = self.__dict__.get("_json", {})
        if key in data:
            return data[key]
        raise AttributeError(f"TrainConfig has no key '{name}'")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TrainConfig) and self._json == other._json

    def __repr__(self) -> str:
        keys = ", ".join(f"{k.replace('-', '_')}={v!r}" for k, v in self._json.items())
        return f"TrainConfig({keys})"


StepCallback = Callable[[Dict[str, Any]], None]


class Trainer:
    """A training run: the model, the data, the ranks and the step program, set up once.

    ``Trainer(config)`` checks everything before any step runs (bad values, missing files,
    a checkpoint that does not match, a plan over ``mem_limit``) and raises
    :class:`tandem.Error`. Each step's metrics are a dict: step, loss, lr, grad_norm,
    tokens_per_s, step_ms, compute_ms, comm_ms, exposed_comm_ms, peak_mem_bytes, skipped.

    Steps run without the GIL. Ctrl-C (SIGINT), SIGTERM or SIGUSR1 during :meth:`train`
    stops it after the current step on every rank, saves into ``config.save`` when set,
    and raises KeyboardInterrupt (SIGINT) or returns (the others); during :meth:`step` the
    interrupt is raised once the step is done.
    """

    def __init__(self, config: Union[TrainConfig, Dict[str, Any]]) -> None:
        if isinstance(config, dict):
            config = TrainConfig(**config)
        self._t = _tandem._Trainer(config.to_json())

    @classmethod
    def resume(cls, dir: Union[str, os.PathLike], **overrides: Any) -> "Trainer":
        """Continues the run saved in checkpoint ``dir`` with the options it was saved with,
        changed by ``overrides`` (e.g. ``steps=2000`` to go further)."""
        self = cls.__new__(cls)
        given = {k.replace("_", "-"): v for k, v in overrides.items()}
        self._t = _tandem._Trainer.resume(os.fspath(dir), json.dumps(given))
        return self

    def step(self) -> Dict[str, Any]:
        """One optimizer step over the global batch; its metrics."""
        return self._t.step()

    def train(self, steps: Optional[int] = None,
              callback: Optional[StepCallback] = None) -> Dict[str, Any]:
        """Steps until ``config.steps`` optimizer steps are done, or at most ``steps`` more,
        with the metrics file, progress output and checkpoints of the config (``save``
        every ``save_every`` steps and at the end of the call). ``callback`` receives each
        step's metrics dict; an exception it raises ends the training and reaches the caller.
        Returns the last step's metrics (step 0 when nothing was left to do)."""
        if steps is not None and steps <= 0:
            raise Error(f"steps must be positive, got {steps}")
        last = self._t.run(steps or 0, callback)
        signal = self._t.interrupted()
        if signal == 2:  # SIGINT
            raise KeyboardInterrupt(f"training stopped after step {self.steps_done}")
        return last

    def save(self, dir: Union[str, os.PathLike]) -> None:
        """Writes a checkpoint of the current step into ``dir`` (every rank must call it)."""
        self._t.save(os.fspath(dir))

    @property
    def steps_done(self) -> int:
        """Optimizer steps taken, those of a resumed checkpoint included."""
        return self._t.steps_done

    @property
    def rank(self) -> int:
        return self._t.rank

    @property
    def world_size(self) -> int:
        return self._t.world_size

    @property
    def interrupted(self) -> int:
        """The signal number that stopped the last :meth:`train` early, or 0."""
        return self._t.interrupted()

    @property
    def config(self) -> TrainConfig:
        """The config as the run resolved it (global_batch filled in, a resumed seed)."""
        return TrainConfig(**json.loads(self._t.config_json))

    @property
    def model(self) -> Dict[str, Any]:
        """The model's shape: name, family, vocab, context, d_model, n_layer, ..."""
        return self._t.model


class Generation:
    """What :meth:`Model.generate` made. ``ids`` and ``text`` are those of the one prompt, or
    lists with one entry per prompt when several were given; ``finish`` says why each
    sequence ended ("length", "eos" or "stop")."""

    def __init__(self, d: Dict[str, Any], batched: bool) -> None:
        pick = (lambda v: v) if batched else (lambda v: v[0] if v else v)
        self.ids: Union[List[int], List[List[int]]] = pick(d["ids"])
        self.text: Union[str, List[str], None] = pick(d["text"]) if d["text"] else None
        self.finish: Union[str, List[str]] = pick(d["finish"])
        self.prompt_tokens: int = d["prompt_tokens"]
        self.time_to_first_token_ms: float = d["time_to_first_token_ms"]
        self.prefill_tokens_per_s: float = d["prefill_tokens_per_s"]
        self.decode_tokens_per_s: float = d["decode_tokens_per_s"]
        self.peak_mem_bytes: int = d["peak_mem_bytes"]

    def __repr__(self) -> str:
        return f"Generation(ids={self.ids!r}, text={self.text!r}, finish={self.finish!r})"


Prompt = Union[str, Sequence[int]]


class Model:
    """A model loaded for inference by :func:`tandem.load`."""

    def __init__(self, path: Union[str, os.PathLike], device: str = "cpu", batch: int = 1,
                 max_seq: Optional[int] = None, mem_limit: Optional[int] = None) -> None:
        self._m = _tandem._Model(os.fspath(path), device, batch, max_seq or 0, mem_limit or 0)
        self.device = device

    @property
    def info(self) -> Dict[str, Any]:
        """The model's shape: name, family, vocab, context, d_model, n_layer, n_head, ..."""
        return self._m.info

    @property
    def tokenizer(self) -> Optional[Tokenizer]:
        """The model directory's tokenizer (the byte tokenizer of a byte-vocabulary model),
        or None when it holds none: then prompts are token ids."""
        return self._m.tokenizer

    @property
    def max_seq(self) -> int:
        """Positions per sequence, prompt and new tokens together."""
        return self._m.max_seq

    @property
    def batch(self) -> int:
        """The most prompts one generate call takes."""
        return self._m.batch

    @property
    def eos_ids(self) -> List[int]:
        return self._m.eos_ids

    def __repr__(self) -> str:
        i = self.info
        return (f"<tandem.Model {i['name']} ({i['family']}, {i['num_params']} parameters) "
                f"on {self.device}: {self._m.describe}>")

    def _ids(self, prompt: Prompt) -> List[int]:
        if isinstance(prompt, str):
            tok = self.tokenizer
            if tok is None:
                raise Error(f"model '{self.info['name']}' holds no tokenizer: give the prompt "
                            "as token ids")
            return tok.encode(prompt, True)
        return [int(t) for t in prompt]

    def _prompts(self, prompt: Union[Prompt, Sequence[Prompt]]) -> Tuple[List[List[int]], bool]:
        if isinstance(prompt, str) or (len(prompt) > 0 and isinstance(prompt[0], (int, np.integer))):
            return [self._ids(prompt)], False
        return [self._ids(p) for p in prompt], True

    def generate(self, prompt: Union[Prompt, Sequence[Prompt]], max_new_tokens: int = 64,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 1,
                 stop: Optional[str] = None, ignore_eos: bool = False,
                 stream: bool = False) -> Union[Generation, Iterator[Any]]:
        """Continues ``prompt`` (text, token ids, or a list of either for a batch of up to
        ``batch`` sequences) by up to ``max_new_tokens`` tokens with the KV cache.

        ``temperature`` 0 is greedy; ``top_k`` and ``top_p`` cut the distribution before
        drawing; ``seed`` fixes the draws. A sequence ends at the model's end-of-sequence
        token (unless ``ignore_eos``), once its new text holds ``stop``, or at ``max_seq``.
        Text prompts are encoded as ``tandem generate --prompt`` encodes them (with the
        tokenizer's BOS).

        Returns a :class:`Generation`; with ``stream=True`` an iterator that yields each
        token id as it is made (``(sequence, token)`` pairs for a batch), whose ``result``
        holds the Generation once it is exhausted. Ctrl-C ends the generation at the next
        token and raises KeyboardInterrupt.
        """
        prompts, batched = self._prompts(prompt)
        args = (prompts, max_new_tokens, temperature, top_k, top_p, seed, stop or "", ignore_eos)
        if stream:
            return TokenIterator(self._m.stream(*args), batched)
        return Generation(self._m.generate(*args), batched)

    def logits(self, ids: Prompt) -> np.ndarray:
        """The next-token logits at every position of ``ids`` (token ids, or text): a float32
        array [len(ids), vocab]."""
        return self._m.logits(self._ids(ids))

    def parameters(self) -> Dict[str, np.ndarray]:
        """Every weight under its Hugging Face name, in the Hugging Face state dict's order,
        as float32 NumPy arrays. On the CPU they are views of the model's own memory (no
        copy): writing them changes what the model computes. On a GPU they are read-only
        copies. Hugging Face shapes, except GPT-NeoX's query_key_value, viewed as [heads, 3,
        head_dim, ...] (``.reshape(-1, d_model)`` gives the Hugging Face tensor, as a copy)."""
        return self._m.parameters()


class TokenIterator:
    """The tokens of a streamed generation, as they are made; `result` holds the
    Generation once the iterator is exhausted."""

    def __init__(self, s: Any, batched: bool) -> None:
        self._s = s
        self._batched = batched
        self.result: Optional[Generation] = None

    def __iter__(self) -> "TokenIterator":
        return self

    def __next__(self) -> Any:
        item = self._s.next()
        if item is None:
            r = self._s.result()
            self.result = Generation(r, self._batched) if r is not None else None
            raise StopIteration
        return item if self._batched else item[1]

    def close(self) -> None:
        """Ends the generation early."""
        self._s.close()

    def __del__(self) -> None:
        try:
            self._s.close()
        except Exception:
            pass


def load(path: Union[str, os.PathLike], device: str = "cpu", batch: int = 1,
         max_seq: Optional[int] = None, mem_limit: Optional[int] = None) -> Model:
    """Loads a tandem checkpoint or a Hugging Face model directory (GPT2LMHeadModel,
    LlamaForCausalLM, GPTNeoXForCausalLM) onto ``device`` ("cpu" or "cuda"), with a KV cache
    for ``batch`` sequences of ``max_seq`` positions (default: the model's context).
    ``mem_limit`` (bytes) bounds what it may hold; a model that does not fit is refused,
    saying by how much."""
    return Model(path, device, batch, max_seq, mem_limit)


def plan(model: str = "gpt2-tiny", ranks: int = 1, batch: int = 4, seq: int = 64,
         micro_steps: int = 1, max_gathered: int = 2, shard_group: int = 0,
         strategy: Optional[str] = None, hardware: str = "cpu-local",
         compute_probe: Optional[str] = None, links_probe: Optional[str] = None,
         tflops: Optional[float] = None, hbm_GBps: Optional[float] = None,
         mem_GiB: Optional[float] = None, link_GBps: Optional[float] = None,
         link_latency_us: Optional[float] = None, dtype: str = "auto") -> Dict[str, Any]:
    """The planner of ``tandem plan``: for each strategy (or ``strategy`` alone), the
    predicted step time, exposed communication and peak memory per rank on ``hardware``
    (a preset of :func:`hardware_presets`, then probe files, then single figures) in
    ``dtype`` ("auto": the hardware's, bf16 on GPUs and fp32 on CPUs; "bf16"; "fp32"). Returns a
    dict: hardware, strategies (a dict each), recommended (a strategy name or None), why,
    overlap, notes, report (the table ``tandem plan`` prints)."""
    return _tandem.plan(model, ranks, batch, seq, micro_steps, max_gathered, shard_group,
                        strategy, hardware, compute_probe, links_probe, tflops, hbm_GBps,
                        mem_GiB, link_GBps, link_latency_us, dtype)


def prepare_text_files(texts: Sequence[Union[str, os.PathLike]], out: Union[str, os.PathLike],
                       tokenizer: Optional[Tokenizer] = None, threads: int = 0) -> Dict[str, int]:
    """What ``tandem data prepare`` does: writes the token file ``out`` from text files,
    byte-level (the byte-level presets' vocabulary), or with ``tokenizer`` (each file one
    document, EOS between them, on ``threads`` threads; 0: every core). Returns the counts
    of files, bytes and tokens."""
    return _tandem.prepare_text_files([os.fspath(t) for t in texts], os.fspath(out), tokenizer,
                                      threads)


def write_token_file(out: Union[str, os.PathLike], tokens: Sequence[int]) -> None:
    """Writes token ids as a token file (docs/formats.md), replacing ``out`` once complete."""
    _tandem.write_token_file(os.fspath(out), [int(t) for t in tokens])


def model_presets() -> List[str]:
    """The names of the model presets (``tandem models``)."""
    return _tandem.model_presets()


def hardware_presets() -> List[str]:
    """The names of the planner's hardware presets."""
    return _tandem.hardware_presets()


def model_info(model: str) -> Dict[str, Any]:
    """The shape of a preset, a JSON model config, a checkpoint or a Hugging Face directory."""
    return _tandem.load_model_info(model)


def finalize() -> None:
    """Ends this rank's part of a multi-rank job; called at exit (idempotent)."""
    _tandem.finalize()


@atexit.register
def _finalize_at_exit() -> None:
    import gc
    gc.collect()  # Trainers hold the job's communicators: release them first
    try:
        _tandem.finalize()
    except Exception:
        pass
