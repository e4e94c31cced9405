"""The jobs list's filter form: validates what the operator typed before any query sees it."""

from django import forms

from jobs.core.states import JobState


class JobFilterForm(forms.Form):
    state = forms.ChoiceField(choices=[("", "any state"), *JobState.choices], required=False)
    queue = forms.CharField(max_length=64, required=False)
    kind = forms.CharField(max_length=100, required=False)
    q = forms.CharField(
        max_length=500,
        required=False,
        label="Search",
        help_text='id, unique key, payload text, or JSON like {"order": 7}',
    )
    since = forms.DateTimeField(required=False, label="Created after")
    until = forms.DateTimeField(required=False, label="Created before")
    before = forms.IntegerField(
        required=False, min_value=1, max_value=2**63 - 1, widget=forms.HiddenInput
    )
