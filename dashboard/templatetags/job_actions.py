"""Template tags of the job actions: who may press, and the job page's buttons."""

from typing import Any

from django import template
from django.template.loader import render_to_string
from django.utils.safestring import SafeString

from dashboard.actions import LABELS, may_press

register = template.Library()


@register.filter
def may_change_jobs(user: Any) -> bool:
    """Staff with jobs.change_job who may see the dashboard: the action buttons show."""
    return may_press(user)


@register.simple_tag(takes_context=True)
def job_action_buttons(context: template.Context, job: Any) -> SafeString | str:
    request = context.get("request")
    if request is None or not may_press(request.user):
        return ""
    return render_to_string(
        "dashboard/actions.html#buttons",
        {"job": job, "action_labels": list(LABELS.items())},
        request=request,
    )
