from rest_framework.routers import DefaultRouter

from missions.api import views

router = DefaultRouter()
router.register("missions", views.MissionViewSet, basename="mission")
router.register("milestones", views.MilestoneViewSet, basename="milestone")
router.register("slices", views.SliceViewSet, basename="slice")
router.register("features", views.FeatureViewSet, basename="feature")
router.register("assertions", views.AssertionViewSet, basename="assertion")
router.register("tasks", views.TaskViewSet, basename="task")
router.register("events", views.MissionEventViewSet, basename="missionevent")
urlpatterns = router.urls
