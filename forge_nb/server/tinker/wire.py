"""The Tinker SDK's protobuf bodies, with its own generated module (`tinker.proto.tinker_public_pb2`): a
forward_backward request read into `Datums`, every field checked (an error names it: ``data[3].loss_fn_inputs
.weights: 12 values, the model input has 13 tokens``), and the forward_backward and sample results written as
the SDK reads them (it takes those two only as protobuf).

Layouts (`tinker/proto/request_conv.py`, `response_conv.py` in the SDK): a datum's model input is chunks of
int32 little-endian tokens; a loss input is a `Tensor` (float32 or int64, dense bytes, or sparse CSR for 2-D
ones); a result's per-datum arrays are one `BatchedTensor` per field, its datums' bytes concatenated with byte
`offsets` (B + 1 of them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError
from tinker.proto import tinker_public_pb2 as pb

from forge_nb.rl import tinker_losses
from forge_nb.rl.target_batch import Datums

_NUMPY = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


class BadRequest(ValueError):
    """What the API answers with 400 and Tinker's error body: the message names the field."""


@dataclass(frozen=True)
class Limits:
    """What a request must fit: token ids below `vocab_size`, sequences of at most `context` tokens."""

    vocab_size: int
    context: int


@dataclass(frozen=True)
class ForwardBackwardCall:
    """One forward_backward request (one chunk of an SDK call), read and checked."""

    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float]
    forward_only: bool
    datums: Datums

    @property
    def key(self) -> tuple:
        """Requests with equal keys run as one batch (their losses are sums: merged, the gradient is theirs)."""
        return (self.loss_fn, tuple(sorted(self.config.items())), self.forward_only, tuple(sorted(self.datums.inputs)))


