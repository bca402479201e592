"""Validation runs, fix lineage, reviews and the loop's actions on features. Registered on
the API's one router (fusion_site/urls.py), whose root, /api/, lists them with the plan's."""

from rest_framework.routers import SimpleRouter

from validation.api import reviews, views

router = SimpleRouter()
router.register("validation-runs", views.RunViewSet, basename="validatorrun")
router.register("lineage", views.LineageViewSet, basename="fixlineage")
router.register("reviews", reviews.ReviewViewSet, basename="review")
# The loop's actions on the plan's features, at /api/features/{id}/<action>/ (the same
# basename: the root links `features` to the plan's list).
router.register("features", views.FeatureLoopViewSet, basename="feature")
# And on the plan's milestones, at /api/milestones/{id}/validate/.
router.register("milestones", views.MilestoneLoopViewSet, basename="milestone")
