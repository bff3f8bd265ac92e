"""``sdp-convert``: the command line. Thin: parse options, read the configuration, call the
runner, exit with its code.

Exit codes: 0 success; 1 ``--check`` found files that would change, or (without
``--allow-manual-markers``) files still marked ``# sdp-convert: manual - ...``; 2 a file failed
(the others were still processed), the arguments or the configuration were wrong, or the report
could not be written. When both 1 and 2 apply, 2 wins. 130 / 143: stopped by SIGINT / SIGTERM
(the files already written are listed).
"""

from __future__ import annotations

import signal
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from . import __version__
from .typer_coercion import Command

EXIT_OK, EXIT_CHANGES, EXIT_FAILED = 0, 1, 2

# Usage errors are click exceptions. typer vendors click from 0.26 on (``typer._click``) and
# depends on it before, so the class is found through typer's own re-export, whatever the version.
_CLICK_ERROR: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)


class LrScaling(str, Enum):
    linear = "linear"
    sqrt = "sqrt"
    none = "none"


class Framework(str, Enum):
    auto = "auto"
    torch = "torch"
    tensorflow = "tensorflow"


class Rank0Output(str, Enum):
    progress = "progress"
    all = "all"
    none = "none"


class ReportFormat(str, Enum):
    text = "text"
    json = "json"
    github = "github"


app = typer.Typer(
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"sdp-convert {__version__}")
        raise typer.Exit(EXIT_OK)


def _names(values: list[str]) -> frozenset[str]:
    return frozenset(n.strip() for v in values for n in v.split(",") if n.strip())


def _fail(message: str) -> typer.Exit:
    typer.echo(f"sdp-convert: error: {message}", err=True)
    return typer.Exit(EXIT_FAILED)


