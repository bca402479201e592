from rest_framework.routers import DefaultRouter

from validation.api import reviews, views

router = DefaultRouter()
router.register("validation-runs", views.RunViewSet, basename="validatorrun")
router.register("lineage", views.LineageViewSet, basename="fixlineage")
router.register("reviews", reviews.ReviewViewSet, basename="review")
# The loop's actions on the plan's features, at /api/features/{id}/<action>/.
router.register("features", views.FeatureLoopViewSet, basename="feature")
# And on the plan's milestones, at /api/milestones/{id}/validate/.
router.register("milestones", views.MilestoneLoopViewSet, basename="milestone")
urlpatterns = router.urls
