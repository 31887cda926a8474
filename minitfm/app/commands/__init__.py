"""The commands of `minitfm`, a module each: the command's function and the tables it draws.
`COMMANDS` in `app/cli.py` registers them; in the order `minitfm --help` lists them:

`train`, `eval`, `predict`, `visualize_attention`, `plot`, `ablate`, `explain`, `patch`,
`compare`, `stack` (hidden: a sweep's building block), `explore`, `tasks`, `bench`, `sweep`,
`runs`, and `learn` (a group of commands: learn start, check and bugs).

Adding a command is one new module and one line in the table: write `commands/NAME.py` with the
command's function, decorated `@clean_errors` (`app/exit_codes.py`), its options taken from
`app/parameters.py` (an options class of `lab/options.py` built by keyword: `options_from`), and
its tables; then add `"NAME": function` to `COMMANDS` where the help should list it.
`tests/app/test_cli.py` checks that the table, the modules and `minitfm --help` agree.
"""
