"""The Tinker API's state in a session, and every request it serves turned into an answer or queued work.

State: Tinker's client sessions (`create_session`, heartbeats, `finish`), the one model being trained (the
session's trainer: a second model while the first one's client is alive is refused; once its client finished or
went quiet, a new create_model takes the trainer over, afresh), sampling sessions, checkpoints
(`checkpoints.CheckpointStore`), and the request ids already given (a retried request, the same model or sampling
session and seq_id, gets its first id back: the SDK retries a POST whose answer it did not get).

Requests are read with the SDK's own types (`tinker.types`; forward_backward's protobuf body with `wire`); what is
wrong with one is a `BadRequest` naming the field (400), an unknown id a `NotFound` (404). Model creation, training
calls, saves and loads go to the `TrainingQueue` in arrival order, samples to the `SamplingQueue`; each answers a
future (`futures.Futures`).
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tinker import types

from forge_nb.parallel.policy import AdamStep
from forge_nb.server.tinker import wire
from forge_nb.server.tinker.checkpoints import CheckpointStore, NotFound
from forge_nb.server.tinker.futures import Futures
from forge_nb.server.tinker.mesh import SampleJob, TinkerMesh, sampling_params
from forge_nb.server.tinker.queues import SamplingQueue, TrainingQueue
from forge_nb.server.tinker.wire import BadRequest

ALIVE_S = 45.0  # a client session heard from within this long holds its model (the SDK heartbeats every 10 s)
MAX_SAMPLES = 1024  # num_samples of one request at most

#: What the SDK learns of this server first (`ClientConfigResponse`): plain httpx (no pyqwest), uncompressed
#: forward_backward bodies, custom losses on the client, one retrieve_future per request.
CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "use_pyqwest_transport": False,
    "proto_compress_fwdbwd": False,
    "parallel_fwdbwd_chunks": True,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
}


@dataclass
class ClientSession:
    """A Tinker client session (a `ServiceClient`)."""

    session_id: str
    user_metadata: dict | None = None
    last_seen: float = field(default_factory=time.monotonic)
    finished: bool = False

    @property
    def alive(self) -> bool:
        return not self.finished and time.monotonic() - self.last_seen < ALIVE_S


@dataclass
class TrainingModel:
    """The model a Tinker client trains: the session's trainer, as that client asked for it."""

    model_id: str
    session_id: str
    base_model: str
    lora_rank: int  # 0: every weight
    user_metadata: dict | None = None
    created: float = field(default_factory=time.time)
    last_request: float = field(default_factory=time.time)
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = False


@dataclass(frozen=True)
class Sampler:
    """A sampling session: of the model being trained (its weights as the generators serve them), or of the
    base model (`base`: served only while the generators serve the fresh model's outputs)."""

    sampler_id: str
    model_id: str | None
    base_model: str
    model_path: str | None
    base: bool = False


