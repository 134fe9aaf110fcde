"""Typed probe params: each probe kind declares one frozen dataclass whose fields say, for every knob, its
kind of value, unit, allowed range or choices, default, and role.

Role `identity` means the knob changes *what* is measured (model shapes, threads, dtype): it identifies
the records. Role `policy` means it only changes how long or how often (runs, seconds, trials): records
measured with different policies pair up. Suites, the CLI and the agent tasks are all validated by the
same `parse`, so a knob has one name and one check everywhere; a bad value is a `ParamError` naming the
key, which the caller turns into one line naming the suite file and probe, or the flag.

Kinds of value (`Spec.kind`):
  int, float, bool, str   one value (floats must be finite; bools are never numbers)
  strs                    a list of names (may be given as "a,b")
  choice / choices        one / a list of the `choices` (a list may be given as "a,b")
  ints                    whole numbers: [1, 2], "1,2,4", "1-4" (sorted, unique); `allow_max` adds "max"
  cpus                    CPU numbers like ints ("4-7", "0,2")
  shapes                  {input: [dims]}; on the command line NAME=1x3x224x224, repeatable
  gemms                   GEMM shapes [[m, n, k], ...] or "1x4096x4096"; false for none
  path                    a host file (relative paths in a suite resolve against the suite file)
  mapping                 a table of values (passed through; its owner checks it)
  table                   the params of another probe kind (`Spec.table`), checked by that kind
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

IDENTITY = "identity"
_SELECTIONS = ("choices", "ints", "gemms", "strs", "mapping", "table")  # what to measure, not what was
POLICY = "policy"
KINDS = (
    "int", "float", "bool", "str", "strs", "choice", "choices", "ints", "cpus", "shapes", "gemms", "path",
    "mapping", "table",
)  # fmt: skip


class ParamError(ValueError):
    """A bad param: `key` names it, the message says what is wrong (no location: the caller adds it)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.reason = message


@dataclass(frozen=True)
class Spec:
    """What a field of a params dataclass is: kept in the field's metadata under "edgebench"."""

    kind: str
    role: str
    help: str
    unit: str = ""
    minimum: float | None = None
    maximum: float | None = None
    positive: bool = False  # > 0 rather than >= minimum
    choices: tuple[str, ...] = ()
    allow_max: bool = False  # ints: "max" stands for every CPU
    flag: str | None = None  # the command-line flag, when it is not --field-name
    cli: bool = True  # offered as a flag on the probe's command
    suite: bool = True  # may be set in a suite (False: filled in by the command that needs it)
    native_only: bool = False  # only devices with agent = "native" (runner binaries) take it
    table: Any = None  # kind "table": the params class (of another probe kind) it holds

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown param kind {self.kind!r}")
        if self.role not in (IDENTITY, POLICY):
            raise ValueError(f"unknown param role {self.role!r}")

    def cli_flag(self, name: str) -> str:
        return self.flag or "--" + name.replace("_", "-")


def param(default: Any, role: str, kind: str, help: str, **spec: Any) -> Any:
    """A params field: `threads: int = param(0, IDENTITY, "int", "Intra-op threads", minimum=0)`."""
    return dataclasses.field(default=default, metadata={"edgebench": Spec(kind, role, help, **spec)})


def spec_of(f: dataclasses.Field[Any]) -> Spec:
    return f.metadata["edgebench"]


P = TypeVar("P", bound="ProbeParams")


@dataclass(frozen=True)
class ProbeParams:
    """Base of every probe kind's params. Subclasses are frozen dataclasses of `param(...)` fields."""

    KIND: ClassVar[str] = ""

    @classmethod
    def fields(cls) -> list[tuple[str, Spec, Any]]:
        """(name, spec, default) of every field, in declaration order."""
        return [(f.name, spec_of(f), f.default) for f in dataclasses.fields(cls)]

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def parse(cls: type[P], raw: Mapping[str, Any], *, origin: str = "suite") -> P:
        """Check every given value and fill the defaults. `origin` "suite" refuses fields a suite may
        not set; "code" (a job built by a command) takes them. Raises ParamError naming the key."""
        specs = {name: spec for name, spec, _ in cls.fields()}
        values: dict[str, Any] = {}
        for key, value in raw.items():
            spec = specs.get(key)
            if spec is None:
                raise ParamError(key, unknown_message(cls, key))
            if origin == "suite" and not spec.suite:
                raise ParamError(key, "is set by the command that needs it, not in a suite")
            values[key] = convert(key, value, spec)
        params = cls(**values)
        params.check()
        return params

    @classmethod
    def of(cls: type[P], job: Any) -> P:
        """The typed params of a job (already checked when the job was made)."""
        return cls.parse(job.params, origin="code")

    def check(self) -> None:
        """Checks across fields; subclasses raise ParamError where two values contradict."""

    def given(self) -> dict[str, Any]:
        """The values that differ from the defaults, as plain JSON values: what a job carries."""
        out = {}
        for name, _, default in self.fields():
            value = getattr(self, name)
            if value != default:
                out[name] = plain(value)
        return out

    def identity(self) -> dict[str, Any]:
        """The identity values every record of the job carries: identity fields set away from their
        default (`threads` always, as version 1 records had it), host paths by file name. Lists that
        select what to measure (dtypes, sizes, kernels) are left out: each record names its own."""
        out = {}
        for name, spec, default in self.fields():
            value = getattr(self, name)
            if spec.role != IDENTITY or spec.native_only or spec.kind in _SELECTIONS:
                continue
            if name == "threads" or (value != default and value not in (None, "", {}, ())):
                out[name] = os.path.basename(value) if spec.kind == "path" else plain(value)
        return out


