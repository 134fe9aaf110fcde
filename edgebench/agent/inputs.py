"""Model inputs: from an .npz file, or random and seeded from the declared shapes and dtypes."""

from __future__ import annotations

from typing import Any

from .session import ANY_RANK, InputInfo


class InputError(Exception):
    """An input cannot be made: unknown name, wrong rank, missing array."""


def resolve_shape(info: InputInfo, override: list[int] | None, warnings: list[str]) -> list[int]:
    if info.shape == ANY_RANK:  # the model does not say even how many dimensions
        if override is None:
            raise InputError(f"input '{info.name}' declares no shape: give it with --shape {info.name}=...")
        check_demands(info, [int(d) for d in override])
        return [int(d) for d in override]
    if override is not None and not info.batch_axis and len(override) == len(info.shape) + 1:
        override = override[1:] if override[0] == 1 else override
    if override is not None and info.fixed and list(override) != list(info.shape):
        raise InputError(fixed_shape_error(info, list(override)))
    if override is not None:
        if len(override) != len(info.shape):
            raise InputError(
                f"--shape {info.name}: rank {len(override)} but the model declares "
                f"{len(info.shape)} dimensions {info.shape}"
            )
        return [int(d) for d in override]
    shape = []
    for axis, dim in enumerate(info.shape):
        if isinstance(dim, int) and dim > 0:
            shape.append(dim)
        else:
            warnings.append(
                f"input '{info.name}' dimension {axis} ({dim or '?'}) is dynamic; using 1 "
                f"(set --shape {info.name}=...)"
            )
            shape.append(1)
    return shape


def check_demands(info: InputInfo, shape: list[int]) -> None:
    """Refuse a shape the layers reading the input cannot take (ncnn runs a convolution over the wrong
    channel count without a word, reading past its weights)."""
    dims = shape[1:] if not info.batch_axis and len(shape) == 4 and shape[0] == 1 else shape
    for axis, size, layer in info.demands:
        if axis == "channels":
            got = dims[-3] if len(dims) >= 3 else 1
            fits = got == size
            said = f"{got} channels"
        else:
            total = 1
            for d in dims:
                total *= d
            fits = size in (total, dims[-1] if dims else 0)
            said = (
                f"{total} values" if not dims or dims[-1] == total else f"rows of {dims[-1]} ({total} values)"
            )
        if not fits:
            raise InputError(
                f"input '{info.name}': shape {shape} gives {said}, but layer {layer} reading it takes "
                f"{size} (from its weights)"
            )


def fixed_shape_error(info: InputInfo, shape: list[int]) -> str:
    return (
        f"input '{info.name}': shape {shape} does not fit the model, made for {info.shape} alone "
        "(an ncnn graph is converted at its input shapes: give the ONNX model with --shape)"
    )


def random_array(np: Any, rng: Any, shape: list[int], dtype: str) -> Any:
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.startswith(("int", "uint")):
        # Small non-negative ids stay valid for embedding lookups and gathers of any size.
        return rng.integers(0, 10, size=shape).astype(dtype)
    return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)


def make_inputs(
    infos: list[InputInfo], shapes: dict[str, list[int]], seed: int, npz_path: str | None, warnings: list[str]
) -> dict[str, Any]:
    import numpy as np

    unknown = set(shapes) - {i.name for i in infos}
    if unknown:
        names = ", ".join(i.name for i in infos)
        raise InputError(f"--shape names unknown input '{sorted(unknown)[0]}' (inputs: {names})")
    arrays: dict[str, Any] = {}
    if npz_path:
        with np.load(npz_path, allow_pickle=False) as data:
            arrays = {k: np.array(data[k], order="C") for k in data.files}  # 0-d arrays stay 0-d
        missing = [i.name for i in infos if i.name not in arrays]
        if missing:
            raise InputError(f"inputs file has no array '{missing[0]}' (it has: {', '.join(sorted(arrays))})")
        for info in infos:
            shape = list(arrays[info.name].shape)
            if not info.batch_axis and len(shape) == len(info.shape) + 1 and shape[0] == 1:
                shape = shape[1:]  # the runtime's own layout: no batch axis (ncnn)
                arrays[info.name] = arrays[info.name].reshape(shape)
            if info.fixed and shape != list(info.shape):
                raise InputError(fixed_shape_error(info, shape))
            check_demands(info, shape)
        return {i.name: arrays[i.name].astype(i.dtype, copy=False) for i in infos}
    rng = np.random.default_rng(seed)
    for info in infos:
        shape = resolve_shape(info, shapes.get(info.name), warnings)
        arrays[info.name] = random_array(np, rng, shape, info.dtype)
    return arrays


def describe(arrays: dict[str, Any]) -> dict[str, dict]:
    return {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in arrays.items()}


def apply_values(
    feeds: dict[str, Any], values: dict[str, float] | None, infos: list[InputInfo]
) -> dict[str, Any]:
    """Inputs given as one value (a sample rate, a flag) filled over the input's shape and dtype."""
    import numpy as np

    if not values:
        return feeds
    declared = {i.name: i for i in infos}
    unknown = [name for name in values if name not in declared]
    if unknown:
        names = ", ".join(declared)
        raise InputError(f"--value names unknown input '{unknown[0]}' (inputs: {names})")
    out = dict(feeds)
    for name, value in values.items():
        shape = feeds[name].shape if name in feeds else ()
        out[name] = np.full(shape, value, dtype=declared[name].dtype)
    return out
