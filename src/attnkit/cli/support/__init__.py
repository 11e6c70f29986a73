"""What the verbs of :mod:`attnkit.cli` share, kept apart from them: each module of
:mod:`attnkit.cli` is one verb, each module here a part that verbs import (the usage error and
output helpers, the shared options, which errors are the user's, and the larger pieces of
``explain``, ``view`` and ``evaluate``)."""
