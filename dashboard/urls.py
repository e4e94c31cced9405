"""The dashboard's pages (every one behind dashboard.access), the drill action and login/logout."""

from django.contrib.auth import views as auth_views
from django.urls import path

from dashboard import actions, operate, views
from dashboard.forms import LoginForm

app_name = "dashboard"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("jobs/", views.jobs_list, name="jobs"),
    path("jobs/<int:job_id>/", views.job_detail, name="job"),
    path("jobs/<int:job_id>/events/", views.job_events, name="job-events"),
    path("rejected/", views.rejected, name="rejected"),
    path("workers/", views.workers, name="workers"),
    path("drill/", views.drill, name="drill"),
    path("queues/", operate.queues_page, name="queues"),
    path("queues/action/", operate.queue_action, name="queue-action"),
    path("cron/", operate.cron_page, name="cron"),
    path("cron/action/", operate.cron_action, name="cron-action"),
    path("jobs/<int:job_id>/act/<str:action>/", actions.job_action, name="job_action"),
    path("jobs/act/", actions.bulk, name="bulk"),
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="dashboard/login.html", authentication_form=LoginForm
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(next_page="dashboard:login"), name="logout"),
]
