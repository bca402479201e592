from rest_framework.routers import DefaultRouter

from validation.api import views

router = DefaultRouter()
router.register("validation-runs", views.RunViewSet, basename="validatorrun")
router.register("lineage", views.LineageViewSet, basename="fixlineage")
urlpatterns = router.urls
