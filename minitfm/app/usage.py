"""Help that reads plainly and usage mistakes as one line on stderr, exit 2: the `App` that
`minitfm` and its groups are (`OneLineErrors`), whose commands are `Command`s (an option
given twice is refused)."""

from __future__ import annotations

import inspect
import signal
import sys

import typer
from typer.core import TyperCommand, TyperGroup

from minitfm.app.output import console, err_console
from minitfm.app.text import printable
from minitfm.run.signals import starting_message


def plain_params(params: list) -> None:
    """--help as a reader expects it: a flag without a `<bool>` value beside it, an argument
    whose metavar says it all (`[CONFIG] [KEY=VALUE]...`) without a `<list[str]>`."""
    for param in params:
        if getattr(param, "is_bool_flag", False):
            param.metavar = ""
        elif param.param_type_name == "argument" and param.nargs != 1:
            param.display_type_rich = lambda ctx: None


class PlainHelp:
    """Mixed into Typer's command and group: help text as in `plain_params`, usage as the
    metavars write it (`minitfm train [OPTIONS] [CONFIG] [KEY=VALUE]...`), and the help text
    reflowed to the terminal's width (`reflowed`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.help:
            self.help = reflowed(self.help)
        if self.short_help is None and self.help:
            self.short_help = self.help.split("\n\n", 1)[0]

    def get_params(self, ctx) -> list:
        params = super().get_params(ctx)  # with --help and Typer's completion options
        plain_params(params)
        return params

    def collect_usage_pieces(self, ctx) -> list[str]:
        arguments = [p for p in self.get_params(ctx) if p.param_type_name == "argument"]
        if not arguments:
            return super().collect_usage_pieces(ctx)
        return [self.options_metavar, *(p.metavar or p.name.upper() for p in arguments)]


def reflowed(help_text: str) -> str:
    """A command's help with each paragraph on one line, for the terminal to wrap to its width
    (the first paragraph is the summary a list of commands shows). In rich markup mode Typer
    keeps a docstring's line breaks, and a paragraph broke mid-sentence wherever the source
    did; a paragraph marked with Click's \\b keeps its lines."""
    paragraphs = inspect.cleandoc(help_text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


class Command(PlainHelp, TyperCommand):
    """A minitfm command: see PlainHelp; an option given twice is refused (`once_each`)."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        once_each(self, ctx, args)
        return super().parse_args(ctx, args)


class GivenTwice(typer.TyperException):
    """An option given more than once: a usage mistake (exit 2), said in one line."""

    exit_code = 2

    def __init__(self, message: str, ctx) -> None:
        super().__init__(message)
        self.ctx = ctx


def once_each(command, ctx, args: list[str]) -> None:
    """Refuse an option given twice: Click would keep the last one alone, silently (`--threads
    1 --threads 2` ran with 2; `--stack --no-stack` did not stack). Options that take several
    (`--eval-lengths`, `--input`) are not counted. The token after a value option is its value,
    never an option of its own."""
    names = {opt: param for param in command.params if getattr(param, "opts", None)
             and not getattr(param, "multiple", False) and not getattr(param, "count", False)
             for opt in [*param.opts, *getattr(param, "secondary_opts", [])]
             if opt.startswith("-")}  # an argument's name (`run`) is a word, not an option
    given: dict[str, list[str]] = {}
    tokens = iter(args)
    for token in tokens:
        if token == "--":
            break
        name, has_value, _ = token.partition("=")
        param = names.get(name)
        if param is None:
            continue
        given.setdefault(param.name, []).append(name)
        if not has_value and not param.is_flag:
            next(tokens, None)  # its value
    for used in given.values():
        if len(set(used)) > 1:  # --stack and --no-stack
            raise GivenTwice(f"{' and '.join(dict.fromkeys(used))} are both given: give one of "
                             f"them (minitfm would keep only the last)", ctx)
        if len(used) > 1:
            raise GivenTwice(f"{used[0]} is given {len(used)} times: give it once (minitfm "
                             f"would keep only the last)", ctx)


class App(typer.Typer):
    """Typer whose commands are `Command`s, so that every command's help reads plainly."""

    def command(self, *args, cls=Command, **kwargs):
        return super().command(*args, cls=cls, **kwargs)


class OneLineErrors(PlainHelp, TyperGroup):
    """Usage mistakes (unknown option, bad value) as one line on stderr with exit 2.

    Typer's usage errors are `typer.TyperException`s (its bundled Click's exceptions derive
    from it since Typer 0.28, hence the floor in pyproject.toml): no private module needed.
    """

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            help_text = ctx.get_help()  # bare `minitfm`: the help, which is no error
            if help_text.strip():
                console.print(help_text, markup=False, highlight=False)
            ctx.exit(0)
        return super().parse_args(ctx, args)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True,
             **extra):
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as err:
            command = " ".join(["minitfm", *subcommands(getattr(err, "ctx", None)), "--help"])
            message = key_for_option(err, sys.argv[1:] if args is None else list(args)) \
                or err.format_message()
            err_console.print(f"error: {printable(message)} (see '{command}')", markup=False)
            code = err.exit_code
        except typer.Abort:  # Click's KeyboardInterrupt before a command took over
            err_console.print(f"interrupted: {starting_message(signal.SIGINT)}", markup=False)
            code = 130
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


def subcommands(ctx) -> list[str]:
    """The words after `minitfm` that led to `ctx`'s command: ["learn", "check"]."""
    words = []
    while ctx is not None and ctx.parent is not None:  # the root is minitfm itself
        words.insert(0, ctx.info_name)
        ctx = ctx.parent
    return words


def key_for_option(err: typer.TyperException, args: list[str]) -> str | None:
    """`no option --steps: set it as train.steps=100`: an unknown option of `train` or `sweep`
    (which take KEY=VALUE) named like a config key; None for any other mistake."""
    name, ctx = getattr(err, "option_name", None), getattr(err, "ctx", None)
    if not name or ctx is None or ctx.info_name not in ("train", "sweep"):
        return None
    from minitfm.config import keys_named

    keys = keys_named(name.lstrip("-").replace("-", "_"))
    value = next((arg.partition("=")[2] for arg in args if arg.startswith(f"{name}=")), None)
    if value is None and name in args[:-1]:
        after = args[args.index(name) + 1]
        value = None if after.startswith("--") else after
    if keys == ["seed"] and ctx.info_name == "sweep":  # seed=0..7 is no seed: --seeds reads it
        return f"no option {name}: give the seeds as --seeds {value or '0..7'}"
    shown = " or ".join(f"{key}={value or 'VALUE'}" for key in keys)
    return f"no option {name}: set it as {shown}" if keys else None
