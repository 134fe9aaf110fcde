"""The `edgebench` command line. Only this package prints, configures logging or exits.

Each verb lives in its own module with a `register(app)` function.
"""

from __future__ import annotations

import importlib
import sys

import click
import typer

from ..errors import EdgebenchError, one_line

try:  # typer >= 0.22 parses with its own copy of click, whose exceptions are not click's
    from typer import _click as _typer_click
except ImportError:  # pragma: no cover - older typer uses click itself
    _typer_click = click
USAGE_ERRORS = (click.exceptions.UsageError, getattr(_typer_click.exceptions, "UsageError", click.UsageError))
EXITS = (click.exceptions.Exit, getattr(_typer_click.exceptions, "Exit", click.exceptions.Exit))
ABORTS = (click.exceptions.Abort, getattr(_typer_click.exceptions, "Abort", click.Abort), KeyboardInterrupt)

# Modules under edgebench.cli that add commands; each has register(app).
COMMAND_MODULES = (
    "core", "probe", "run", "runs", "compare", "gate", "numerics", "report", "roofline", "doctor", "lab",
)  # fmt: skip


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="edgebench",
        add_completion=False,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        # Help is plain text: Rich markup would eat bracketed text such as `[[gate]]` or `[budget]`.
        rich_markup_mode=None,
        help="Device benchmarking and profiling lab harness for on-device AI.",
        context_settings={"help_option_names": ["-h", "--help"]},
    )

    @app.callback()
    def _root(
        debug: bool = typer.Option(False, "--debug", help="Show tracebacks for internal errors."),
        version: bool = typer.Option(
            False, "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
        ),
    ) -> None:
        """Device benchmarking and profiling lab harness for on-device AI."""

    for name in COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(app)
    return app


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        print(f"edgebench {__version__}")
        raise typer.Exit(0)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the command, turn errors into one line and an exit code."""
    argv, debug = hoist_debug(sys.argv[1:] if argv is None else argv)
    try:
        rc = build_app()(args=argv, prog_name="edgebench", standalone_mode=False)
    except EdgebenchError as exc:
        _fail(one_line(exc), exc.exit_code, debug)
    except USAGE_ERRORS as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `edgebench` (or `edgebench probe`) alone: the help
            print(exc.format_message(), file=sys.stderr)
            sys.exit(2)
        _fail(exc.format_message().splitlines()[0] if exc.format_message() else "usage error", 2, debug)
    except EXITS as exc:
        sys.exit(exc.exit_code)
    except ABORTS:
        _fail("interrupted", 130, debug)
    except Exception as exc:  # noqa: BLE001 - never a traceback unless --debug
        rerun = " ".join(["edgebench", "--debug", *argv[:1], "..."] if argv else ["edgebench", "--debug"])
        _fail(f"internal error: {type(exc).__name__}: {one_line(exc)} (for the traceback: {rerun})", 1, debug)
    sys.exit(rc if isinstance(rc, int) else 0)


def hoist_debug(argv: list[str]) -> tuple[list[str], bool]:
    """(argv with --debug moved before the verb, whether it was given): --debug is the root's option, and
    people type it anywhere (`edgebench report --debug ...`). Arguments after `--` are left alone."""
    end = argv.index("--") if "--" in argv else len(argv)
    debug = "--debug" in argv[:end]
    if not debug:
        return list(argv), False
    rest = [a for a in argv[:end] if a != "--debug"] + list(argv[end:])
    return ["--debug", *rest], True


def _fail(message: str, code: int, debug: bool) -> None:
    if debug:
        import traceback

        traceback.print_exc()
    print(f"edgebench: error: {message}", file=sys.stderr)
    sys.exit(code)
