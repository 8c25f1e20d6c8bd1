# Type stubs of the tandem package (the documentation is in __init__.py and docs/python.md).
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

class Error(Exception):
    message: str
    call: str
    rank: int

class Tokenizer:
    @staticmethod
    def from_file(path: Union[str, os.PathLike]) -> Tokenizer: ...
    @staticmethod
    def bytes() -> Tokenizer: ...
    def encode(self, text: str, add_special_tokens: bool = ...) -> List[int]: ...
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def bos_id(self) -> Optional[int]: ...
    @property
    def eos_id(self) -> Optional[int]: ...
    @property
    def kind(self) -> str: ...
    def token_to_id(self, token: str) -> Optional[int]: ...
    def id_to_token(self, id: int) -> Optional[str]: ...

class TrainConfig:
    model: str
    data: str
    device: str
    batch: int
    global_batch: int
    seq: int
    steps: int
    seed: int
    lr: float
    min_lr_ratio: float
    warmup: int
    weight_decay: float
    beta1: float
    beta2: float
    eps: float
    grad_clip: float
    strategy: str
    shard_group: int
    max_gathered: int
    recompute: str
    recompute_blocks: Union[int, str]
    loss_chunk: int
    reduce_dtype: str
    cuda_graph: str
    update_at_gather: bool
    ranks: int
    comm_timeout: float
    mem_limit: str
    save: str
    save_every: int
    save_overwrite: bool
    skip_nonfinite: int
    resume: str
    init_from: str
    metrics: str
    progress: str
    log_every: int
    trace: str
    trace_steps: str
    def __init__(self, **options: Any) -> None: ...
    @classmethod
    def from_json(cls, source: Union[str, os.PathLike, Dict[str, Any]]) -> TrainConfig: ...
    def to_dict(self) -> Dict[str, Any]: ...
    def to_json(self) -> str: ...
    def replace(self, **options: Any) -> TrainConfig: ...

StepCallback = Callable[[Dict[str, Any]], None]

class Trainer:
    def __init__(self, config: Union[TrainConfig, Dict[str, Any]]) -> None: ...
    @classmethod
    def resume(cls, dir: Union[str, os.PathLike], **overrides: Any) -> Trainer: ...
    def step(self) -> Dict[str, Any]: ...
    def train(self, steps: Optional[int] = ...,
              callback: Optional[StepCallback] = ...) -> Dict[str, Any]: ...
    def save(self, dir: Union[str, os.PathLike]) -> None: ...
    @property
    def steps_done(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def interrupted(self) -> int: ...
    @property
    def config(self) -> TrainConfig: ...
    @property
    def model(self) -> Dict[str, Any]: ...

class Generation:
    ids: Union[List[int], List[List[int]]]
    text: Union[str, List[str], None]
    finish: Union[str, List[str]]
    prompt_tokens: int
    time_to_first_token_ms: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    peak_mem_bytes: int

Prompt = Union[str, Sequence[int]]

class TokenIterator(Iterator[Any]):
    result: Optional[Generation]
    def __next__(self) -> Any: ...
    def close(self) -> None: ...

class Model:
    device: str
    def __init__(self, path: Union[str, os.PathLike], device: str = ..., batch: int = ...,
                 max_seq: Optional[int] = ..., mem_limit: Optional[int] = ...) -> None: ...
    @property
    def info(self) -> Dict[str, Any]: ...
    @property
    def tokenizer(self) -> Optional[Tokenizer]: ...
    @property
    def max_seq(self) -> int: ...
    @property
    def batch(self) -> int: ...
    @property
    def eos_ids(self) -> List[int]: ...
    def generate(self, prompt: Union[Prompt, Sequence[Prompt]], max_new_tokens: int = ...,
                 temperature: float = ..., top_k: int = ..., top_p: float = ..., seed: int = ...,
                 stop: Optional[str] = ..., ignore_eos: bool = ...,
                 stream: bool = ...) -> Union[Generation, TokenIterator]: ...
    def logits(self, ids: Prompt) -> np.ndarray: ...
    def parameters(self) -> Dict[str, np.ndarray]: ...

def load(path: Union[str, os.PathLike], device: str = ..., batch: int = ...,
         max_seq: Optional[int] = ..., mem_limit: Optional[int] = ...) -> Model: ...
def plan(model: str = ..., ranks: int = ..., batch: int = ..., seq: int = ...,
         micro_steps: int = ..., max_gathered: int = ..., shard_group: int = ...,
         strategy: Optional[str] = ..., hardware: str = ...,
         compute_probe: Optional[str] = ..., links_probe: Optional[str] = ...,
         tflops: Optional[float] = ..., hbm_GBps: Optional[float] = ...,
         mem_GiB: Optional[float] = ..., link_GBps: Optional[float] = ...,
         link_latency_us: Optional[float] = ..., dtype: str = ...) -> Dict[str, Any]: ...
def prepare_text_files(texts: Sequence[Union[str, os.PathLike]], out: Union[str, os.PathLike],
                       tokenizer: Optional[Tokenizer] = ..., threads: int = ...) -> Dict[str, int]: ...
def write_token_file(out: Union[str, os.PathLike], tokens: Sequence[int]) -> None: ...
def model_presets() -> List[str]: ...
def hardware_presets() -> List[str]: ...
def model_info(model: str) -> Dict[str, Any]: ...
def finalize() -> None: ...