@app.command(cls=Command)
def convert_cmd(
    paths: Annotated[
        list[str] | None,
        typer.Argument(help="Files, directories (recursed), or - for stdin to stdout.",
                       show_default=False),
    ] = None,
    output: Annotated[
        str | None,
        typer.Option("-o", "--output",
                     help="Write here instead of in place: a file, or a directory (existing, or "
                     "ending in /) that mirrors the input tree."),
    ] = None,
    diff: Annotated[
        bool, typer.Option("--diff", help="Print a unified diff on stdout; write nothing.")
    ] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; exit 1 if any file would change.")
    ] = False,
    stdin_filename: Annotated[
        str | None,
        typer.Option("--stdin-filename",
                     help="The name of the file read from stdin, for messages, reports, the "
                     "diff and --force-exclude."),
    ] = None,
    lr_scaling: Annotated[
        LrScaling | None,
        typer.Option("--lr-scaling", show_default=False,
                     help="How learning rates follow the world size [default: linear]."),
    ] = None,
    framework: Annotated[
        Framework | None,
        typer.Option("--framework", show_default=False,
                     help="Treat files as this framework [default: auto]."),
    ] = None,
    rank0_output: Annotated[
        Rank0Output | None,
        typer.Option("--rank0-output", show_default=False,
                     help="What shows on rank 0 only: progress bars (tqdm), all (also print, "
                     "through sdp.rank0_print) or none [default: progress]."),
    ] = None,
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
    explain: Annotated[
        str | None,
        typer.Option("--explain", metavar="NAME",
                     help="Print what a transform does (its documentation) and exit."),
    ] = None,
    exclude: Annotated[
        list[str],
        typer.Option("--exclude", metavar="GLOB",
                     help="Leave out matching paths when recursing (replaces the configured "
                     "exclude; a GLOB ending in / matches directories)."),
    ] = [],  # noqa: B006
    extend_exclude: Annotated[
        list[str],
        typer.Option("--extend-exclude", metavar="GLOB",
                     help="Leave out matching paths, in addition to exclude."),
    ] = [],  # noqa: B006
    force_exclude: Annotated[
        bool | None,
        typer.Option("--force-exclude/--no-force-exclude", show_default=False,
                     help="Apply the exclusions (and .gitignore) to files named on the command "
                     "line too, as pre-commit passes them [default: no]."),
    ] = None,
    respect_gitignore: Annotated[
        bool | None,
        typer.Option("--respect-gitignore/--no-respect-gitignore", show_default=False,
                     help="Leave out what .gitignore ignores when recursing [default: yes]."),
    ] = None,
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
        ReportFormat | None,
        typer.Option("--report-format", show_default=False,
                     help="Format of --report (needs --report) [default: text]."),
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option("-j", "--jobs", min=1, show_default=False,
                     help="Parallel processes [default: all cores]."),
    ] = None,
    cache: Annotated[
        bool | None,
        typer.Option("--cache/--no-cache", show_default=False,
                     help="Remember each file's result by its content, in the user cache "
                     "directory ($SDP_CONVERT_CACHE_DIR overrides), so that an unchanged file is "
                     "not converted again [default: yes]."),
    ] = None,
    cache_dir: Annotated[
        str | None,
        typer.Option("--cache-dir", metavar="DIR",
                     help="Keep the cache in DIR instead of $SDP_CONVERT_CACHE_DIR or the user "
                     "cache directory."),
    ] = None,
    config_file: Annotated[
        str | None,
        typer.Option("--config", metavar="FILE",
                     help="Read [tool.sdp-convert] from this TOML file instead of the "
                     "pyproject.toml found above the paths."),
    ] = None,
    allow_manual_markers: Annotated[
        bool | None,
        typer.Option("--allow-manual-markers/--no-allow-manual-markers", show_default=False,
                     help="With --check, do not fail on '# sdp-convert: manual - ...' comments "
                     "left in files (they are still reported) [default: fail]."),
    ] = None,
    quiet: Annotated[
        bool,
        typer.Option("-q", "--quiet",
                     help="Print only errors, manual items and the summary line."),
    ] = False,
    version: Annotated[
        bool | None,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Show the version and exit."
        ),
    ] = None,
) -> None:
    """Convert single-GPU training scripts into data-parallel ones that call sdp_runtime."""
    if list_transforms:
        from .pipeline import PIPELINE

        width = max(len(t.NAME) for t in PIPELINE)
        for t in PIPELINE:
            frameworks = ",".join(sorted(t.FRAMEWORKS)) or "-"
            typer.echo(f"{t.NAME:<{width}}  {frameworks:<16}  {t.DESCRIPTION}")
        raise typer.Exit(EXIT_OK)
    if explain is not None:
        known = _transforms()
        if explain not in known:
            raise typer.BadParameter(f"unknown transform {explain} (see --list-transforms)",
                                     param_hint="--explain")
        typer.echo(_explanation(known[explain]))
        raise typer.Exit(EXIT_OK)
    if not paths and stdin_filename:
        paths = ["-"]
    if not paths:
        raise typer.BadParameter("give at least one PATH (or - for stdin)", param_hint="PATH")
    if report_format is not None and report is None:
        # Without --report no report is written: a format alone would silently do nothing.
        raise _fail(f"--report-format {report_format.value} is the format of the report that "
                    "--report writes, and no --report was given: add --report FILE (or "
                    "--report - for stdout)")
    if "-" in paths and (len(paths) > 1 or output):
        raise typer.BadParameter("- (stdin) cannot be combined with other paths or -o",
                                 param_hint="PATH")

    from . import config as configuration

    try:
        where = [str(Path(stdin_filename).parent)] if paths == ["-"] and stdin_filename else paths
        found = Path(config_file) if config_file else configuration.find(where)
        cfg = configuration.load(found)
    except configuration.ConfigError as bad:
        raise _fail(str(bad)) from None
    only_names = _names(only) if only else frozenset(cfg.get("only", ()))
    skip_names = _names(skip) | frozenset(cfg.get("skip", ()))
    for flag, names in (("--only", only_names), ("--skip", skip_names)):
        # The transforms (and libcst with them) are loaded only to check names given: a run
        # answered by the cache does not load them at all.
        unknown = sorted(names - _transforms().keys()) if names else []
        if unknown:
            raise typer.BadParameter(
                f"unknown transform {', '.join(unknown)} (see --list-transforms)", param_hint=flag
            )

    from .cache import default_dir
    from .files import Excluder
    from .options import Options
    from .report import first_run_hint, render, summary_line
    from .runner import (
        Config,
        Interrupted,
        Selection,
        UsageError,
        convert_stdin,
        copy_files,
        default_jobs,
        plan,
    )

    options = Options(
        lr_scaling=lr_scaling.value if lr_scaling else cfg.get("lr-scaling", "linear"),
        framework=framework.value if framework else cfg.get("framework", "auto"),
        rank0_output=rank0_output.value if rank0_output else cfg.get("rank0-output", "progress"),
        only=only_names,
        skip=skip_names,
    )
    globs = (*(exclude or cfg.get("exclude", ())), *cfg.get("extend-exclude", ()), *extend_exclude)
    selection = Selection(
        excluder=Excluder(tuple(globs), cfg.base or Path.cwd().absolute()),
        gitignore=respect_gitignore if respect_gitignore is not None
        else cfg.get("respect-gitignore", True),
        force_exclude=force_exclude if force_exclude is not None
        else cfg.get("force-exclude", False),
        copy_other_files=copy_other_files,
    )
    mode = "check" if check else "diff" if diff else "write"
    use_cache = cache if cache is not None else cfg.get("cache", True)
    run_config = Config(
        options=options, mode=mode, diff=diff,  # type: ignore[arg-type]
        cache_dir=(cache_dir or str(default_dir())) if use_cache else None,
    )

    written_to: dict[str, str] = {}  # a file's name in the outcomes -> where it is written
    if paths == ["-"]:
        name = stdin_filename or "-"
        excluded = bool(stdin_filename) and selection.excludes_named(Path(name))
        outcomes = [convert_stdin(run_config, name, excluded)]
    else:
        try:
            planned, copies, early = plan(paths, output, selection)
        except UsageError as wrong:
            raise typer.BadParameter(str(wrong), param_hint="-o") from None
        written_to = {job.display: str(job.dest) for job in planned if job.dest is not None}
        try:
            workers = jobs or cfg.get("jobs") or default_jobs()
            done = _run_with_progress(planned, run_config, workers)
        except Interrupted as stop:
            raise typer.Exit(_interrupted(stop, mode)) from None
        outcomes = early + done
        if mode == "write":
            outcomes += copy_files(copies)

    for o in outcomes:
        if o.diff:
            sys.stdout.write(o.diff)
    sys.stdout.flush()
    err = sys.stderr
    for o in outcomes:
        if o.status == "failed":
            err.write(o.message + "\n")
        else:
            if o.status == "skipped" and not quiet:
                err.write(f"skipped {o.message}\n")
            for change in o.changes:
                # -q hides progress and edits, never what a person still has to do.
                if change.manual or not quiet:
                    err.write(change.format(o.path) + "\n")
    hint = None if quiet else first_run_hint(outcomes, written_to)
    if hint:
        # What no converter can prove, the first run can check (docs/audit.md, "The audit"). Before
        # the summary, which stays the last line.
        err.write(hint + "\n")
    err.write(f"sdp-convert: {summary_line(outcomes, mode != 'write')}\n")

    failed = any(o.status == "failed" for o in outcomes)
    if report is not None:
        fmt = report_format.value if report_format else "text"
        text = render(outcomes, fmt, mode != "write")  # type: ignore[arg-type]
        if report == "-":
            sys.stdout.write(text)
        else:
            try:
                Path(report).write_text(text, encoding="utf-8")
            except OSError as error:
                typer.echo(f"sdp-convert: error: cannot write report {report}: {error.strerror}",
                           err=True)
                failed = True

    if failed:
        raise typer.Exit(EXIT_FAILED)
    if check and any(o.status == "converted" for o in outcomes):
        raise typer.Exit(EXIT_CHANGES)
    allow = (allow_manual_markers if allow_manual_markers is not None
             else cfg.get("allow-manual-markers", False))
    if check and not allow and _marked(outcomes):
        typer.echo("sdp-convert: --check: manual items are still marked in the files (see "
                   "above); do them and delete the comments, or pass --allow-manual-markers",
                   err=True)
        raise typer.Exit(EXIT_CHANGES)
    if check and not allow and any(o.needs_attention for o in outcomes):
        # The whole-program contract finds a part missing or unknown (its notes are checked on
        # every run, comments or not): work is left, whatever the files' comments say.
        typer.echo("sdp-convert: --check: a program's contract does not hold (see the "
                   "[contract] lines above); do what they say, or pass --allow-manual-markers",
                   err=True)
        raise typer.Exit(EXIT_CHANGES)
    raise typer.Exit(EXIT_OK)


