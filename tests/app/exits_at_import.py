"""A module of an installed app that ends the process when it is imported, as a script does
(`sys.exit(main())` at module level). A row naming a "task" in it must fail alone
(tests/tasks/test_execution.py): the worker that imports it to look for the task lives on."""

import sys

sys.exit(3)
