from django.conf import settings
from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path

from dashboard.forms import AdminLoginForm
from jobs.admin.common import check_every_list
from jobs.ops.metrics import metrics_view

admin.site.login_form = AdminLoginForm  # a username longer than any user's: the form's error
check_every_list(admin.site)  # a filter no query can hold: the invalid-filter page, on every list

urlpatterns: list[URLPattern | URLResolver] = [
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
    path("", include("dashboard.urls")),
]

if settings.DEBUG:  # the demo's webhook receiver (bin/run): see demo/views.py
    from demo import views as demo_views

    urlpatterns += [
        path("demo/hook/", demo_views.hook, name="demo-hook"),
        path("demo/hook/check/", demo_views.check, name="demo-hook-check"),
    ]
