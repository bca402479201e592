"""The dashboard (server-rendered, live through the mission's event stream).

`/` is the missions list; every page `…/<id>/` has its regions at `…/<id>/_/<part>/`.
"""

from django.contrib.auth import views as auth_views
from django.urls import path, re_path

from validation import views

urlpatterns = [
    path("", views.mission_list, name="home"),
    path("_/missions/", views.mission_list_part, name="dashboard-missions-part"),
    path(
        "login/",
        auth_views.LoginView.as_view(template_name="missions/login.html", redirect_authenticated_user=True),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(next_page="login"), name="logout"),
    path("missions/<int:pk>/", views.mission_detail, name="dashboard-mission"),
    path("missions/<int:pk>/_/<slug:part>/", views.mission_part, name="dashboard-mission-part"),
    path("missions/<int:pk>/_/<slug:part>/<int:part_id>/", views.mission_part, name="dashboard-mission-part"),
    path("features/<int:pk>/", views.feature_detail, name="dashboard-feature"),
    path("features/<int:pk>/_/<slug:part>/", views.feature_part, name="dashboard-feature-part"),
    path("runs/<int:pk>/", views.run_detail, name="dashboard-run"),
    path("runs/<int:pk>/_/<slug:part>/", views.run_part, name="dashboard-run-part"),
    path("reviews/<int:pk>/", views.review_detail, name="dashboard-review"),
    path("reviews/<int:pk>/_/review/", views.review_part, name="dashboard-review-part"),
    re_path(r"^static/(?P<path>.+)$", views.static_file, name="static-file"),
]
