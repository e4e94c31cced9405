from django.urls import path
from django.views.generic import RedirectView

app_name = "dashboard"

urlpatterns = [
    # Until the live dashboard lands, the front page is the (read-only) job list in the admin.
    path("", RedirectView.as_view(url="/admin/jobs/job/", permanent=False), name="home"),
]
