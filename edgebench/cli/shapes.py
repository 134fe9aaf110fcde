"""`--shape` for verbs that take several models: `NAME=DIMS` for every model with an input NAME, and
`MODEL:NAME=DIMS` for one model (MODEL as given on the command line, or its name in the store).

A model-specific shape overrides a plain one for that model; the same input given twice in the same form is
an error (the second would otherwise silently win), and so is a plain shape no model has an input for, a
MODEL prefix that names none of the models, or dims of the wrong rank (the error names the model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import UserError
from ..probes.params import dims_hint


@dataclass(frozen=True)
class ShapeArgs:
    """Parsed --shape values: plain ones, and per model (keyed by the name the user wrote)."""

    plain: dict[str, list[int]] = field(default_factory=dict)
    per_model: dict[str, dict[str, list[int]]] = field(default_factory=dict)


def _dims(item: str, text: str) -> list[int]:
    try:
        dims = [int(d) for d in text.lower().replace(",", "x").split("x")]
    except ValueError:
        dims = []
    if not dims or any(d <= 0 for d in dims):
        raise UserError(f"--shape: {item!r}: expected NAME=DIMS like x=1x3x224x224 (positive dimensions)")
    return dims


def parse_shape_args(items: Sequence[str] | None, models: Sequence[str]) -> ShapeArgs:
    """Split --shape values into plain and per-model ones; `models` are the names a prefix may use."""
    known = set(models)
    plain: dict[str, list[int]] = {}
    per: dict[str, dict[str, list[int]]] = {}
    for item in items or []:
        left, sep, right = item.partition("=")
        left = left.strip()
        if not sep or not left:
            raise UserError(f"--shape: {item!r}: expected NAME=DIMS or MODEL:NAME=DIMS{dims_hint(item)}")
        dims = _dims(item, right.strip())
        model, colon, name = left.rpartition(":")
        if colon and model in known:
            target = per.setdefault(model, {})
        else:  # a plain input name, perhaps with a colon in it (TensorFlow's "input:0")
            target, name, model = plain, left, ""
        if name in target:
            where = f"model {model}" if target is not plain else "every model"
            raise UserError(f"--shape: {item!r}: input '{name}' of {where} is given twice")
        target[name] = dims
    return ShapeArgs(plain, per)


def shapes_for(
    args: ShapeArgs, names: Sequence[str], inputs: Mapping[str, int | None], model_label: str
) -> dict[str, list[int]]:
    """The shapes one model takes: plain shapes for the inputs it has, overridden by its own (under any of
    its `names`); `inputs` maps its input names to their rank (None: unknown). A rank that does not match,
    or a model-specific shape for an input it does not have, is an error naming the model."""
    own: dict[str, list[int]] = {}
    for n in names:
        own.update(args.per_model.get(n, {}))
    out = {k: v for k, v in args.plain.items() if k in inputs}
    for name, dims in own.items():
        if name not in inputs:
            raise UserError(
                f"--shape: {model_label}:{name}: {model_label} has no input '{name}' "
                f"(inputs: {', '.join(sorted(inputs)) or 'none'})"
            )
        out[name] = dims
    for name, dims in out.items():
        rank = inputs.get(name)
        if rank is not None and rank != len(dims):
            shown = "x".join(str(d) for d in dims)
            raise UserError(
                f"--shape: {name}={shown}: input '{name}' of {model_label} has {rank} dimensions, "
                f"not {len(dims)}"
            )
    return out


def unused_plain(args: ShapeArgs, inputs_of: Mapping[str, Mapping[str, int | None]]) -> list[str]:
    """Plain shapes no model has an input for."""
    return [name for name in args.plain if not any(name in ins for ins in inputs_of.values())]


def check_plain_used(args: ShapeArgs, inputs_of: Mapping[str, Mapping[str, int | None]]) -> None:
    unused = unused_plain(args, inputs_of)
    if unused:
        listed = "; ".join(f"{m}: {', '.join(sorted(ins)) or 'none'}" for m, ins in inputs_of.items())
        raise UserError(f"--shape: {unused[0]}=...: no model has an input '{unused[0]}' ({listed})")


def onnx_input_ranks(path: object) -> dict[str, int | None]:
    """An ONNX model's graph inputs (initializers excepted) and their ranks."""
    from ..analysis.cost import load_model

    model = load_model(path)  # type: ignore[arg-type]
    inits = {i.name for i in model.graph.initializer}
    out: dict[str, int | None] = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        out[vi.name] = len(tt.shape.dim) if tt.HasField("shape") else None
    return out
