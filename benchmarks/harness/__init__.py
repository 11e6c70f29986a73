"""The benchmark harness behind ``benchmarks/run.py``, one concept per file:

``row``      :class:`~harness.row.Spec` (a row a script declares) and :class:`~harness.row.Row`
             (a row's result, typed), targets;
``runner``   finding the scripts, listing their rows, running each row in its own subprocess
             (timeouts, exit codes, stderr tails);
``table``    the table's named columns and their text / Markdown / rich rendering;
``machine``  the machine a run measured (``attnkit info``'s data plus git commit, load, date);
``results``  the JSON file (written atomically after every row) and the summary after the table.

A package rather than top-level modules so that names like ``table`` or ``machine`` never shadow
another library's module in the bench scripts (which run with ``benchmarks/`` on ``sys.path``).
"""
