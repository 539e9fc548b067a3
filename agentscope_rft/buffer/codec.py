"""Samples to storage rows and back, without pickle.

Per-token arrays become little-endian binary blobs: token ids int32, loss mask uint8, log-probs
and token rewards float32. Scalars become columns; `metrics` and `step_states` become JSON text.
Round trips are exact except that log-probs and token rewards come back at float32 precision (a
value `x` comes back as `float(numpy.float32(x))`), and metric values come back as floats.

Every field of `Sample` is listed here once (`SCALAR_FIELDS`, `ARRAY_DTYPES`, `metrics`); a test
fails when `Sample` gains a field this module does not store.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from numbers import Real
from typing import Any

import numpy as np
import numpy.typing as npt

from agentscope_rft.buffer.base import BufferFormatError, BufferInputError
from agentscope_rft.types import Sample

ARRAY_DTYPES: dict[str, np.dtype[Any]] = {
    "token_ids": np.dtype("<i4"),
    "loss_mask": np.dtype("u1"),
    "logprobs": np.dtype("<f4"),
    "token_rewards": np.dtype("<f4"),
}
"""Blob layout of the per-token fields (little-endian, no header)."""

STRING_FIELDS = ("rollout_id", "task_id", "group_id", "stop_reason", "sample_id", "kind")
OPTIONAL_STRING_FIELDS = ("agent_name", "pair_id")
INT_FIELDS = ("policy_version", "num_calls")
FLOAT_FIELDS = ("reward", "temperature")
SCALAR_FIELDS = STRING_FIELDS + OPTIONAL_STRING_FIELDS + INT_FIELDS + FLOAT_FIELDS
STORED_FIELDS = frozenset((*SCALAR_FIELDS, *ARRAY_DTYPES, "metrics", "step_states"))
"""Every `Sample` field the buffer stores."""

_INT32 = np.iinfo(np.int32)


def _array(sample: Sample, name: str, where: str) -> npt.NDArray[Any]:
    values = getattr(sample, name)
    try:
        array = np.asarray(values)
    except (TypeError, ValueError) as err:
        raise BufferInputError(f"{where}: field {name!r} is not a flat list of numbers") from err
    if array.ndim != 1 and not (array.ndim == 0 and array.size == 0):
        raise BufferInputError(f"{where}: field {name!r} must be a flat list, got {array.ndim}-d")
    if array.size == 0:
        return np.zeros(0, dtype=ARRAY_DTYPES[name])
    kinds = "iub" if ARRAY_DTYPES[name].kind in "iu" else "iubf"
    if array.dtype.kind not in kinds:
        expected = "integers" if kinds == "iub" else "numbers"
        raise BufferInputError(f"{where}: field {name!r} must hold {expected}, got {array.dtype}")
    if name == "token_ids" and (array.min() < _INT32.min or array.max() > _INT32.max):
        raise BufferInputError(f"{where}: field 'token_ids' has a value outside int32")
    if name == "loss_mask" and (array.min() < 0 or array.max() > 1):
        raise BufferInputError(f"{where}: field 'loss_mask' must hold only 0 and 1")
    return array.astype(ARRAY_DTYPES[name])


def _metrics_json(metrics: Any, where: str) -> str:
    if not isinstance(metrics, Mapping):
        raise BufferInputError(f"{where}: field 'metrics' must be a mapping of name to number")
    values: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, Real):
            raise BufferInputError(
                f"{where}: field 'metrics' must map names to numbers, got {key!r}: {value!r}"
            )
        values[key] = float(value)
    return json.dumps(values, sort_keys=True)


def _step_states_json(states: Any, where: str) -> str | None:
    if states is None:
        return None
    if isinstance(states, str) or not all(isinstance(s, str) for s in states):
        raise BufferInputError(f"{where}: field 'step_states' must be a list of strings or null")
    return json.dumps(list(states))


def _check_scalars(sample: Sample, where: str) -> None:
    for name in STRING_FIELDS:
        if not isinstance(getattr(sample, name), str):
            raise BufferInputError(f"{where}: field {name!r} must be a string")
    for name in OPTIONAL_STRING_FIELDS:
        if getattr(sample, name) is not None and not isinstance(getattr(sample, name), str):
            raise BufferInputError(f"{where}: field {name!r} must be a string or null")
    for name in INT_FIELDS:
        value = getattr(sample, name)
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise BufferInputError(f"{where}: field {name!r} must be an integer, got {value!r}")
    for name in FLOAT_FIELDS:
        value = getattr(sample, name)
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            raise BufferInputError(
                f"{where}: field {name!r} must be a finite number, got {value!r}"
            )


def sample_where(sample: Sample, index: int) -> str:
    """How an error message names a sample: its index in the call and its best id."""
    name = (sample.sample_id or sample.rollout_id) if isinstance(sample, Sample) else None
    return f"samples[{index}]" + (f" ({name})" if name else "")


def encode_sample(sample: Sample, where: str) -> dict[str, Any]:
    """The storage row of `sample`: scalar columns, array blobs and `metrics_json`.

    Raises:
        BufferInputError: a field cannot be stored; the message starts with `where`.

    Example:
        >>> row = encode_sample(Sample([1, 2], [0, 1], [0.0, -0.5], 1.0, "r", "t"), "s")
        >>> len(row["token_ids"]), row["num_tokens"]
        (8, 2)
    """
    if not isinstance(sample, Sample):
        raise BufferInputError(f"{where}: expected a Sample, got {type(sample).__name__}")
    _check_scalars(sample, where)
    row: dict[str, Any] = {name: getattr(sample, name) for name in SCALAR_FIELDS}
    row["policy_version"] = int(sample.policy_version)
    row["num_calls"] = int(sample.num_calls)
    row["reward"] = float(sample.reward)
    row["temperature"] = float(sample.temperature)
    for name in ARRAY_DTYPES:
        row[name] = None
        if name != "token_rewards" or sample.token_rewards is not None:
            row[name] = _array(sample, name, where).tobytes()
    row["num_tokens"] = len(sample.token_ids)
    row["metrics_json"] = _metrics_json(sample.metrics, where)
    row["step_states_json"] = _step_states_json(sample.step_states, where)
    return row


def _decode_array(blob: bytes, name: str, num_tokens: int, where: str) -> list[Any]:
    dtype = ARRAY_DTYPES[name]
    if len(blob) != num_tokens * dtype.itemsize:
        raise BufferFormatError(
            f"{where}: field {name!r} has {len(blob)} bytes, expected {num_tokens} x "
            f"{dtype.itemsize}; the stored sample is damaged"
        )
    values: list[Any] = np.frombuffer(blob, dtype=dtype).tolist()
    return values


def decode_sample(row: Mapping[Any, Any]) -> Sample:
    """The `Sample` stored in `row` (inverse of `encode_sample`)."""
    where = f"stored sample {row.get('sample_id') or row.get('rollout_id')!r}"
    num_tokens = int(row["num_tokens"])
    values: dict[str, Any] = {name: row[name] for name in SCALAR_FIELDS}
    for name in ARRAY_DTYPES:
        blob = row[name]
        values[name] = None if blob is None else _decode_array(bytes(blob), name, num_tokens, where)
    values["metrics"] = json.loads(row["metrics_json"])
    states = row.get("step_states_json")
    values["step_states"] = None if states is None else json.loads(states)
    return Sample(**values)


def sample_to_json(sample: Sample, fields: tuple[str, ...]) -> dict[str, Any]:
    """The JSON object of `sample` restricted to `fields` (lists for arrays, in field order)."""
    data: dict[str, Any] = {}
    for name in fields:
        value = getattr(sample, name)
        if name in ARRAY_DTYPES and value is not None:
            value = list(value)
        elif name == "metrics":
            value = dict(value)
        elif name == "step_states" and value is not None:
            value = list(value)
        data[name] = value
    return data
