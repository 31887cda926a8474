"""The face: the command line and the Python API, the only floor that prints. In reading order:

- `cli.py`: the `minitfm` App, its version and `COMMANDS`, the table of its commands;
- `commands/`: one module per command, its function and the tables it draws;
- `usage.py`: help that reads plainly, usage mistakes as one line;
- `parameters.py`: the options several commands share, and those of `lab/options.py`;
- `arguments.py`: the arguments that need reading (a config, RUN before inputs, stdin);
- `exit_codes.py`: library errors as one line on stderr and their exit code;
- `loading.py`: a command's threads claimed, its run loaded;
- `output.py`: how the commands print (messages, tables, files written);
- `text.py`: text from users and files made safe for the terminal;
- `progress.py`: live training progress;
- `api.py`: the Python API (`from minitfm import load_run, train`);
- `run_table.py`: its table of runs (`minitfm.load_runs`: a pandas DataFrame), without torch;
- `reference.py`: a reference trainer in a process of its own, for `minitfm bench --solve`.
"""