def _marked(outcomes: Any) -> bool:
    """Whether a file carries a ``# sdp-convert: manual - ...`` comment (``manual_marks``)."""
    from .manual_marks import MARKER

    return any(c.transform == MARKER for o in outcomes for c in o.changes)


def _transforms() -> dict[str, Any]:
    from .pipeline import PIPELINE

    return {t.NAME: t for t in PIPELINE}


def _explanation(transform: Any) -> str:
    import inspect

    doc = inspect.getdoc(sys.modules[transform.__module__]) or transform.DESCRIPTION
    frameworks = ", ".join(sorted(transform.FRAMEWORKS)) or "any framework"
    return f"{transform.NAME} ({frameworks})\n\n{doc}"


def _interrupted(stop: Any, mode: str) -> int:
    """Say which files were written before SIGINT/SIGTERM; the exit status is 128 + signal."""
    name = signal.Signals(stop.signum).name
    written = [o.path for o in stop.outcomes if o.written]
    if mode != "write" or not written:
        typer.echo(f"sdp-convert: stopped by {name}; no file was written.", err=True)
    else:
        typer.echo(f"sdp-convert: stopped by {name}; {len(written)} file(s) had been written "
                   "(the others are as they were):", err=True)
        for path in written:
            typer.echo(f"  {path}", err=True)
    return 128 + int(stop.signum)


