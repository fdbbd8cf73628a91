"""A view that enqueues a job, as a web request of an application does."""

from django.http import HttpRequest, JsonResponse

from demo.tasks import send_welcome_email


def welcome(request: HttpRequest, user_id: int) -> JsonResponse:
    job = send_welcome_email.enqueue(user_id)
    return JsonResponse({"job": job.pk})
