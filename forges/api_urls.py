from django.urls import path

from forges.api import ForgeView, RotateSecretView

urlpatterns = [
    path("missions/<int:pk>/forge/", ForgeView.as_view(), name="mission-forge"),
    path("missions/<int:pk>/forge/rotate-secret/", RotateSecretView.as_view(), name="mission-forge-rotate"),
]