class TinkerService:
    """The Tinker API of `session` (see the module docstring)."""

    def __init__(self, session) -> None:
        self.session = session
        self.mesh = TinkerMesh(session)
        self.futures = Futures()
        self.training = TrainingQueue(self.mesh, self.futures)
        self.sampling = SamplingQueue(self.mesh, self.futures)
        self.checkpoints = CheckpointStore(Path(session.run_dir) / "tinker")
        self.sessions: dict[str, ClientSession] = {}
        self.model: TrainingModel | None = None
        self.replaced: dict[str, str] = {}  # model id -> the one that took the trainer over
        self.samplers: dict[str, Sampler] = {}
        self._given: dict[tuple[str, int], str] = {}  # (model or sampler id, seq_id) -> request id
        self._lock = threading.Lock()

    def stop(self) -> None:
        self.futures.fail_pending("forge_nb: the session's Tinker API stopped")
        self.training.stop()
        self.sampling.stop()

    def busy(self) -> bool:
        """Whether a Tinker client is at work: a request not answered yet, or a client session heard from lately
        (the session's server does not end itself for want of a client meanwhile)."""
        with self._lock:
            alive = any(c.alive for c in self.sessions.values())
        return alive or self.futures.pending() > 0

    # -- client sessions ---------------------------------------------------------------------------------------
    def create_session(self, body: dict) -> dict:
        request = types.CreateSessionRequest.model_validate(body)
        session_id = f"tsess-{secrets.token_hex(4)}"
        with self._lock:
            self.sessions[session_id] = ClientSession(session_id, request.user_metadata)
        return {"session_id": session_id}

    def heartbeat(self, body: dict) -> dict:
        request = types.SessionHeartbeatRequest.model_validate(body)
        self._client(request.session_id).last_seen = time.monotonic()
        return {"type": "session_heartbeat"}

    def finish(self, session_id: str) -> dict:
        self._client(session_id).finished = True
        return {}

    def _client(self, session_id: str) -> ClientSession:
        with self._lock:
            client = self.sessions.get(session_id)
        if client is None:
            raise NotFound(f"no Tinker session {session_id!r} in this forge_nb session (create_session first)")
        return client

    def capabilities(self) -> dict:
        name = self.mesh.model_dir
        supported = [types.SupportedModel(model_name=name, max_context_length=self.mesh.limits.context)]
        return types.GetServerCapabilitiesResponse(supported_models=supported).model_dump(mode="json")

    # -- the model ------------------------------------------------------------------------------------------------
    def create_model(self, body: dict) -> dict:
        request = types.CreateModelRequest.model_validate(body)
        if request.optimizer_config.type != "adamw":
            raise BadRequest(f"optimizer_config.type: {request.optimizer_config.type!r} is not served (adamw is)")
        lora = request.lora_config
        rank = 0 if lora is None else lora.rank
        model = TrainingModel(
            f"{request.session_id}:train:{request.model_seq_id}",
            request.session_id,
            request.base_model,
            rank,
            request.user_metadata,
            train_attn=lora is None or lora.train_attn,
            train_mlp=lora is None or lora.train_mlp,
            train_unembed=lora is not None and lora.train_unembed,
        )
        self._check_base_model(request.base_model, "base_model")
        self.mesh.lora_config(rank, model.train_attn, model.train_mlp)  # a rank or targets it cannot serve: 400 now
        return self._take_over(model, lambda: self.mesh.make_model(rank, model.train_attn, model.train_mlp), None)

    def _take_over(self, model: TrainingModel, make, then) -> dict:
        """Queue making `model` the session's model (`make`, then `then`) -> the future's ids."""
        self._client(model.session_id)
        with self._lock:
            key = (model.model_id, -1)
            if key in self._given:
                return {"request_id": self._given[key], "model_id": model.model_id}
            holder = self.model
            if holder is not None and holder.session_id != model.session_id:  # (a client may replace its own)
                owner = self.sessions.get(holder.session_id)
                if owner is not None and owner.alive:
                    raise BadRequest(
                        f"base_model: this forge_nb session trains one model at a time, and {holder.model_id} (of "
                        "a Tinker session still heartbeating) holds its trainer; finish that ServiceClient (or let "
                        "it stop) first, or start another forge_nb session for a second model"
                    )
            request_id = self.futures.new()
            self._given[key] = request_id

        def run() -> dict:
            make()
            with self._lock:
                if self.model is not None and self.model.model_id != model.model_id:
                    self.replaced[self.model.model_id] = model.model_id
                self.model = model
            result = then() if then is not None else None
            return result or {"model_id": model.model_id, "type": "create_model"}

        self.training.submit(request_id, run)
        return {"request_id": request_id, "model_id": model.model_id}

    def get_info(self, body: dict) -> dict:
        request = types.GetInfoRequest.model_validate(body)
        model = self._model(request.model_id)
        data = types.ModelData(arch=self.mesh.arch, model_name=self.mesh.model_dir, tokenizer_id=self.mesh.model_dir)
        return types.GetInfoResponse(
            type="get_info",
            model_data=data,
            model_id=model.model_id,
            is_lora=model.lora_rank > 0,
            lora_rank=model.lora_rank or None,
            model_name=self.mesh.model_dir,
        ).model_dump(mode="json", exclude_none=True)

    def _model(self, model_id: str) -> TrainingModel:
        """The model `model_id` names: the one being trained, else why not."""
        with self._lock:
            model = self.model
            if model is not None and model.model_id == model_id:
                model.last_request = time.time()
                return model
            if model_id in self.replaced:
                raise BadRequest(
                    f"model_id: {model_id} no longer trains: {self.replaced[model_id]} took the session's trainer "
                    "over (one model at a time); its checkpoints stay loadable"
                )
        raise NotFound(f"model_id: no model {model_id!r} in this forge_nb session (create_model first)")

    def _check_base_model(self, name: str, where: str) -> None:
        if not self.mesh.is_base_model(name):
            s = self.session.config.model.path
            raise BadRequest(
                f"{where}: {name!r} is not this session's model; it serves {s!r} ({self.mesh.model_dir}): pass "
                "either (another model needs a forge_nb session of its own)"
            )

    def _seq(self, owner: str, seq_id: int | None) -> tuple[str, bool]:
        """A request id for (`owner`, `seq_id`) -> (it, whether it is new): a retried request gets its first id."""
        with self._lock:
            key = (owner, seq_id if seq_id is not None else -2)
            if seq_id is not None and key in self._given:
                return self._given[key], False
            request_id = self.futures.new()
            if seq_id is not None:
                self._given[key] = request_id
            return request_id, True

    # -- training -----------------------------------------------------------------------------------------------
    def forward_backward(self, body: bytes) -> dict:
        call = wire.read_forward_backward(body, self.mesh.limits)
        self._model(call.model_id)
        request_id, new = self._seq(call.model_id, call.seq_id)
        if new:
            self.training.submit_forward_backward(request_id, call)
        return {"request_id": request_id, "model_id": call.model_id}

    def optim_step(self, body: dict) -> dict:
        request = types.OptimStepRequest.model_validate(body)
        model = self._model(request.model_id)
        params = request.optim_params
        if not isinstance(params, types.AdamParams):
            raise BadRequest(f"optim_params: {getattr(params, 'type', params)!r} is not served (AdamParams is)")
        for name in ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"):
            value = getattr(params, name)
            if not value >= 0 or value != value or value == float("inf"):
                raise BadRequest(f"adam_params.{name}: {value}; a finite number >= 0")
        if not (params.beta1 < 1 and params.beta2 < 1):
            raise BadRequest("adam_params.beta1, beta2: each must be < 1")
        step = AdamStep(
            params.learning_rate, params.beta1, params.beta2, params.eps, params.weight_decay, params.grad_clip_norm
        )
        run = lambda: {"metrics": self._metrics(self.mesh.optim_step(step))}  # noqa: E731
        return self._queue(model.model_id, request.seq_id, run)

    @staticmethod
    def _metrics(metrics: dict[str, float]) -> dict[str, float]:
        return {"grad_norm:mean": metrics["grad_norm"], "policy_version:max": float(metrics["policy_version"])}

    def _queue(self, model_id: str, seq_id: int | None, run) -> dict:
        request_id, new = self._seq(model_id, seq_id)
        if new:
            self.training.submit(request_id, run)
        return {"request_id": request_id, "model_id": model_id}

    # -- weights -----------------------------------------------------------------------------------------------
    def save_weights(self, body: dict) -> dict:
        request = types.SaveWeightsRequest.model_validate(body)
        model = self._model(request.model_id)
        name = request.path or f"{request.seq_id or 0:06d}"
        self.checkpoints.check_name(name)

        def run() -> dict:  # (the folder is made in turn: a retried request never empties a saved one)
            path, folder = self.checkpoints.new(model.model_id, "training", name, request.overwrite)
            version = self.mesh.save_state(str(folder))
            self._meta(folder, "training", model, version, request.user_metadata)
            return {"path": path, "type": "save_weights"}

        return self._queue(model.model_id, request.seq_id, run)

    def save_weights_for_sampler(self, body: dict) -> dict:
        request = types.SaveWeightsForSamplerRequest.model_validate(body)
        model = self._model(request.model_id)
        if request.path is None and request.sampling_session_seq_id is None:
            raise BadRequest("path: a name, or sampling_session_seq_id for a sampling client of these weights")
        if request.path is not None:
            self.checkpoints.check_name(request.path)

        def run() -> dict:
            source = f"tinker: save_weights_for_sampler {request.path or ''}".rstrip()
            self.mesh.refresh(source)
            if request.path is None:
                sampler = self._new_sampler(model.model_id, model.base_model, None)
                return {"path": None, "sampling_session_id": sampler.sampler_id, "type": "save_weights_for_sampler"}
            path, folder = self.checkpoints.new(model.model_id, "sampler", request.path)
            version = self.mesh.save_weights(str(folder))
            self._meta(folder, "sampler", model, version, request.user_metadata)
            return {"path": path, "type": "save_weights_for_sampler"}

        return self._queue(model.model_id, request.seq_id, run)

    def _meta(self, folder: Path, kind: str, model: TrainingModel, version: int, user_metadata: Any) -> None:
        self.checkpoints.write_meta(
            folder,
            kind,
            model_id=model.model_id,
            base_model=model.base_model,
            lora_rank=model.lora_rank,
            train_attn=model.train_attn,
            train_mlp=model.train_mlp,
            policy_version=version,
            user_metadata=user_metadata,
        )

    def load_weights(self, body: dict) -> dict:
        request = types.LoadWeightsRequest.model_validate(body)
        folder, meta = self.checkpoints.find(request.path, "training")
        optimizer = bool(request.optimizer)

        def load() -> dict:
            self.mesh.load_state(str(folder), optimizer)
            return {"path": request.path, "model_id": model_id, "type": "load_weights"}

        if request.model_id is not None:  # load_state on a training client: into its model
            model = self._model(request.model_id)
            model_id = model.model_id
            if meta["lora_rank"] != model.lora_rank:
                raise BadRequest(
                    f"path: {request.path} holds a model of LoRA rank {meta['lora_rank']}, {model_id} has rank "
                    f"{model.lora_rank} (create a training client from the state instead)"
                )
            return self._queue(model_id, request.seq_id, load)
        if request.session_id is None or request.model_seq_id is None:
            raise BadRequest("model_id, or session_id and model_seq_id (a training client made from the state)")
        model_id = f"{request.session_id}:train:{request.model_seq_id}"
        model = TrainingModel(
            model_id,
            request.session_id,
            meta["base_model"],
            meta["lora_rank"],
            request.user_metadata,
            train_attn=meta.get("train_attn", True),
            train_mlp=meta.get("train_mlp", True),
        )
        make = lambda: self.mesh.make_model(model.lora_rank, model.train_attn, model.train_mlp)  # noqa: E731
        return self._take_over(model, make, load)

    # -- sampling ---------------------------------------------------------------------------------------------
    def create_sampling_session(self, body: dict) -> dict:
        request = types.CreateSamplingSessionRequest.model_validate(body)
        self._client(request.session_id)
        sampler = self._sampler_for(request.model_path, request.base_model)
        return {"type": "create_sampling_session", "sampling_session_id": sampler.sampler_id}

    def _sampler_for(self, model_path: str | None, base_model: str | None) -> Sampler:
        if model_path is not None:
            _, meta = self.checkpoints.find(model_path)
            model = self._model(meta["model_id"])
            return self._new_sampler(model.model_id, model.base_model, model_path)
        if base_model is None:
            raise BadRequest("model_path or base_model: a sampling session samples one of them")
        self._check_base_model(base_model, "base_model")
        return self._new_sampler(None, base_model, None, base=True)

    def _new_sampler(
        self, model_id: str | None, base_model: str, model_path: str | None, base: bool = False
    ) -> Sampler:
        sampler = Sampler(f"samp-{secrets.token_hex(4)}", model_id, base_model, model_path, base)
        with self._lock:
            self.samplers[sampler.sampler_id] = sampler
        return sampler

    def get_sampler(self, sampler_id: str) -> dict:
        sampler = self._sampler(sampler_id)
        return {"sampler_id": sampler.sampler_id, "base_model": sampler.base_model, "model_path": sampler.model_path}

    def _sampler(self, sampler_id: str) -> Sampler:
        with self._lock:
            sampler = self.samplers.get(sampler_id)
        if sampler is None:
            raise NotFound(f"sampling_session_id: no sampling session {sampler_id!r} in this forge_nb session")
        return sampler

    def asample(self, body: dict) -> dict:
        request = types.SampleRequest.model_validate(body)
        if request.sampling_session_id is not None:
            sampler = self._sampler(request.sampling_session_id)
        else:
            sampler = self._sampler_for(request.model_path, request.base_model)
        self._check_serves(sampler)
        for name in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            if getattr(request, name):
                raise BadRequest(f"{name}: not served by forge_nb's Tinker API (0 is)")
        if request.target_prompt_logprobs is not None or request.prompt_logprobs_last_n is not None:
            which = "target_prompt_logprobs" if request.target_prompt_logprobs is not None else "prompt_logprobs_last_n"
            raise BadRequest(f"{which}: not served by forge_nb's Tinker API")
        if not 1 <= request.num_samples <= MAX_SAMPLES:
            raise BadRequest(f"num_samples: {request.num_samples}; from 1 to {MAX_SAMPLES}")
        prompt = wire.model_input(request.prompt.chunks, self.mesh.limits, "prompt.chunks")
        sampling = sampling_params(request.sampling_params, request.num_samples, self.session.config.engine.max_tokens)
        room = self.mesh.limits.context - len(prompt)
        if sampling.max_tokens > room:
            raise BadRequest(
                f"sampling_params.max_tokens: {sampling.max_tokens}; the prompt's {len(prompt)} tokens leave {room} of "
                f"the model's context of {self.mesh.limits.context}"
            )
        owner = request.sampling_session_id or sampler.sampler_id
        request_id, new = self._seq(owner, request.seq_id)
        if new:
            self.sampling.submit(request_id, SampleJob(prompt, sampling, bool(request.prompt_logprobs), request_id))
        sequences = [f"{request_id}-{i}" for i in range(request.num_samples)]
        return {"request_id": request_id, "sample_sequence_ids": sequences}

    def _check_serves(self, sampler: Sampler) -> None:
        """`BadRequest` unless the generators serve what `sampler` samples."""
        if sampler.base:
            fresh = self.mesh.base_version if self.mesh.base_version is not None else 0
            if self.session.generator_version != fresh:
                raise BadRequest(
                    f"base_model: the generators serve the trained policy (v{self.session.generator_version}), not "
                    "the base model; forge_nb serves one set of weights at a time: sample the base before training"
                )
            return
        with self._lock:
            current = self.model.model_id if self.model is not None else None
        if sampler.model_id != current:
            raise BadRequest(
                f"sampling_session_id: {sampler.sampler_id} samples {sampler.model_id}, which no longer trains "
                f"(the session's trainer is {current}'s)"
            )

    # -- checkpoints and runs ------------------------------------------------------------------------------------
    def list_checkpoints(self, model_id: str | None = None) -> dict:
        return types.CheckpointsListResponse(checkpoints=self.checkpoints.listed(model_id)).model_dump(mode="json")

    def delete_checkpoint(self, model_id: str, checkpoint_id: str) -> dict:
        self.checkpoints.delete(model_id, checkpoint_id)
        return {}

    def training_run(self, model_id: str) -> dict:
        with self._lock:
            model = self.model if self.model is not None and self.model.model_id == model_id else None
        if model is None:
            raise NotFound(f"no training run {model_id!r} in this forge_nb session")
        return self._run(model).model_dump(mode="json", exclude_none=True)

    def training_runs(self) -> dict:
        with self._lock:
            models = [self.model] if self.model is not None else []
        runs = [self._run(m) for m in models]
        return types.TrainingRunsResponse(training_runs=runs, cursor=_cursor(len(runs))).model_dump(mode="json")

    def _run(self, model: TrainingModel) -> types.TrainingRun:
        checkpoints = self.checkpoints.listed(model.model_id)
        last = {kind: next((c for c in reversed(checkpoints) if c.checkpoint_type == kind), None) for kind in SEGMENTS}
        return types.TrainingRun(
            training_run_id=model.model_id,
            base_model=model.base_model,
            model_owner="forge_nb",
            is_lora=model.lora_rank > 0,
            lora_rank=model.lora_rank or None,
            last_request_time=datetime.fromtimestamp(model.last_request, UTC),
            last_checkpoint=last["training"],
            last_sampler_checkpoint=last["sampler"],
            user_metadata={k: str(v) for k, v in (model.user_metadata or {}).items()} or None,
        )

    def weights_info(self, body: dict) -> dict:
        path = body.get("tinker_path") if isinstance(body, dict) else None
        if not isinstance(path, str):
            raise BadRequest("tinker_path: a tinker:// path")
        _, meta = self.checkpoints.find(path)
        rank = meta["lora_rank"]
        return types.WeightsInfoResponse(
            base_model=meta["base_model"],
            is_lora=rank > 0,
            lora_rank=rank or None,
            train_attn=meta.get("train_attn"),
            train_mlp=meta.get("train_mlp"),
            train_unembed=False,
        ).model_dump(mode="json", exclude_none=True)


SEGMENTS = ("training", "sampler")


def _cursor(total: int) -> Any:
    return types.Cursor(offset=0, limit=max(total, 1), total_count=total)