def unknown_message(cls: type[ProbeParams], key: str) -> str:
    known = [n for n, spec, _ in cls.fields() if spec.suite]
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"unknown param of probe '{cls.KIND}' ({hint}known: {', '.join(known)})"


def plain(value: Any) -> Any:
    """JSON-ready: tuples become lists, recursively."""
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


# ---- converters: one per kind ---------------------------------------------------------------------------
def convert(key: str, value: Any, spec: Spec) -> Any:
    """The checked, normalised value of one field (None stays None: the field's 'not set')."""
    if value is None:
        return None
    return _CONVERTERS[spec.kind](key, value, spec)


def _number(key: str, value: Any, spec: Spec, whole: bool) -> Any:
    if isinstance(value, bool):
        raise ParamError(key, f"expected {_what(whole)}, got {value!r}")
    if isinstance(value, str):
        try:
            value = int(value) if whole else float(value)
        except ValueError:
            raise ParamError(
                key, f"expected {'a whole number' if whole else 'a number'}, got {value!r}"
            ) from None
    if whole and isinstance(value, float) and value.is_integer():
        value = int(value)
    if whole and not isinstance(value, int) or not isinstance(value, int | float):
        raise ParamError(key, f"expected {_what(whole)}, got {value!r}")
    if not math.isfinite(value):
        raise ParamError(key, f"must be finite, got {value!r}")
    _check_range(key, value, spec)
    return value if whole else float(value)


def _what(whole: bool) -> str:
    return "a whole number" if whole else "a number"


def _check_range(key: str, value: float, spec: Spec) -> None:
    unit = f" {spec.unit}" if spec.unit else ""
    if spec.positive and value <= 0:
        raise ParamError(key, f"must be positive, got {value:g}{unit}")
    if spec.minimum is not None and value < spec.minimum:
        raise ParamError(key, f"must be at least {spec.minimum:g}{unit}, got {value:g}{unit}")
    if spec.maximum is not None and value > spec.maximum:
        raise ParamError(key, f"must be at most {spec.maximum:g}{unit}, got {value:g}{unit}")


def _int(key: str, value: Any, spec: Spec) -> int:
    return int(_number(key, value, spec, whole=True))


def _float(key: str, value: Any, spec: Spec) -> float:
    return float(_number(key, value, spec, whole=False))


def _bool(key: str, value: Any, spec: Spec) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    raise ParamError(key, f"expected true or false, got {value!r}")


def _str(key: str, value: Any, spec: Spec) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ParamError(key, f"expected a non-empty string, got {value!r}")
    return value.strip()


def _choice(key: str, value: Any, spec: Spec) -> str:
    text = _str(key, value, spec)
    if text not in spec.choices:
        raise ParamError(key, f"'{text}' is not one of {', '.join(spec.choices)}")
    return text


def as_list(value: Any) -> list[Any]:
    """None -> [], a scalar -> [scalar], a comma string -> its parts, a list stays a list."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def _strs(key: str, value: Any, spec: Spec) -> tuple[str, ...] | None:
    out: list[str] = []
    for item in as_list(value):
        name = _str(key, item, spec)
        if name not in out:
            out.append(name)
    return tuple(out) or None


def _choices(key: str, value: Any, spec: Spec) -> tuple[str, ...] | None:
    out: list[str] = []
    for item in as_list(value):
        name = _choice(key, item, spec)
        if name not in out:
            out.append(name)
    return tuple(out) or None


def _ints(key: str, value: Any, spec: Spec) -> tuple[int, ...] | str | None:
    if spec.allow_max and isinstance(value, str) and value.strip().lower() == "max":
        return "max"
    out: list[int] = []
    for part in as_list(value):
        if isinstance(part, str) and "-" in part.strip("-"):
            lo, _, hi = part.partition("-")
            lo_i, hi_i = _int(key, lo, Spec("int", POLICY, "")), _int(key, hi, Spec("int", POLICY, ""))
            if hi_i < lo_i:
                raise ParamError(key, f"range '{part}' runs backwards")
            out += list(range(lo_i, hi_i + 1))
        else:
            try:
                out.append(_int(key, part, Spec("int", POLICY, "")))
            except ParamError:
                raise ParamError(key, f"'{part}' is not a whole number or a range like 1-4") from None
    for v in out:
        _check_range(key, v, spec)
    return tuple(sorted(set(out))) or None


_CLUSTER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _cpus(key: str, value: Any, spec: Spec) -> tuple[int, ...] | str | None:
    """CPU numbers and ranges, or one cluster's name ("big", "little"): a name stays a name until the job
    runs on its device, where execute_job turns it into that device's CPUs (edgebench.lab.clusters)."""
    if isinstance(value, str) and _CLUSTER_NAME.fullmatch(value.strip()):
        return value.strip()
    return _ints(key, value, dataclasses.replace(spec, minimum=0 if spec.minimum is None else spec.minimum))  # type: ignore[return-value]


