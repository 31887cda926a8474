"""The `minitfm` command line: the App, its version, and `COMMANDS`, the table of its commands,
each the function of its module in `app/commands/` (see there how to add one)."""

from __future__ import annotations

import typer

from minitfm.app.commands.ablate import ablate
from minitfm.app.commands.bench import bench
from minitfm.app.commands.compare import compare
from minitfm.app.commands.eval import eval_command
from minitfm.app.commands.explain import explain
from minitfm.app.commands.explore import explore
from minitfm.app.commands.learn import learn_app
from minitfm.app.commands.patch import patch
from minitfm.app.commands.plot import plot
from minitfm.app.commands.predict import PredictCommand, predict
from minitfm.app.commands.runs import runs_command
from minitfm.app.commands.stack import stack
from minitfm.app.commands.sweep import sweep
from minitfm.app.commands.tasks import tasks
from minitfm.app.commands.train import train_command
from minitfm.app.commands.visualize_attention import visualize_attention
from minitfm.app.output import console
from minitfm.app.usage import App, OneLineErrors
from minitfm.version import __version__

app = App(
    cls=OneLineErrors,
    name="minitfm",
    help="A toy encoder-decoder transformer trainer: hand-written attention, synthetic tasks, "
         "attention maps you can see.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)


def version_callback(value: bool) -> None:
    if value:
        console.print(f"minitfm {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=version_callback, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """minitfm: train, measure and look inside a small transformer on synthetic tasks."""
    from minitfm.run.memory import keep_freed_memory

    keep_freed_memory()  # reuse freed activations instead of page-faulting them in every step


# The commands in the order `minitfm --help` lists them, a group of commands (learn) last;
# SETTINGS holds Typer's settings of the few that need any.
COMMANDS = {
    "train": train_command,
    "eval": eval_command,
    "predict": predict,
    "visualize-attention": visualize_attention,
    "plot": plot,
    "ablate": ablate,
    "explain": explain,
    "patch": patch,
    "compare": compare,
    "stack": stack,
    "explore": explore,
    "tasks": tasks,
    "bench": bench,
    "sweep": sweep,
    "runs": runs_command,
    "learn": learn_app,
}
SETTINGS = {"predict": {"cls": PredictCommand},  # an input may begin with '-'
            "stack": {"hidden": True}}  # a sweep's building block, not the face's



def add_commands(app: App) -> None:
    """Register COMMANDS on `app`, in their order: a function as a command, a Typer as a group."""
    for name, command in COMMANDS.items():
        if isinstance(command, typer.Typer):
            app.add_typer(command, name=name)
        else:
            app.command(name, **SETTINGS.get(name, {}))(command)


add_commands(app)


def main() -> None:
    """Console-script entry point."""
    app()