def read_forward_backward(body: bytes, limits: Limits) -> ForwardBackwardCall:
    """A `ForwardBackwardRequest` body -> the call; `BadRequest` naming what is wrong."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except DecodeError as e:
        raise BadRequest(f"the body is not a protobuf ForwardBackwardRequest ({e})") from None
    loss = msg.loss_fn
    if loss not in tinker_losses.LOSSES:
        served = ", ".join(tinker_losses.LOSSES)
        raise BadRequest(f"loss_fn: {loss!r} is not served by forge_nb's Tinker API (served: {served})")
    if msg.loss_fn_config_v2:
        raw = {k: v.number if v.WhichOneof("value") == "number" else v.text for k, v in msg.loss_fn_config_v2.items()}
    else:
        raw = dict(msg.loss_fn_config)
    try:
        config = tinker_losses.check_config(loss, raw)
    except ValueError as e:
        raise BadRequest(str(e)) from None
    if not msg.data:
        raise BadRequest("data: no datums")
    rows = [_datum(i, d, loss, limits) for i, d in enumerate(msg.data)]
    names = sorted({k for _, _, inputs in rows for k in inputs})
    for i, (_, _, inputs) in enumerate(rows):  # one batch: every datum gives the same optional inputs
        for name in names:
            if name not in inputs:
                first = _first_with(rows, name)
                raise BadRequest(f"data[{i}].loss_fn_inputs.{name}: missing, and datum {first} has it")
    datums = Datums(
        [tokens for tokens, _, _ in rows],
        [targets for _, targets, _ in rows],
        {name: [inputs[name] for _, _, inputs in rows] for name in names},
    )
    return ForwardBackwardCall(msg.model_id, msg.seq_id, loss, config, msg.forward_only, datums)


def _first_with(rows: list, name: str) -> int:
    return next(i for i, (_, _, inputs) in enumerate(rows) if name in inputs)


def _datum(i: int, d: pb.Datum, loss: str, limits: Limits) -> tuple[list[int], list[int], dict[str, list[float]]]:
    """Datum `i` -> (its tokens, its target tokens, its float loss inputs), checked."""
    where = f"data[{i}]"
    tokens = model_input(d.model_input, limits, f"{where}.model_input")
    spec = tinker_losses.LOSSES[loss]
    accepted = spec.accepted_inputs
    for key in d.loss_fn_inputs:
        if key not in accepted:
            takes = ", ".join(accepted)
            raise BadRequest(f"{where}.loss_fn_inputs.{key}: not an input of {loss} (its inputs: {takes})")
    for key in ("target_tokens", *spec.inputs):
        if key not in d.loss_fn_inputs:
            raise BadRequest(f"{where}.loss_fn_inputs.{key}: missing ({loss} needs {', '.join(accepted[:3])})")
    n = len(tokens)
    arrays = {key: _tensor(d.loss_fn_inputs[key], n, f"{where}.loss_fn_inputs.{key}") for key in d.loss_fn_inputs}
    targets = arrays.pop("target_tokens")
    if targets.dtype.kind != "i":
        raise BadRequest(f"{where}.loss_fn_inputs.target_tokens: token ids must be integers, got {targets.dtype}")
    _in_vocabulary(targets, limits, f"{where}.loss_fn_inputs.target_tokens")
    inputs = {}
    for key, values in arrays.items():
        values = values.astype(np.float64)
        if not np.isfinite(values).all():
            at = int(np.flatnonzero(~np.isfinite(values))[0])
            raise BadRequest(f"{where}.loss_fn_inputs.{key}: {values[at]} at position {at}; values must be finite")
        inputs[key] = values.tolist()
    return tokens, targets.tolist(), inputs


def model_input(chunks, limits: Limits, where: str) -> list[int]:
    """A model input's chunks (protobuf `Chunk`s, or the JSON `ModelInput`'s) -> its tokens, checked: text
    chunks only, ids in the vocabulary, within the context."""
    tokens: list[int] = []
    for j, chunk in enumerate(chunks):
        if isinstance(chunk, pb.Chunk):
            kind = chunk.WhichOneof("chunk")
            ids = np.frombuffer(chunk.encoded_text.tokens, dtype="<i4") if kind == "encoded_text" else None
        else:
            kind = chunk.type
            ids = np.asarray(chunk.tokens, dtype=np.int64) if kind == "encoded_text" else None
        if ids is None:
            raise BadRequest(f"{where}[{j}]: {kind} chunks are not served (forge_nb serves text: encoded_text)")
        tokens.extend(ids.tolist())
    if not tokens:
        raise BadRequest(f"{where}: no tokens")
    _in_vocabulary(np.asarray(tokens), limits, where)
    if len(tokens) > limits.context:
        raise BadRequest(f"{where}: {len(tokens)} tokens, more than the model's context of {limits.context}")
    return tokens


def _in_vocabulary(ids: np.ndarray, limits: Limits, where: str) -> None:
    bad = np.flatnonzero((ids < 0) | (ids >= limits.vocab_size))
    if len(bad):
        at = int(bad[0])
        raise BadRequest(
            f"{where}: token {int(ids[at])} at position {at} is outside the model's vocabulary "
            f"(ids 0..{limits.vocab_size - 1})"
        )


def _tensor(t: pb.Tensor, n: int, where: str) -> np.ndarray:
    """A loss input -> its N values; `BadRequest` unless it is one value per position of the model input."""
    dtype = _NUMPY.get(t.dtype)
    if dtype is None:
        raise BadRequest(f"{where}: dtype {pb.DType.Name(t.dtype)} is not served (float32 or int64)")
    shape = list(t.shape)
    if len(shape) > 1 or t.WhichOneof("encoding") == "sparse_csr":
        raise BadRequest(f"{where}: shape {shape}: only one value per position ([N]) is served")
    raw = t.dense
    if len(raw) % np.dtype(dtype).itemsize:
        raise BadRequest(f"{where}: {len(raw)} bytes are not a whole number of {np.dtype(dtype).name} values")
    values = np.frombuffer(raw, dtype=dtype)
    if shape and shape[0] != len(values):
        raise BadRequest(f"{where}: shape {shape} but {len(values)} values")
    if len(values) != n:
        raise BadRequest(f"{where}: {len(values)} values, the model input has {n} tokens (one per position)")
    return values


def forward_backward_output(logprobs: list[list[float]], metrics: dict[str, float]) -> bytes:
    """The `ForwardBackwardOutput` of B datums: each one's ``logprobs`` of its targets, and `metrics`
    (``name:reduction`` keys)."""
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    record = out.loss_fn_outputs.add(num_datums=len(logprobs))
    _batched(record.fields["logprobs"], [np.asarray(row, dtype=np.float32) for row in logprobs])
    for key, value in metrics.items():
        out.metrics[key] = float(value)
    return out.SerializeToString()


def _batched(field: pb.BatchedTensor, arrays: list[np.ndarray]) -> None:
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.nbytes for a in arrays], out=offsets[1:])
    field.data = b"".join(a.tobytes() for a in arrays)
    field.offsets = offsets.tobytes()
    field.dtype = pb.DTYPE_FLOAT32


@dataclass(frozen=True)
class Sequence:
    """One sampled sequence: its tokens (the stop token included), their logprobs, "stop" or "length"."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: str


def sample_response(sequences: list[Sequence], prompt_logprobs: list[float] | None = None) -> bytes:
    """A `SampleResponse`; `prompt_logprobs` (when asked) has one value per prompt token, NaN at position 0."""
    out = pb.SampleResponse()
    for s in sequences:
        reason = pb.STOP_REASON_STOP if s.stop_reason == "stop" else pb.STOP_REASON_LENGTH
        out.sequences.add(
            stop_reason=reason,
            tokens=np.asarray(s.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(s.logprobs, dtype=np.float32).tobytes(),
        )
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return out.SerializeToString()
