from django.contrib import admin
from django.urls import path

from demo import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("demo/welcome/<int:user_id>/", views.welcome, name="demo-welcome"),
]
