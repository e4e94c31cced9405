"""What the admin's screens share: the paginator for big tables, filters, time columns, the
view-only base of every record's screen, and the check of a list's filters from the URL.

Hazard: a list's query string filters by any field (`?worker__contains=...`), and a value Django
accepts may still fail where the SQL is built (`at__year=99999`: no such datetime) or where the
database reads it (a NUL byte in text, an invalid regular expression). `CheckedChangeList` turns
each into the admin's own "invalid filter" answer (the list again, with ?e=1), never a 500; every
jobs screen uses it (`CheckedLookups`). So is a search longer than SEARCH_CHARS, or any other
parameter longer than PARAM_CHARS, with a message saying so: Django ran a search of 100 KB (one
clause per word and field: 16-29 s on each screen) and echoed it into every link of the page.
An action's selection (`_selected_action`) is the client's word too: an id no row can have is
refused with a message before Django filters by it (`refused_selection`), on every screen.
"""

import json
from types import MethodType
from typing import Any

from django import forms
from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import SEARCH_VAR, ChangeList, ChangeListSearchForm
from django.core.exceptions import EmptyResultSet, FullResultSet, ValidationError
from django.core.paginator import Paginator
from django.db import DataError, connection, models, transaction
from django.db.models import Model, QuerySet, TextField
from django.db.models.functions import Cast, Left
from django.http import HttpRequest
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.text import smart_split

from jobs.core.conf import jobs_settings
from jobs.core.registry import _handlers
from jobs.models import Attempt, Job
from jobs.ops.actions import UNDECODABLE
from jobs.ops.describe import seconds


def time_column(name: str, label: str) -> Any:
    def column(self: Any, obj: Any) -> str:
        return seconds(getattr(obj, name))

    column.short_description = label  # type: ignore[attr-defined]
    column.admin_order_field = name  # type: ignore[attr-defined]
    return column


class EstimatedCountPaginator(Paginator):
    """An unfiltered list of a big table counts from the planner's estimate, not count(*)."""

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if (
            isinstance(qs, QuerySet)
            and connection.vendor == "postgresql"
            and not qs.query.where
            and qs.query.combinator is None
        ):
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                    [qs.model._meta.db_table],
                )
                row = cur.fetchone()
            if row and row[0] > 100_000:  # small tables: the exact count is cheap
                return int(row[0])
        return super().count


