"""``sdp-convert``: the command line. Thin: parse options, call the runner, exit with its code.

Exit codes: 0 success; 1 ``--check`` found files that would change; 2 a file failed (the others
were still processed) or the arguments were wrong. When both happen, 2 wins.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from . import __version__

EXIT_OK, EXIT_CHANGES, EXIT_FAILED = 0, 1, 2


class LrScaling(str, Enum):
    linear = "linear"
    sqrt = "sqrt"
    none = "none"


class Framework(str, Enum):
    auto = "auto"
    torch = "torch"
    tensorflow = "tensorflow"


class ReportFormat(str, Enum):
    text = "text"
    json = "json"
    github = "github"


app = typer.Typer(
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"sdp-convert {__version__}")
        raise typer.Exit(EXIT_OK)


def _names(values: list[str]) -> frozenset[str]:
    return frozenset(n.strip() for v in values for n in v.split(",") if n.strip())


@app.command()
def convert_cmd(
    paths: Annotated[
        list[str] | None,
        typer.Argument(help="Files, directories (recursed), or - for stdin to stdout.",
                       show_default=False),
    ] = None,
    output: Annotated[
        str | None,
        typer.Option("-o", "--output",
                     help="Write here instead of in place: a file, or a directory that mirrors "
                     "the input tree."),
    ] = None,
    diff: Annotated[
        bool, typer.Option("--diff", help="Print a unified diff; write nothing.")
    ] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; exit 1 if any file would change.")
    ] = False,
    lr_scaling: Annotated[
        LrScaling, typer.Option("--lr-scaling", help="How learning rates follow the world size.")
    ] = LrScaling.linear,
    framework: Annotated[
        Framework, typer.Option("--framework", help="Treat files as this framework.")
    ] = Framework.auto,
    only: Annotated[
        list[str],
        typer.Option("--only", help="Run only these transforms (repeat or comma-separate)."),
    ] = [],  # noqa: B006 - typer reads defaults, never mutates them
    skip: Annotated[
        list[str], typer.Option("--skip", help="Do not run these transforms.")
    ] = [],  # noqa: B006
    list_transforms: Annotated[
        bool,
        typer.Option("--list-transforms", help="List the transforms in pipeline order and exit."),
    ] = False,
    exclude: Annotated[
        list[str], typer.Option("--exclude", help="Glob of paths to leave out when recursing.")
    ] = [],  # noqa: B006
    copy_other_files: Annotated[
        bool,
        typer.Option("--copy-other-files/--no-copy-other-files",
                     help="With -o DIR, copy files that are not converted too."),
    ] = True,
    report: Annotated[
        str | None,
        typer.Option("--report", help="Write the report to this file (- for stdout)."),
    ] = None,
    report_format: Annotated[
        ReportFormat, typer.Option("--report-format", help="Format of --report.")
    ] = ReportFormat.text,
    jobs: Annotated[
        int | None,
        typer.Option("-j", "--jobs", min=1, help="Parallel processes (default: all cores)."),
    ] = None,
    quiet: Annotated[
        bool, typer.Option("-q", "--quiet", help="Print only errors and the summary line.")
    ] = False,
    version: Annotated[
        bool | None,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Show the version and exit."
        ),
    ] = None,
) -> None:
    """Convert single-GPU training scripts into data-parallel ones that call sdp_runtime."""
    from .pipeline import PIPELINE

    if list_transforms:
        width = max(len(t.NAME) for t in PIPELINE)
        for t in PIPELINE:
            frameworks = ",".join(sorted(t.FRAMEWORKS)) or "-"
            typer.echo(f"{t.NAME:<{width}}  {frameworks:<16}  {t.DESCRIPTION}")
        raise typer.Exit(EXIT_OK)
    if not paths:
        raise typer.BadParameter("give at least one PATH (or - for stdin)", param_hint="PATH")
    known = {t.NAME for t in PIPELINE}
    for flag, names in (("--only", _names(only)), ("--skip", _names(skip))):
        unknown = sorted(names - known)
        if unknown:
            raise typer.BadParameter(
                f"unknown transform {', '.join(unknown)} (see --list-transforms)", param_hint=flag
            )
    if "-" in paths and (len(paths) > 1 or output):
        raise typer.BadParameter("- (stdin) cannot be combined with other paths or -o")

    from .base import Options
    from .report import render, summary_line
    from .runner import (
        Config,
        UsageError,
        convert_stdin,
        copy_files,
        default_jobs,
        plan,
    )

    options = Options(
        lr_scaling=lr_scaling.value,
        framework=framework.value,
        only=_names(only),
        skip=_names(skip),
    )
    mode = "check" if check else "diff" if diff else "write"
    config = Config(options=options, mode=mode, diff=diff)  # type: ignore[arg-type]

    if paths == ["-"]:
        outcomes = [convert_stdin(config)]
    else:
        try:
            planned, copies, early = plan(paths, output, exclude, copy_other_files)
        except UsageError as err:
            raise typer.BadParameter(str(err), param_hint="-o") from None
        outcomes = early + _run_with_progress(planned, config, jobs or default_jobs())
        if mode == "write":
            copy_files(copies)

    diff_stream = sys.stderr if paths == ["-"] else sys.stdout
    for o in outcomes:
        if o.diff:
            diff_stream.write(o.diff)
    err = sys.stderr
    for o in outcomes:
        if o.status == "failed":
            err.write(o.message + "\n")
        elif not quiet:
            if o.status == "skipped":
                err.write(f"skipped {o.message}\n")
            for change in o.changes:
                err.write(change.format(o.path) + "\n")
    err.write(f"sdp-convert: {summary_line(outcomes, mode != 'write')}\n")

    if report is not None:
        text = render(outcomes, report_format.value, mode != "write")  # type: ignore[arg-type]
        if report == "-":
            sys.stdout.write(text)
        else:
            Path(report).write_text(text, encoding="utf-8")

    if any(o.status == "failed" for o in outcomes):
        raise typer.Exit(EXIT_FAILED)
    if check and any(o.status == "converted" for o in outcomes):
        raise typer.Exit(EXIT_CHANGES)
    raise typer.Exit(EXIT_OK)


def _run_with_progress(planned, config, workers):  # type: ignore[no-untyped-def]
    from .runner import run_jobs

    if len(planned) < 2 or not sys.stderr.isatty():
        return run_jobs(planned, config, workers)
    from rich.progress import Progress

    with Progress(transient=True, console=None) as progress:
        task = progress.add_task("converting", total=len(planned))
        return run_jobs(planned, config, workers, on_done=lambda _: progress.advance(task))


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0, 1 or 2, see the module docstring)."""
    try:
        # Not standalone: click hands the command's exit code back instead of exiting.
        code = app(args=argv, prog_name="sdp-convert", standalone_mode=False)
        return code if isinstance(code, int) else EXIT_OK
    except typer.Exit as done:
        return int(done.exit_code)
    except (typer.BadParameter, typer.Abort) as err:  # pragma: no cover - click formats both
        typer.echo(f"sdp-convert: error: {err}", err=True)
        return EXIT_FAILED
    except Exception as err:  # click's UsageError and friends
        import click

        if isinstance(err, click.ClickException):
            err.show()
            return EXIT_FAILED
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
