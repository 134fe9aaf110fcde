"""Strict TOML reading: every key is taken on purpose; unknown or mistyped keys name the file and key."""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from .errors import ConfigError

T = TypeVar("T")
_MISSING: Any = object()


def load_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; a syntax error becomes a one-line ConfigError naming the file."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(path, "no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, f"malformed TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(path, f"cannot read: {exc.strerror}") from None


class TableReader:
    """Reads one TOML table; `done()` refuses keys nobody asked for."""

    def __init__(self, data: dict[str, Any], path: Path | str, prefix: str = "") -> None:
        self._data = data
        self._path = path
        self._prefix = prefix
        self._seen: set[str] = set()
        self._asked: set[str] = set()  # keys looked for, present or not: what a typo may have meant

    def _name(self, key: str) -> str:
        return f"{self._prefix}{key}"

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(self._path, f"{self._name(key)}: {message}")

    def has(self, key: str) -> bool:
        self._asked.add(key)
        return key in self._data

    def get(self, key: str, kind: type[T] | tuple[type, ...], default: Any = _MISSING) -> Any:
        self._seen.add(key)
        self._asked.add(key)
        if key not in self._data:
            if default is _MISSING:
                typo = difflib.get_close_matches(key, sorted(set(self._data) - self._seen), n=1)
                hint = f" (is '{self._name(typo[0])}' a misspelling of it?)" if typo else ""
                raise self.error(key, f"required key is missing{hint}")
            return default
        value = self._data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # bool is an int in Python; never accept true where a number is meant.
        if isinstance(value, bool) and bool not in kinds:
            raise self.error(key, f"expected {_names(kinds)}, got a boolean")
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            return float(value) if kinds == (float,) else value
        if not isinstance(value, kinds):
            raise self.error(key, f"expected {_names(kinds)}, got {type(value).__name__} {value!r}")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: Any = _MISSING) -> str:
        value = self.get(key, str, default)
        if value not in choices:
            raise self.error(key, f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    def str_list(self, key: str, default: Any = _MISSING) -> tuple[str, ...]:
        value = self.get(key, list, default)
        if not all(isinstance(v, str) for v in value):
            raise self.error(key, "expected a list of strings")
        return tuple(value)

    def table(self, key: str) -> TableReader:
        value = self.get(key, dict, {})
        return TableReader(value, self._path, f"{self._name(key)}.")

    def raw(self, key: str, default: Any = None) -> Any:
        self._seen.add(key)
        self._asked.add(key)
        return self._data.get(key, default)

    def done(self, later: tuple[str, ...] = ()) -> None:
        """Refuse the first key nobody asked for, with the known key it most resembles. `later`: keys still
        to be read, so a typo is named before the keys that depend on it (models, misspelt) complain."""
        self._asked.update(later)
        unknown = sorted(set(self._data) - self._seen - set(later))
        if unknown:
            key = unknown[0]
            close = difflib.get_close_matches(key, sorted(self._asked - set(self._data)), n=1)
            close = close or difflib.get_close_matches(key, sorted(self._asked), n=1)
            hint = f" (did you mean '{self._name(close[0])}'?)" if close else ""
            raise self.error(key, f"unknown key{hint}")


def _names(kinds: tuple[type, ...]) -> str:
    names = {str: "string", int: "integer", float: "number", bool: "boolean", list: "list", dict: "table"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)
