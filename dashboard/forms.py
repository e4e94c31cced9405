"""The dashboard's forms: the jobs list's filter (validates what the operator typed before any
query sees it) and the login forms of the dashboard and the admin."""

from datetime import UTC, datetime
from typing import Any

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.core.validators import MaxLengthValidator
from django.http import QueryDict

from jobs.core.states import JobState

ECHO_CHARS = 100  # a value of a field without a max_length (a time, a state, a cursor)


class InstantField(forms.DateTimeField):
    """A time, as the instant it names in UTC. Python reads a UTC offset up to 23:59
    (`2026-01-01T00:00+23:00`), PostgreSQL refuses one past 15:59: sent as typed, the list's
    query raised (a 500, and on the list's socket its push). A time that has no UTC instant
    Python can hold (year 1 east of UTC, 9999 west of it) is the field's "invalid" error."""

    def to_python(self, value: Any) -> datetime | None:
        result = super().to_python(value)
        if result is None or result.utcoffset() is None:
            return result
        try:
            return result.astimezone(UTC)
        except OverflowError:
            raise ValidationError(self.error_messages["invalid"], code="invalid") from None


class JobFilterForm(forms.Form):
    """An invalid filter filters nothing: the jobs list shows no rows and these errors
    (screens.jobs_context), never every job; a bulk action is refused (actions.BulkForm).

    The form keeps only its own fields' values, and none longer than the field takes: an
    over-long one is an error naming both lengths, and is never validated, searched or echoed
    back (a 100 KB search came back twice in the page, and an unknown parameter in its links;
    `kept` is what the page may show again: screens.jobs_context)."""

    state = forms.ChoiceField(choices=[("", "any state"), *JobState.choices], required=False)
    queue = forms.CharField(max_length=64, required=False)
    kind = forms.CharField(max_length=100, required=False)
    q = forms.CharField(
        max_length=500,  # the search input's maxlength too (jobs.html)
        required=False,
        label="Search",
        help_text='id, unique key, payload text, or JSON like {"order": 7}',
    )
    since = InstantField(required=False, label="Created after")
    until = InstantField(required=False, label="Created before")
    before = forms.IntegerField(
        required=False, min_value=1, max_value=2**63 - 1, widget=forms.HiddenInput
    )

    def __init__(self, data: QueryDict | None = None, *args: Any, **kwargs: Any) -> None:
        self.overlong: dict[str, int] = {}
        kept = QueryDict(mutable=True)
        if data is not None:
            for name, values in data.lists():
                field = self.base_fields.get(name)
                if field is None:
                    continue
                limit = getattr(field, "max_length", None) or ECHO_CHARS
                for value in values:
                    if len(value) > limit:
                        self.overlong[name] = len(value)
                    else:
                        kept.appendlist(name, value)
        kept._mutable = False
        self.kept = kept  # what the page may show again
        super().__init__(kept if data is not None else None, *args, **kwargs)

    def clean(self) -> dict[str, Any] | None:
        for name, length in self.overlong.items():
            field = self.fields[name]
            limit = getattr(field, "max_length", None) or ECHO_CHARS
            label = field.label or name.capitalize()
            self.add_error(
                name,
                f"{label}: at most {limit:,} characters (this one has {length:,}); "
                "nothing was filtered.",
            )
        return super().clean()


def _bound_username(form: AuthenticationForm) -> None:
    """Refuse a username longer than any user's (150 characters) with the form's own error.

    Django's AuthenticationForm sets the field's max_length after the field is built, so only
    the browser's `maxlength` bounds it: a longer name went on to authenticate(), and
    django-axes, recording the failure, wrote it to its varchar(255) column -- a 500. A
    refused field never reaches authenticate(), so nothing is written or counted.
    """
    longest = form.username_field.max_length or 254  # as Django reads it
    form.fields["username"].validators.append(MaxLengthValidator(longest))


class LoginForm(AuthenticationForm):
    """The dashboard's login (dashboard/urls.py)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _bound_username(self)


class AdminLoginForm(AdminAuthenticationForm):
    """The admin's login (staff only, as Django's), set as admin.site.login_form (config/urls)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _bound_username(self)
