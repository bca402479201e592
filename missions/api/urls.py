"""The plan's resources. Registered on the API's one router (fusion_site/urls.py), whose
root, /api/, lists them with the validation app's."""

from rest_framework.routers import SimpleRouter

from missions.api import views

router = SimpleRouter()
router.register("missions", views.MissionViewSet, basename="mission")
router.register("milestones", views.MilestoneViewSet, basename="milestone")
router.register("slices", views.SliceViewSet, basename="slice")
router.register("features", views.FeatureViewSet, basename="feature")
router.register("assertions", views.AssertionViewSet, basename="assertion")
router.register("tasks", views.TaskViewSet, basename="task")
router.register("events", views.MissionEventViewSet, basename="missionevent")