class KindFilter(admin.SimpleListFilter):
    """Kinds from the handler registry (a DISTINCT over a million jobs is a full scan)."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(k, k) for k in sorted(_handlers)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        return queryset.filter(kind=_storable(self.value())) if self.value() else queryset


class QueueFilter(admin.SimpleListFilter):
    """Queues configured, plus those with queued jobs (an index-only scan of the queued rows)."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = set(jobs_settings().QUEUES or ()) | {"default"}
        names |= set(Job.objects.queued().values_list("queue", flat=True).distinct()[:200])
        return [(q, q) for q in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        return queryset.filter(queue=_storable(self.value())) if self.value() else queryset


def _storable(value: Any) -> Any:
    """A filter value PostgreSQL can compare (no NUL), else the admin's "invalid filter" page."""
    if isinstance(value, str) and "\x00" in value:
        raise IncorrectLookupParameters(f"a filter value with a NUL byte: {value!r:.80}")
    return value


SEARCH_CHARS = 500  # an admin list's search, as the dashboard's (dashboard/forms.py)
PARAM_CHARS = 2_000  # any other parameter of a list's URL (a filter, an ordering, a page)
# Django's search is a clause per word and field, and PostgreSQL's JIT compiles the condition
# whole: 250 one-letter words on a table of 200,000 rows took 102 s (tests/integration/
# test_admin_filters.py). Where a screen searches its term whole (the jobs'), any number.
SEARCH_WORDS = 10
# Values in a list's URL, all parameters together: each value of a repeated filter is a clause
# (900 of them: 16 s on the same table). A screen's own links carry a handful.
PARAM_VALUES = 100


class BoundedSearchForm(ChangeListSearchForm):
    """The search box: at most SEARCH_CHARS characters (and, as any CharField, no NUL)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields[SEARCH_VAR] = forms.CharField(
            required=False,
            strip=False,
            max_length=SEARCH_CHARS,
            error_messages={
                "max_length": "Search: at most %(limit_value)d characters "
                "(this one has %(show_value)d); nothing was searched."
            },
        )


class CheckedChangeList(ChangeList):
    """A list whose filters from the URL fail as an invalid filter, never as a 500: checked
    before any query (a NUL byte, in any parameter a filter reads; a search Django's form
    refuses, or of more than SEARCH_WORDS words; a parameter over PARAM_CHARS; more than
    PARAM_VALUES values in all), compiled before it runs (a lookup no SQL can
    state), and counted in a savepoint (a value the database refuses)."""

    search_form_class = BoundedSearchForm

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        # Django's own search form has added its message (refused searches search nothing);
        # the redirect keeps the refused value out of the page's links as well.
        if not self.search_form_class(request.GET).is_valid():
            raise IncorrectLookupParameters("search refused")
        self._refuse_many(request)
        for name, values in request.GET.lists():
            for value in values:
                if name != SEARCH_VAR and len(value) > PARAM_CHARS:
                    messages.error(
                        request, f"Parameter {name[:80]}: at most {PARAM_CHARS:,} characters."
                    )
                    raise IncorrectLookupParameters(f"{name[:80]}: over {PARAM_CHARS} characters")
        for values in self.get_filters_params().values():
            for value in values:
                _storable(value)
        qs = super().get_queryset(request, exclude_parameters)
        try:
            qs.query.clone().get_compiler(qs.db).as_sql()
        except (EmptyResultSet, FullResultSet):
            pass  # Django answers these without asking the database
        except (ValueError, TypeError, OverflowError) as exc:  # at__year=99999: no such datetime
            raise IncorrectLookupParameters(exc) from exc
        return qs

    def _refuse_many(self, request: HttpRequest) -> None:
        """More search words (where the screen searches word by word) or URL values than a
        query should be built of: a message naming both numbers, and nothing is searched."""
        values = sum(len(v) for _, v in request.GET.lists())
        if values > PARAM_VALUES:
            messages.error(request, f"URL: at most {PARAM_VALUES} values (this one has {values}).")
            raise IncorrectLookupParameters(f"{values} values in the URL")
        by_word = type(self.model_admin).get_search_results is admin.ModelAdmin.get_search_results
        words = sum(1 for _ in smart_split(request.GET.get(SEARCH_VAR, ""))) if by_word else 0
        if words > SEARCH_WORDS:
            messages.error(
                request,
                f"Search: at most {SEARCH_WORDS} words (this one has {words}); "
                "nothing was searched.",
            )
            raise IncorrectLookupParameters(f"a search of {words} words")

    def get_results(self, request: HttpRequest) -> None:
        # The count runs the filter first (the page's rows, lazily, run the same WHERE later).
        try:
            with transaction.atomic(using=self.queryset.db):
                super().get_results(request)
        except DataError as exc:  # worker__regex=( : PostgreSQL refuses the pattern
            raise IncorrectLookupParameters(exc) from exc


def refused_selection(model_admin: admin.ModelAdmin, request: HttpRequest) -> bool:
    """Whether an action's selection holds an id no row can have, said in a message: one its
    primary key cannot read ("abc" for a number) or holding NUL (PostgreSQL's text refuses it).
    Django filtered by them as they came: a ValueError or a DataError, a 500. Refused whole, so
    nothing is done to the rest of the selection either."""
    pk = model_admin.model._meta.pk
    for value in request.POST.getlist(ACTION_CHECKBOX_NAME):
        try:
            readable = "\x00" not in value and pk.to_python(value) is not None  # type: ignore[union-attr]
        except ValidationError:
            readable = False
        if not readable:
            name = model_admin.model._meta.verbose_name
            model_admin.message_user(
                request,
                f"The selection holds {value!r:.40}, which is no {name}'s id: nothing was done.",
                messages.ERROR,
            )
            return True
    return False


class CheckedLookups:
    """Mixed into every jobs ModelAdmin: its list is a CheckedChangeList, and an action's
    selection is checked before any query (`refused_selection`)."""

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return CheckedChangeList

    def response_action(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        # None: Django's "the action failed", the list again (its message says why).
        if refused_selection(self, request):  # type: ignore[arg-type]
            return None
        return super().response_action(request, *args, **kwargs)  # type: ignore[misc]


def check_every_list(site: admin.AdminSite) -> None:
    """Every list of `site` -- Django's own (users, groups) and the libraries' (axes) too, not
    only ours -- is a CheckedChangeList, unless its admin brings a ChangeList of its own, and
    checks an action's selection as CheckedLookups does."""
    for model in apps.get_models():
        if not site.is_registered(model):
            continue
        model_admin = site.get_model_admin(model)
        if type(model_admin).get_changelist is admin.ModelAdmin.get_changelist:
            model_admin.get_changelist = _checked_changelist  # type: ignore[method-assign]
        if not isinstance(model_admin, CheckedLookups):
            model_admin.response_action = _checked_actions(model_admin)  # type: ignore[method-assign]


def _checked_changelist(request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
    return CheckedChangeList


def _checked_actions(model_admin: admin.ModelAdmin) -> Any:
    original = model_admin.response_action

    def response_action(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        return (
            None if refused_selection(model_admin, request) else original(request, *args, **kwargs)
        )

    return response_action


JOB_JSON_COLUMNS = ("payload", "progress", "result")  # never decoded by a screen


def without_job_json(qs: QuerySet[Any]) -> QuerySet[Any]:
    """`qs` with each job it refers to (a foreign key to Job) joined without its JSON columns: a
    raw-SQL job nested past Python's limit, or holding a number of more than 4,300 digits, would
    make every list or page that shows one of its rows a 500 (and the columns can be large)."""
    related = [
        f.name
        for f in qs.model._meta.get_fields()
        if f.many_to_one and f.concrete and f.related_model is Job
    ]
    if not related:
        return qs
    return qs.select_related(*related).defer(
        *(f"{name}__{column}" for name in related for column in JOB_JSON_COLUMNS)
    )


SHOWN_JSON_CHARS = 64 * 1024  # of a JSON column on a record's page


def shown_json(text: str | None) -> str:
    """A JSON column as its text: pretty when Python can decode it, else said and shown raw."""
    if text is None or text == "null":
        return "-"
    if len(text) >= SHOWN_JSON_CHARS:
        return f"{text}\n... (the first {SHOWN_JSON_CHARS:,} characters)"
    try:
        return json.dumps(json.loads(text), indent=2, sort_keys=True)
    except RecursionError:
        return f"undecodable: {UNDECODABLE}\n{text[:1000]}"
    except ValueError:
        return f"undecodable: {text[:1000]}"


def json_column(model: type[Model], name: str) -> Any:
    """A read-only column showing the JSON column `name` of `model` as its text, read by a
    query of its own (the row itself is loaded without it): never decoded as a model field."""

    def column(self: Any, obj: Any) -> str:
        text = (
            model._default_manager.filter(pk=obj.pk)
            .annotate(text=Left(Cast(name, TextField()), SHOWN_JSON_CHARS))
            .values_list("text", flat=True)
            .first()
        )
        return format_html('<pre class="json">{}</pre>', shown_json(text))

    column.short_description = name  # type: ignore[attr-defined]
    return column


class ViewOnlyAdmin(CheckedLookups, admin.ModelAdmin):
    """A record's screens, view-only. Its own JSON columns (an event's data, an intent's, an
    effect's recorded result, a schedule's payload) are never decoded: a raw-SQL row nested
    past Python's limit, or holding a number of more than 4,300 digits, made the list and the
    record's page a 500. The list loads rows without them; the page shows each as its text."""

    paginator = EstimatedCountPaginator

    def __init__(self, model: type[Model], admin_site: admin.AdminSite) -> None:
        super().__init__(model, admin_site)
        self.json_fields = [
            f.name for f in model._meta.concrete_fields if isinstance(f, models.JSONField)
        ]
        for name in self.json_fields:
            setattr(self, f"{name}_shown", MethodType(json_column(model, name), self))

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return without_job_json(super().get_queryset(request)).defer(*self.json_fields)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = super().get_fields(request, obj)
        return [f"{f}_shown" if f in self.json_fields else f for f in fields]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def duration(attempt: Attempt) -> str:
    """Claim to end (or to the last heartbeat while it runs), to the millisecond."""
    end = attempt.ended_at or attempt.heartbeat_at
    if end is None or attempt.claimed_at is None:
        return "-"
    return f"{(end - attempt.claimed_at).total_seconds():.3f} s"
