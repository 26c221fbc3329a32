"""The site's routes: batching's serving surface included as any host project includes
it (here at the root), then the site's own admin, logins and the front door's gate."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from . import gate

urlpatterns = [
    path("", include("dynamic_batching.urls")),
    path("admin/", admin.site.urls),
    path("auth/staff", gate.staff_gate, name="staff-gate"),
    # Staff carry their login to Flower's own host name (batching_site/gate.py).
    path("auth/flower", gate.flower_ticket, name="flower-ticket"),
    path("_staff/enter", gate.flower_enter, name="flower-enter"),
    # Every user's login (the admin's own login form takes staff only).
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="/login/"), name="logout"),
]