_DIMS_SPELLED_OTHERWISE = re.compile(r"[\s\[(]*\d+(?:\s*[,;*×\s]\s*\d+)+[\s\])]*")


def dims_hint(text: str, name: str = "NAME") -> str:
    """ "; did you mean NAME=1x3x64x64?" for dimensions written another way (1,3,64,64 or [1, 3, 64, 64]),
    else ""."""
    if not isinstance(text, str) or not _DIMS_SPELLED_OTHERWISE.fullmatch(text.strip()):
        return ""
    dims = "x".join(re.findall(r"\d+", text))
    return f"; did you mean {name}={dims}?"


def _dims(key: str, value: Any) -> tuple[int, ...]:
    parts = value.lower().split("x") if isinstance(value, str) else value
    if not isinstance(parts, list | tuple) or not parts:
        raise ParamError(key, f"expected dimensions like [1, 3, 224, 224] or 1x3x224x224, got {value!r}")
    dims = []
    for d in parts:
        if isinstance(d, bool):
            raise ParamError(key, f"dimension {d!r} is not a whole number")
        try:
            n = int(d)
        except (TypeError, ValueError):
            hint = dims_hint(value, key.rpartition(".")[2]) if isinstance(value, str) else ""
            raise ParamError(key, f"dimension {d!r} is not a whole number{hint}") from None
        if n <= 0 or (isinstance(d, float) and not d.is_integer()):
            raise ParamError(key, f"dimensions must be positive whole numbers, got {d!r}")
        dims.append(n)
    return tuple(dims)


def _shapes(key: str, value: Any, spec: Spec) -> dict[str, tuple[int, ...]] | None:
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        pairs = []  # the command line's NAME=DIMS, repeated
        for text in value:
            name, sep, dims = text.partition("=")
            if not sep or not name.strip():
                raise ParamError(
                    key, f"expected NAME=DIMS like input=1x3x224x224, got {text!r}{dims_hint(text)}"
                )
            pairs.append((name.strip(), dims))
        names = [n for n, _ in pairs]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise ParamError(key, f"input '{dup}' is given twice")
        value = dict(pairs)
    if not isinstance(value, Mapping):
        raise ParamError(key, f"expected a table of input shapes like {{x = [1, 1024]}}, got {value!r}")
    return {str(k): _dims(f"{key}.{k}", v) for k, v in value.items()} or None


def _gemms(key: str, value: Any, spec: Spec) -> tuple[tuple[int, int, int], ...] | bool:
    if value is False or _says_none(value):  # `skinny = false` in TOML; `--skinny false` on the command line
        return False
    items = [value] if isinstance(value, list) and value and isinstance(value[0], int) else as_list(value)
    out = []
    for item in items:
        dims = _dims(key, item)
        if len(dims) != 3:
            raise ParamError(key, f"'{item}' is not a GEMM shape MxNxK like 1x4096x4096")
        out.append((dims[0], dims[1], dims[2]))
    return tuple(out)


def _says_none(value: Any) -> bool:
    """The command line's spelling of "none of these": false, no or none, alone."""
    items = [value] if isinstance(value, str) else value if isinstance(value, list | tuple) else []
    return (
        len(items) == 1 and isinstance(items[0], str) and items[0].strip().lower() in ("false", "no", "none")
    )


def _path(key: str, value: Any, spec: Spec) -> str:
    return _str(key, str(value) if hasattr(value, "__fspath__") else value, spec)


def _mapping(key: str, value: Any, spec: Spec) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ParamError(key, f"expected a table, got {value!r}")
    return dict(value)


def _table(key: str, value: Any, spec: Spec) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ParamError(key, f"expected a table of '{spec.table.KIND}' params, got {value!r}")
    try:
        return spec.table.parse(value).given()
    except ParamError as exc:
        raise ParamError(f"{key}.{exc.key}", exc.reason) from None


_CONVERTERS = {
    "int": _int,
    "float": _float,
    "bool": _bool,
    "str": _str,
    "strs": _strs,
    "choice": _choice,
    "choices": _choices,
    "ints": _ints,
    "cpus": _cpus,
    "shapes": _shapes,
    "gemms": _gemms,
    "path": _path,
    "mapping": _mapping,
    "table": _table,
}
