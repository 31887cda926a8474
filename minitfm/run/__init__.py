"""A run's life on a machine, around the book's loop: `session.py` (start_training, the run's
events), `state.py` and `resume.py` (what a run trains and saves; going on from a checkpoint),
`schedule.py` (when train lines, checks, snapshots and saves happen), `instruments.py` (the events
and their Instrument), `checkpoint.py` (saves, safe loads), `rundir.py` (run folders: found,
opened, locked; a run's files opened in place), `summary.py` (how a run ended, its status),
`which_run.py` (what a RUN argument means), `files.py` (atomic writes, JSON), `signals.py`
(Ctrl-C, SIGTERM), `devices.py` and `distributed.py` (which device; torchrun), `threads.py` and
`cpuload.py` (the thread policy; the cores others keep busy), `limits.py` and `memory.py`
(memory estimates; peak RSS), `stack.py` and `stack_key.py` (a stack's runs in one process;
which runs may share one)."""
