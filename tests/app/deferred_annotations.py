"""A task annotated with a name only type checkers import. From Python 3.14 (PEP 649) annotations
are evaluated when read, so the module imports and reading them as values raises NameError;
before 3.14 the definition itself would raise, so only a test on 3.14 imports this module."""

from typing import TYPE_CHECKING

from django.tasks import task

if TYPE_CHECKING:
    from decimal import Decimal


@task
def charge(amount: Decimal) -> None:
    """Takes one argument; its annotation names a class never imported at run time."""
