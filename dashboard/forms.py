"""The dashboard's forms: the jobs list's filter (validates what the operator typed before any
query sees it) and the login forms of the dashboard and the admin."""

from typing import Any

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.validators import MaxLengthValidator

from jobs.core.states import JobState


class JobFilterForm(forms.Form):
    """An invalid filter filters nothing: the jobs list shows no rows and these errors
    (screens.jobs_context), never every job; a bulk action is refused (actions.BulkForm)."""

    state = forms.ChoiceField(choices=[("", "any state"), *JobState.choices], required=False)
    queue = forms.CharField(max_length=64, required=False)
    kind = forms.CharField(max_length=100, required=False)
    q = forms.CharField(
        max_length=500,  # the search input's maxlength too (jobs.html)
        required=False,
        label="Search",
        help_text='id, unique key, payload text, or JSON like {"order": 7}',
    )
    since = forms.DateTimeField(required=False, label="Created after")
    until = forms.DateTimeField(required=False, label="Created before")
    before = forms.IntegerField(
        required=False, min_value=1, max_value=2**63 - 1, widget=forms.HiddenInput
    )


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