def _run_with_progress(planned, config, workers):  # type: ignore[no-untyped-def]
    from .runner import run_jobs

    if len(planned) < 2 or not sys.stderr.isatty():
        return run_jobs(planned, config, workers)
    from rich.progress import Progress

    with Progress(transient=True, console=None) as progress:
        task = progress.add_task("converting", total=len(planned))
        return run_jobs(planned, config, workers, on_done=lambda _: progress.advance(task))


def _one_line(error: Exception) -> str:
    format_message = getattr(error, "format_message", None)
    text = format_message() if callable(format_message) else str(error)
    # typer 0.26+ validates through its own layer, whose messages start "Value error, ".
    return " ".join(text.replace("Value error, ", "").split())


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0, 1 or 2, see the module docstring).

    A usage error (unknown option, missing or bad value) is one line on stderr naming the
    option, and exit status 2, with every supported typer version.
    """
    try:
        # Not standalone: the command's exit code comes back instead of a SystemExit, and usage
        # errors come here as exceptions, to be printed as one line.
        code = app(args=argv, prog_name="sdp-convert", standalone_mode=False)
        return code if isinstance(code, int) else EXIT_OK
    except typer.Exit as done:
        return int(done.exit_code)
    except typer.Abort:  # Ctrl-C outside a run of many files (those handle it themselves)
        typer.echo("sdp-convert: stopped by SIGINT", err=True)
        return 128 + int(signal.SIGINT)
    except _CLICK_ERROR as error:
        typer.echo(f"sdp-convert: error: {_one_line(error)}", err=True)
        return EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
