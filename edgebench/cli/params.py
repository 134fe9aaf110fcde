"""Command-line flags made from a probe kind's typed params, so a knob has one name and one check
everywhere: the field `min_seconds` is the flag `--min-seconds` and the suite key `min_seconds`.

`probe_flags(KIND)` decorates a command function whose signature holds the verb's own options (device,
store, --json ...) and a `params` argument: the decorated command offers one flag per field of the kind's
params (help, unit and default from the field), and calls the function with `params` set to the checked,
typed params. A bad value is one line naming the flag, exit 2.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from ..errors import UserError
from ..probes.params import ParamError, ProbeParams, Spec
from ..probes.registry import params_class

F = TypeVar("F", bound=Callable[..., Any])

# Kinds given as repeatable flags (each value may also be a comma list).
_LISTS = ("choices", "strs", "ints", "cpus", "gemms", "shapes")
_JOINED = ("choices", "strs", "ints", "cpus")  # repeated values joined into one comma list


def flag_help(spec: Spec, default: Any) -> str:
    """The field's help with its unit, choices and default, as `--help` shows them."""
    parts = [spec.help.rstrip(".") + "."]
    if spec.choices and spec.kind in ("choice", "choices"):
        parts.append(f"One of {', '.join(spec.choices)}.")
    if spec.kind in _LISTS:
        parts.append("Repeatable.")
    if default not in (None, (), {}, "") and spec.kind != "bool":
        unit = f" {spec.unit}" if spec.unit else ""
        parts.append(
            f"Default: {default:g}{unit}." if isinstance(default, float) else f"Default: {default}{unit}."
        )
    # Help is plain text (the app turns Rich markup off), so brackets are shown as written.
    return " ".join(parts)


def option_for(name: str, spec: Spec, default: Any) -> tuple[Any, Any]:
    """(annotation, typer.Option) of one field's flag; None means 'not given' (the field's default)."""
    flag = spec.cli_flag(name)
    help_text = flag_help(spec, default)
    if spec.kind == "bool":
        negative = "--no-" + flag[2:]
        return bool | None, typer.Option(None, f"{flag}/{negative}", help=help_text, show_default=False)
    if spec.kind == "int":
        return int | None, typer.Option(None, flag, help=help_text, show_default=False)
    if spec.kind == "float":
        return float | None, typer.Option(None, flag, help=help_text, show_default=False)
    if spec.kind in _LISTS:
        return list[str] | None, typer.Option(None, flag, help=help_text, show_default=False)
    return str | None, typer.Option(None, flag, help=help_text, show_default=False)


def flag_fields(cls: type[ProbeParams], skip: tuple[str, ...] = ()) -> list[tuple[str, Spec, Any]]:
    return [(n, s, d) for n, s, d in cls.fields() if s.cli and n not in skip]


def parse_flags(
    cls: type[ProbeParams], given: dict[str, Any], extra: dict[str, Any] | None = None
) -> ProbeParams:
    """The typed params from the flags given (plus values the command sets itself); a bad value is a
    UserError naming the flag."""
    specs = {n: s for n, s, _ in cls.fields()}
    raw: dict[str, Any] = dict(extra or {})
    for name, value in given.items():
        if value is None or value == []:
            continue
        kind = specs[name].kind
        if kind in _JOINED and isinstance(value, list):
            value = ",".join(value)
        elif kind == "gemms" and isinstance(value, list) and [v.lower() for v in value] == ["none"]:
            value = False
        raw[name] = value
    try:
        return cls.parse(raw, origin="code")
    except ParamError as exc:
        name = exc.key.split(".")[0]
        where = specs[name].cli_flag(name) if name in specs and specs[name].cli else name
        raise UserError(f"{where}: {exc.reason}") from None


def probe_flags(kind: str, skip: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Give the command one flag per CLI field of `kind`'s params; it receives them as `params`."""
    cls = params_class(kind)

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
        own = [p for p in signature.parameters.values() if p.name != "params"]
        taken = {p.name for p in own}
        fields = [(n, s, d) for n, s, d in flag_fields(cls, skip) if n not in taken]
        generated = []
        annotations = {p.name: hints.get(p.name, Any) for p in own}
        for name, spec, default in fields:
            annotation, option = option_for(name, spec, default)
            generated.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option))
            annotations[name] = annotation
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            given = {n: kwargs.pop(n) for n, _, _ in fields}
            return fn(params=parse_flags(cls, given), **kwargs)

        command.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=own + generated, return_annotation=signature.return_annotation
        )
        command.__annotations__ = {**annotations, "return": hints.get("return", Any)}
        return command  # type: ignore[return-value]

    return decorate


def refuse_native_only(params: ProbeParams, agent: str, device: str, source: str) -> None:
    """Flags for native runners on a device that runs the Python agent: one line naming the flag."""
    if agent == "native":
        return
    for name, spec, default in params.fields():
        if spec.native_only and getattr(params, name) != default:
            raise UserError(
                f"{spec.cli_flag(name)} applies to native runners; {device} runs the Python agent ({source})"
            )
