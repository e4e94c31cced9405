"""Settings of a qcluster that also runs the tasks of tests/tasks/cluster_tasks.py.

A worker resolves a task's kind only when its module lies inside an installed app (docs/tasks.md,
"How a task runs"), and tests/app/tasks.py has no task with these options, so this cluster
installs tests.tasks too: `start_qcluster(DJANGO_SETTINGS_MODULE="tests.tasks.cluster_settings")`.
"""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.tasks"]
