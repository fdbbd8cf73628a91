"""The admin: where an operator inspects jobs, batches, queues and workers, and retries, cancels
or pauses.

Fast at any number of jobs: the job list never counts more than ``EXACT_COUNT_LIMIT`` rows (past
that it shows an estimate), every filter reads an index or a bounded list, and nothing is
fetched row by row. Inspection needs the view permission, and arguments, results and tracebacks
also ``view_job_payload``; every change needs the change (or delete) permission and goes through
the API (``Job.retry``, ``Job.cancel``, ``Queue.pause``, ``Queue.resume``, a queue's limits by
``set_queue_limits``, the periodic schedules' ``run_periodic_now`` and
``set_periodic_enabled``), so that no batch callback, fence or notification is skipped, and
writes one admin log entry per object changed.
Whatever the URL or form holds, a page answers: ids are read as ASCII digits within bigint, and
the lists take only their filters' parameters.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db import models, transaction
from django.db.models import Count, OuterRef, Q, Subquery
from django.db.models.functions import JSONObject
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator, capfirst
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_eddyq import activity, bulk, inspection, operations
from django_eddyq.charts import GraphStep, activity_charts, workflow_graph
from django_eddyq.conf import eddyq_settings
from django_eddyq.durations import format_duration
from django_eddyq.exceptions import ScheduleNotFound
from django_eddyq.limits import Limits, Rate, default_burst
from django_eddyq.maintenance.periodic import (
    ScheduleStatus,
    periodic_schedules,
    run_periodic_now,
    set_periodic_enabled,
)
from django_eddyq.models import (
    Batch,
    Job,
    PeriodicSchedule,
    Queue,
    WorkerProcess,
    WorkflowRun,
    WorkflowStep,
)
from django_eddyq.retention import job_retention_deadline
from django_eddyq.selection import JobFilter, in_states, parse_id, search_jobs
from django_eddyq.vocabulary import TERMINAL_STATES, JobState

#: The admin's actions on every job its list's filters match.
BULK_LABELS = {
    "retry": _("Retry all matching"),
    "cancel": _("Cancel all matching"),
    "delete": _("Delete all matching"),
}
#: The most jobs (or queues) one action changes: select fewer, or filter more narrowly.
ACTION_LIMIT = 1000
#: Arguments, results and tracebacks (a batch's callback arguments too) can hold personal data
#: or secrets: they are shown, and searched, only with this permission. Superusers have it.
PAYLOAD_PERMISSION = "django_eddyq.view_job_payload"
HIDDEN = _("Hidden: needs the view_job_payload permission.")

if TYPE_CHECKING:
    ModelAdminBase = admin.ModelAdmin[Any]
    QueueFormBase = forms.ModelForm[Queue]
else:
    ModelAdminBase = admin.ModelAdmin
    QueueFormBase = forms.ModelForm


def _json(value: Any) -> SafeString:
    """``value`` as indented JSON, escaped, in a ``<pre>``."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return format_html('<pre class="eddyq-json">{}</pre>', text)


def format_datetime(value: datetime) -> str:
    """A date and time in the current time zone, as the admin shows them."""
    return date_format(timezone.localtime(value), "DATETIME_FORMAT")


def _error_time(value: Any) -> str:
    """When an attempt failed (an ISO 8601 string in the error entry), as the admin shows
    times; the text itself if it is not one."""
    if not isinstance(value, str):
        return "?"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, timezone.get_fixed_timezone(0))
    return format_datetime(moment)


def sees_payload(request: HttpRequest) -> bool:
    return request.user.has_perm(PAYLOAD_PERMISSION)


def _hidden_field(description: Any) -> Callable[[Any, Any], str]:
    """A read-only field in place of one that shows arguments, results or tracebacks."""

    @admin.display(description=description)
    def hidden(model_admin: Any, obj: Any) -> str:
        return str(HIDDEN)

    return hidden


def _badge(state: str, label: Any) -> SafeString:
    return format_html('<span class="eddyq-state eddyq-state-{}">{}</span>', state, label)


def _ago(delta: timedelta | None) -> str:
    """How long ago, by the database's clock (``delta`` was computed there): "12s ago"."""
    if delta is None:
        return ""
    seconds = max(round(delta.total_seconds()), 0)
    if seconds >= 3600:
        seconds -= seconds % 60  # to the minute
    return str(_("%(duration)s ago") % {"duration": format_duration(timedelta(seconds=seconds))})


def _worker_url(worker_id: str) -> str:
    return reverse("admin:django_eddyq_workerprocess_change", args=[quote(worker_id)])


def _job_list_url(**params: Any) -> str:
    url = reverse("admin:django_eddyq_job_changelist")
    return f"{url}?{urlencode(params)}" if params else url


# Filters.


class QueueFilter(admin.SimpleListFilter):
    """The queues of the queue table, where enqueues and workers keep a row for each queue in
    use: one bounded query, never a DISTINCT over every job. A queue whose row the queue cleaner
    has removed can still be filtered by URL (``?queue=name``)."""

    title = _("queue")
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = inspection.queue_names()
        value = self.value()
        if value and value not in names:
            names.append(value)
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> Any:
        value = self.value()
        return queryset.filter(queue=value) if value else queryset


class TaskFilter(admin.SimpleListFilter):
    """The tasks of the jobs, read off ``eddyq_jobs_task_idx`` by a skip scan: one index probe
    per distinct task, at most ``inspection.TASK_LIMIT`` of them, never a scan of the jobs. The
    index leaves out available and running jobs, which pass through: a task that has only such
    jobs, or one past the limit, can still be filtered by URL (``?task=path``) or searched."""

    title = _("task")
    parameter_name = "task"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = inspection.task_names()
        value = self.value()
        if value and value not in names:
            names.append(value)
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> Any:
        value = self.value()
        return queryset.filter(task=value) if value else queryset


class BatchFilter(admin.SimpleListFilter):
    """The jobs of one batch (``?batch=<id>``, linked from the batch); shown only when used."""

    title = _("batch")
    parameter_name = "batch"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, str(_("batch %(id)s") % {"id": value}))] if value else []

    def queryset(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> Any:
        value = self.value()
        if not value:
            return queryset
        batch_id = parse_id(value)
        return queryset.none() if batch_id is None else queryset.filter(batch_id=batch_id)


class StateFilter(admin.SimpleListFilter):
    """The jobs in a state (``?state__exact=<state>``, the parameter Django's own filter of the
    field would take), asked so that the state's partial indexes serve it
    (``selection.in_states``)."""

    title = _("state")
    parameter_name = "state__exact"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(str(value), str(label)) for value, label in JobState.choices]

    def queryset(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> Any:
        value = self.value()
        return queryset if not value else queryset.filter(in_states([value]))


class LimitKeyFilter(admin.SimpleListFilter):
    """The jobs counted under one key of their task's limits (``?limit_key=<key>``, linked from
    a job); shown only when used."""

    title = _("limit key")
    parameter_name = "limit_key"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, value or str(_("the whole task")))] if value is not None else []

    def queryset(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> Any:
        value = self.value()
        return queryset if value is None else queryset.filter(limit_key=value)


# The change list: estimated counts, light rows.

DEFERRED_JOB_FIELDS = ("args", "kwargs", "errors", "result", "metadata")


class EddyqChangeList(ChangeList):
    """A list that takes only its filters' parameters from the URL. Django would apply any other
    lookup on a field as it comes: a regex the database refuses, a probe into the arguments, a
    scan without an index. Nor can a value hold a NUL, which PostgreSQL text refuses.
    Either redirects to ``?e=1``, as Django does for a lookup it cannot build."""

    def get_filters(self, request: HttpRequest) -> Any:
        if any("\x00" in value for values in self.filter_params.values() for value in values):
            raise IncorrectLookupParameters("A NUL in a filter's value")
        filters = super().get_filters(request)
        remaining = filters[2]  # the lookups no filter took
        if remaining:
            raise IncorrectLookupParameters(f"Not a filter: {', '.join(remaining)}")
        return filters


class JobChangeList(EddyqChangeList):
    """Rows without their arguments, result and tracebacks: the list shows only the first line
    of the last error, which the database computes."""

    def get_queryset(
        self, request: HttpRequest, exclude_parameters: list[str | None] | None = None
    ) -> models.QuerySet[Any]:
        queryset = super().get_queryset(request, exclude_parameters).defer(*DEFERRED_JOB_FIELDS)
        annotated: models.QuerySet[Any] = queryset.annotate(
            last_error=inspection.LastErrorLine("errors")
        )
        return annotated


class EddyqAdmin(ModelAdminBase):
    """Read-only pages: nothing is added, every change is an action or one of the
    ``editable_fields`` (which only a user who may change edits, and the admin's ``save_model``
    saves through the API), and a POST by a user who may not change (or delete) is refused with
    403, as is one naming an action whose permission the user lacks (rather than Django's "no
    action selected")."""

    show_facets = admin.ShowFacets.NEVER  # a COUNT per filter choice over every row
    #: The form's fields on the change page; none: the page saves nothing.
    editable_fields: tuple[str, ...] = ()

    @property
    def media(self) -> forms.Media:
        return super().media + forms.Media(css={"all": ("django_eddyq/admin.css",)})

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        editable = self.editable_fields if self.saves_changes(request, obj) else ()
        fields: list[str] = []
        for _name, options in self.get_fieldsets(request, obj):
            for field in options["fields"]:
                names = field if isinstance(field, tuple | list) else [field]
                fields.extend(name for name in names if name not in editable)
        return fields

    def saves_changes(self, request: HttpRequest, obj: Any = None) -> bool:
        """Whether the change page is a form that this user saves."""
        return bool(self.editable_fields) and self.has_change_permission(request, obj)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return EddyqChangeList

    def is_object_id(self, value: str) -> bool:
        """Whether ``value`` can be a primary key: a bigint in ASCII digits, or text without the
        NUL that PostgreSQL refuses. Django would take any digits int() reads, fail on others."""
        if isinstance(self.opts.pk, models.IntegerField):
            return parse_id(value) is not None
        return "\x00" not in value

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        if not self.is_object_id(object_id):
            return None  # "doesn't exist"
        return super().get_object(request, object_id, from_field)

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        saves = self.saves_changes(request)
        if request.method == "POST" and object_id is not None and not saves:
            raise PermissionDenied  # nothing to save: changes are actions
        extra_context = {
            "title": capfirst(self.opts.verbose_name),
            **(extra_context or {}),
            "show_save": saves,
            "show_save_and_continue": saves,
            "show_save_and_add_another": False,
        }
        return super().changeform_view(request, object_id, form_url, extra_context)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST":
            self.check_post_permission(request)
            # Django filters on the selected values as they come, failing on one that cannot be
            # a primary key.
            if not all(map(self.is_object_id, request.POST.getlist(ACTION_CHECKBOX_NAME))):
                message = _("Nothing was changed: the selection is not valid.")
                self.message_user(request, message, messages.ERROR)
                return HttpResponseRedirect(request.get_full_path())
        extra_context = {"title": capfirst(self.opts.verbose_name_plural), **(extra_context or {})}
        return super().changelist_view(request, extra_context)

    def check_post_permission(self, request: HttpRequest) -> None:
        if not (self.has_change_permission(request) or self.has_delete_permission(request)):
            raise PermissionDenied
        # Every action named, not the one "index" picks: Django reads the index its own way
        # (int() of any digits, the last action when out of range), so whichever it runs.
        for name in request.POST.getlist("action"):
            permissions = getattr(getattr(type(self), name, None), "allowed_permissions", ())
            for permission in permissions:
                if not getattr(self, f"has_{permission}_permission")(request):
                    raise PermissionDenied

    def selected(
        self, request: HttpRequest, queryset: models.QuerySet[Any], fields: Sequence[str]
    ) -> list[Any] | None:
        """The objects an action works on, at most ACTION_LIMIT; None, saying so, if more."""
        objects = list(queryset.order_by("pk").only(*fields)[: ACTION_LIMIT + 1])
        if len(objects) > ACTION_LIMIT:
            message = _(
                "An action changes at most %(limit)d objects at a time: select fewer, or "
                "filter the list more narrowly. Nothing was changed."
            )
            self.message_user(request, message % {"limit": ACTION_LIMIT}, messages.ERROR)
            return None
        return objects


class EstimatingAdmin(EddyqAdmin):
    """A list that never counts more than ``EXACT_COUNT_LIMIT`` rows: an estimate past that."""

    paginator = inspection.EstimatingPaginator
    show_full_result_count = False

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: models.QuerySet[Any],
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> inspection.EstimatingPaginator:
        # Unfiltered when the list selects exactly what the admin's queryset does.
        unfiltered = queryset.query.where == self.get_queryset(request).query.where
        return inspection.EstimatingPaginator(
            queryset, per_page, orphans, allow_empty_first_page, unfiltered=unfiltered
        )


def _back_to_job(request: HttpRequest, jobs: Sequence[Job]) -> HttpResponse | None:
    """After an action started from a job's page, back to that page."""
    if request.POST.get("_eddyq_from_job") and len(jobs) == 1:
        return HttpResponseRedirect(reverse("admin:django_eddyq_job_change", args=[jobs[0].pk]))
    return None


# Jobs.


@admin.register(Job)
class JobAdmin(EstimatingAdmin):
    list_display = (
        "id",
        "task",
        "queue",
        "state_badge",
        "attempts",
        "run_at",
        "finalized_at",
        "last_error_line",
        "retention_display",
    )
    list_display_links = ("id",)
    list_filter = (StateFilter, QueueFilter, TaskFilter, BatchFilter, LimitKeyFilter)
    # Shown as the search box; get_search_results does the searching.
    search_fields = ("=id", "task", "args")
    search_help_text = _(
        "A job id; or words to find in task paths and arguments (put a number in its context, "
        'like "user_id": 42). Searching words reads every job that the filters keep.'
    )
    ordering = ("-id",)
    sortable_by = ("id",)  # the only order with an index for every filter
    list_per_page = 50
    # delete_selected replaces the site-wide action of that name.
    actions = ("retry_jobs", "cancel_jobs", "delete_selected")
    change_list_template = "admin/django_eddyq/job/change_list.html"
    change_form_template = "admin/django_eddyq/job/change_form.html"

    summary_fields = (
        ("id", "state_badge", "attempts", "worker_display", "priority"),
        ("task", "queue", "batch_link", "workflow_link"),
        ("created_at", "run_at", "attempted_at", "finalized_at"),
        ("retention_display", "unique_key", "limit_key_link"),
    )
    lease_fields = ("lease_display", ("locked_by", "locked_until", "heartbeat_at"))

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The errors first, after the summary: what an operator opens a job for. The lease
        too, while the job runs; otherwise folded at the end."""
        running = obj is not None and obj.state == Job.State.RUNNING
        payload = sees_payload(request)
        lease = (
            _("Lease"),
            {
                "fields": (*self.lease_fields, "cancel_requested_at"),
                "classes": () if running else ("collapse",),
            },
        )
        return (
            (None, {"fields": self.summary_fields}),
            *([lease] if running else []),
            (
                _("Errors, one per failed attempt, oldest first"),
                {"fields": ("errors_display" if payload else "errors_without_tracebacks",)},
            ),
            (
                _("Arguments"),
                {
                    "fields": ("args_json", "kwargs_json")
                    if payload
                    else ("args_hidden", "kwargs_hidden")
                },
            ),
            (_("Result"), {"fields": ("result_json" if payload else "result_hidden",)}),
            *([] if running else [lease]),
            (
                _("Metadata"),
                {"fields": ("retention_json", "metadata_json"), "classes": ("collapse",)},
            ),
        )

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        """The job, knowing which of its attempts' workers have a row on the Workers page that
        this user may see (one query), for the links."""
        job = super().get_object(request, object_id, from_field)
        if job is not None:
            job.eddyq_linked_workers = self._linked_workers(request, job)
        return job

    def _linked_workers(self, request: HttpRequest, job: Job) -> frozenset[str]:
        if not self.admin_site.is_registered(WorkerProcess):
            return frozenset()
        if not self.admin_site.get_model_admin(WorkerProcess).has_view_permission(request):
            return frozenset()
        workers = {worker for worker in (job.attempted_by, job.locked_by) if worker}
        if isinstance(job.errors, list):
            for entry in job.errors:
                if isinstance(entry, dict):
                    worker = entry.get("worker") or entry.get("rescued_from")
                    if isinstance(worker, str) and worker:
                        workers.add(worker)
        if not workers:
            return frozenset()
        rows = WorkerProcess.objects.using(job._state.db).filter(pk__in=workers)
        return frozenset(rows.values_list("pk", flat=True))

    @staticmethod
    def _worker(job: Job, worker_id: str) -> SafeString | str:
        """A worker's id, linked to its row of the Workers page when it has one (see
        get_object)."""
        if worker_id in getattr(job, "eddyq_linked_workers", ()):
            return format_html('<a href="{}">{}</a>', _worker_url(worker_id), worker_id)
        return worker_id

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        changelist = super().get_changelist_instance(request)
        if not sees_payload(request):
            changelist.search_help_text = str(
                _(
                    "A job id; or words to find in task paths. Searching words reads every job "
                    "that the filters keep."
                )
            )
        return changelist

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra_context = {
            **(extra_context or {}),
            # Read (one query per part) only as the template shows it: not on a POST.
            "eddyq_overview": inspection.Overview(),
            "eddyq_queue_admin": self.admin_site.is_registered(Queue),
            "eddyq_bulk_links": self._bulk_links(request),
        }
        return super().changelist_view(request, extra_context)

    # Actions on every job the list's filters match, not only the selected ones.

    #: Jobs per batch of an "all matching" action, each batch a transaction of its own.
    bulk_batch_size = bulk.BATCH_SIZE
    #: No request of an "all matching" action starts a batch past this many seconds: it shows
    #: its progress and continues in the next request.
    bulk_seconds = 5.0
    #: The list's parameters that are its filters, as JobFilter reads them; "o" and "p" (the
    #: order and the page) select nothing.
    BULK_PARAMETERS = frozenset(
        {"state__exact", "queue", "task", "batch", "limit_key", "q", "o", "p"}
    )

    def get_urls(self) -> list[URLPattern]:
        own = [
            path(
                "activity/",
                self.admin_site.admin_view(self.activity_view),
                name="django_eddyq_job_activity",
            ),
            path(
                "bulk/<str:operation>/",
                self.admin_site.admin_view(self.bulk_view),
                name="django_eddyq_job_bulk",
            ),
        ]
        return own + super().get_urls()

    def _may(self, request: HttpRequest, operation: str) -> bool:
        if operation == "delete":
            return self.has_delete_permission(request)
        return self.has_change_permission(request)

    def _bulk_links(self, request: HttpRequest) -> list[tuple[str, str]]:
        query = request.GET.urlencode()
        return [
            (
                reverse("admin:django_eddyq_job_bulk", args=[operation])
                + (f"?{query}" if query else ""),
                str(label),
            )
            for operation, label in BULK_LABELS.items()
            if self._may(request, operation)
        ]

    def bulk_filter(self, request: HttpRequest) -> JobFilter | None:
        """The filter of the list's parameters, as the list applies them; None for a
        parameter that is not one of its filters, or a value it cannot take."""
        parameters = request.GET
        if set(parameters) - self.BULK_PARAMETERS:
            return None
        if any("\x00" in value for values in parameters.lists() for value in values[1]):
            return None
        batch = None
        if parameters.get("batch"):
            batch = parse_id(parameters["batch"])
            if batch is None:
                return None
        try:
            return JobFilter(
                states=tuple(filter(None, parameters.getlist("state__exact"))),
                queues=tuple(filter(None, parameters.getlist("queue")))[-1:],
                tasks=tuple(filter(None, parameters.getlist("task")))[-1:],
                batch=batch,
                limit_key=parameters.get("limit_key"),
                search=parameters.get("q", ""),
                search_arguments=sees_payload(request),
            )
        except ValueError:
            return None

    def bulk_view(self, request: HttpRequest, operation: str) -> HttpResponse:
        """Retry, cancel or delete every job the list's filters match: a confirmation page
        with the count (estimated past ``EXACT_COUNT_LIMIT``) and the filter in words; on
        POST, ``bulk`` batches for at most ``bulk_seconds``, then either the list with a
        summary, or a page of progress whose form (submitted by itself, or by hand without
        JavaScript) carries the walk's position to the next request."""
        if operation not in bulk.OPERATIONS:
            raise Http404
        if not self._may(request, operation):
            raise PermissionDenied
        back = _job_list_url() + (f"?{request.GET.urlencode()}" if request.GET else "")
        selection = self.bulk_filter(request)
        if selection is None:
            message = _("Nothing was changed: the list's filters are not valid.")
            self.message_user(request, message, messages.ERROR)
            return HttpResponseRedirect(_job_list_url())
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": BULK_LABELS[operation],
            "operation": operation,
            "label": BULK_LABELS[operation],
            "selection": selection.describe(),
            "rule": bulk.RULES[operation],
            "back": back,
            "media": self.media + forms.Media(js=("django_eddyq/bulk.js",)),
        }
        request.current_app = self.admin_site.name
        template = "admin/django_eddyq/job/bulk_confirmation.html"
        if request.method != "POST" or request.POST.get("post") != "yes":
            count, estimated = inspection.estimated_count(
                selection.apply(self.get_queryset(request))
            )
            context.update(count=count, count_shown=f"{count:,}", estimated=estimated)
            return TemplateResponse(request, template, context)
        totals = {
            name: parse_id(request.POST.get(name, "0")) or 0
            for name in ("after", "end", "matched", "changed", "requested")
        }
        result = bulk.OPERATIONS[operation](
            selection,
            batch_size=self.bulk_batch_size,
            seconds=self.bulk_seconds,
            after=totals["after"],
            end=totals["end"] if request.POST.get("end") else None,
            on_batch=lambda changed: self._log_bulk(request, operation, changed),
        )
        result.matched += totals["matched"]
        result.changed += totals["changed"]
        result.cancel_requested += totals["requested"]
        if not result.done:
            context.update(
                result=result,
                matched_shown=f"{result.matched:,}",
                changed_shown=f"{result.changed:,}",
            )
            return TemplateResponse(request, template, context)
        self.message_user(request, _bulk_summary(operation, result), messages.SUCCESS)
        return HttpResponseRedirect(back)

    def _log_bulk(self, request: HttpRequest, operation: str, changed: list[Any]) -> None:
        """One admin log entry per job changed, written in its batch's transaction."""
        messages_by_state = {
            "retry": "Retried: available now",
            "cancel": "Cancelled",
            "delete": "",
        }
        user_id = request.user.pk
        assert user_id is not None  # admin_view lets only staff users in
        entries = [Job(pk=job.id, task=job.task, state=job.state) for job in changed]
        requested = operation == "cancel"
        for flag, jobs, message in (
            (
                DELETION if operation == "delete" else CHANGE,
                [job for job in entries if not (requested and job.state == Job.State.RUNNING)],
                messages_by_state[operation],
            ),
            (
                CHANGE,
                [job for job in entries if requested and job.state == Job.State.RUNNING],
                "Cancel requested: its worker stops it",
            ),
        ):
            if jobs:
                LogEntry.objects.log_actions(
                    user_id=user_id,
                    queryset=jobs,
                    action_flag=flag,
                    change_message=message,
                )

    # The activity page.

    def activity_view(self, request: HttpRequest) -> HttpResponse:
        """Charts of the jobs finished and the queues' depth, the last hour per minute and the
        last 7 days per hour, of every queue or of ``?queue=``: read from the activity
        counters (a few thousand rows at most), never from the jobs."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        queue = request.GET.get("queue") or None
        hour = activity.activity(timedelta(hours=1), timedelta(minutes=1), queue=queue)
        week = activity.activity(timedelta(days=7), timedelta(hours=1), queue=queue)
        interval = eddyq_settings.ACTIVITY_SAMPLE_INTERVAL
        context = {
            **self.admin_site.each_context(request),
            "title": _("Activity"),
            "opts": self.opts,
            "media": self.media,
            "queue": queue,
            "queues": inspection.queue_names(),
            "sample_interval": None if interval is None else format_duration(interval),
            "charts": [
                activity_charts(
                    hour,
                    chart_id="eddyq-activity-hour",
                    heading=str(_("the last hour, per minute")),
                    label_every=10,
                    label_format="%H:%M",
                ),
                activity_charts(
                    week,
                    chart_id="eddyq-activity-week",
                    heading=str(_("the last 7 days, per hour")),
                    label_every=24,
                    label_format="%a %d %b",
                ),
            ],
        }
        return TemplateResponse(request, "admin/django_eddyq/job/activity.html", context)

    def get_search_results(
        self, request: HttpRequest, queryset: models.QuerySet[Any], search_term: str
    ) -> tuple[models.QuerySet[Any], bool]:
        """The search of ``selection.search_jobs``: a number finds the job of that id; words
        are looked for in task paths, and in arguments for a user who may see them."""
        return search_jobs(queryset, search_term, arguments=sees_payload(request)), False

    # Columns and fields.

    @admin.display(description=_("state"), ordering="state")
    def state_badge(self, job: Job) -> SafeString:
        badge = _badge(job.state, job.get_state_display())
        if job.state == Job.State.RUNNING and job.cancel_requested_at is not None:
            return format_html("{} {}", badge, _("(cancel requested)"))
        return badge

    @admin.display(description=_("attempt"))
    def attempts(self, job: Job) -> str:
        return f"{job.attempt} / {job.max_attempts}"

    @admin.display(description=_("worker"))
    def worker_display(self, job: Job) -> SafeString | str:
        """The worker of the latest attempt: the one holding it while it runs, else the one
        that ran it last."""
        worker = (job.locked_by if job.state == Job.State.RUNNING else None) or job.attempted_by
        if not worker:
            return "—"
        return self._worker(job, worker)

    @admin.display(description=_("last error"))
    def last_error_line(self, job: Job) -> str:
        line = getattr(job, "last_error", None)
        if line is None and "errors" not in job.get_deferred_fields():
            line = inspection.last_error_line(job.errors)
        return Truncator(line).chars(inspection.ERROR_LINE_CHARACTERS) if line else ""

    @admin.display(description=_("deleted by retention"))
    def retention_display(self, job: Job) -> str:
        if not job.is_terminal:
            return "—"
        deadline = job_retention_deadline(job)
        return str(_("kept forever")) if deadline is None else format_datetime(deadline)

    @admin.display(description=_("batch"))
    def batch_link(self, job: Job) -> SafeString | str:
        if job.batch_id is None:
            return "—"
        url = reverse("admin:django_eddyq_batch_change", args=[job.batch_id])
        return format_html('<a href="{}">{}</a>', url, _("batch %(id)s") % {"id": job.batch_id})

    @admin.display(description=_("limit key"))
    def limit_key_link(self, job: Job) -> SafeString | str:
        """The key its task's limits count it under, linked to the task's jobs of that key."""
        if job.limit_key is None:
            return "—"
        url = reverse("admin:django_eddyq_job_changelist")
        query = urlencode({"task": job.task, "limit_key": job.limit_key})
        return format_html(
            '<a href="{}?{}">{}</a>', url, query, job.limit_key or _("the whole task")
        )

    @admin.display(description=_("workflow"))
    def workflow_link(self, job: Job) -> SafeString | str:
        """The workflow the job is a step of, by its step row (never by its metadata)."""
        step = WorkflowStep.objects.filter(job_id=job.pk).values_list("workflow_id", "name")
        found = step.first()
        if found is None:
            return "-"
        workflow_id, name = found
        url = reverse("admin:django_eddyq_workflowrun_change", args=[workflow_id])
        return format_html('<a href="{}">#{}</a>, step {}', url, workflow_id, name)

    @admin.display(description=_("positional arguments"))
    def args_json(self, job: Job) -> SafeString:
        return _json(job.args)

    @admin.display(description=_("keyword arguments"))
    def kwargs_json(self, job: Job) -> SafeString:
        return _json(job.kwargs)

    @admin.display(description=_("result"))
    def result_json(self, job: Job) -> SafeString:
        return _json(job.result)

    args_hidden = _hidden_field(_("positional arguments"))
    kwargs_hidden = _hidden_field(_("keyword arguments"))
    result_hidden = _hidden_field(_("result"))

    @admin.display(description=_("retention override"))
    def retention_json(self, job: Job) -> SafeString:
        return _json(job.retention)

    @admin.display(description=_("metadata"))
    def metadata_json(self, job: Job) -> SafeString:
        return _json(job.metadata)

    @admin.display(description=_("errors"))
    def errors_display(self, job: Job) -> SafeString | str:
        return self._errors_of(job, payload=True)

    @admin.display(description=_("errors"))
    def errors_without_tracebacks(self, job: Job) -> SafeString | str:
        return self._errors_of(job, payload=False)

    @classmethod
    def _attempt_worker(cls, job: Job, entry: dict[str, Any]) -> SafeString | str:
        """Who ran the failed attempt of ``entry``: its worker, or the one it was rescued
        from."""
        for key, label in (("worker", _("worker")), ("rescued_from", _("rescued from"))):
            worker = entry.get(key)
            if worker:
                return format_html(" · {} {}", label, cls._worker(job, str(worker)))
        return ""

    @classmethod
    def _errors_of(cls, job: Job, *, payload: bool) -> SafeString | str:
        """Each attempt's error; its traceback, or an entry of another shape, with ``payload``."""
        if not job.errors:
            return str(_("No errors."))
        items = []
        for number, entry in enumerate(job.errors, start=1):
            if not isinstance(entry, dict):
                items.append(format_html("<li>{}</li>", _json(entry) if payload else HIDDEN))
                continue
            heading = format_html(
                '<div class="eddyq-error-heading">{} {} · {} · <strong>{}</strong>{}</div>',
                _("Attempt"),
                entry.get("attempt", number),
                _error_time(entry.get("at")),
                entry.get("error", ""),
                cls._attempt_worker(job, entry),
            )
            traceback = entry.get("traceback") or ""
            if traceback and payload:
                body = format_html('<pre class="eddyq-traceback">{}</pre>', traceback)
            else:
                note = _("Traceback hidden: needs the view_job_payload permission.")
                body = format_html(
                    '<p class="eddyq-no-traceback">{}</p>',
                    note if traceback else _("No traceback."),
                )
            items.append(format_html("<li>{}{}</li>", heading, body))
        return format_html(
            '<ol class="eddyq-errors">{}</ol>', format_html_join("", "{}", ((i,) for i in items))
        )

    @admin.display(description=_("lease"))
    def lease_display(self, job: Job) -> str:
        if job.state != Job.State.RUNNING:
            return str(_("Not running: no lease."))
        if job.locked_until is None:
            return str(_("Running without a lease."))
        lease = _("Leased to %(worker)s until %(until)s") % {
            "worker": job.locked_by or "?",
            "until": format_datetime(job.locked_until),
        }
        if job.locked_until < timezone.now():
            lease = _("%(lease)s: expired, the rescuer takes it back") % {"lease": lease}
        if job.heartbeat_at is not None:
            lease = _("%(lease)s; last heartbeat %(at)s") % {
                "lease": lease,
                "at": format_datetime(job.heartbeat_at),
            }
        return str(lease)

    # Permissions.

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Only ended jobs can be deleted, as retention would: cancel the others first. A job
        deleted while it runs would go on running, its worker's outcome written nowhere."""
        if obj is not None and not obj.is_terminal:
            return False
        allowed: bool = super().has_delete_permission(request, obj)
        return allowed

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        # Only if it has still ended now (it may have been retried meanwhile).
        Job.all_objects.filter(pk=obj.pk, state__in=list(TERMINAL_STATES)).delete()

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        extra_context = {
            **(extra_context or {}),
            "eddyq_can_change": self.has_change_permission(request),
            "eddyq_changelist_url": reverse("admin:django_eddyq_job_changelist"),
        }
        return super().change_view(request, object_id, form_url, extra_context)

    # Actions.

    @admin.action(permissions=["change"], description=_("Retry selected jobs now"))
    def retry_jobs(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> Any:
        jobs = self.selected(request, queryset, ("id", "task", "state"))
        if jobs is None:
            return None
        retried, left, completed = [], [], []
        for job in jobs:
            before = job.state
            try:
                changed = job.retry()
            except ValueError:
                completed.append(job)
                continue
            if changed:
                retried.append(job)
                self.log_change(request, job, f"Retried: {before} → {job.state}")
            else:
                left.append(job)
        if retried:
            self._report(request, messages.SUCCESS, retried, "Retried %(ids)s: available now.")
        if left:
            self._report(
                request,
                messages.WARNING,
                left,
                "Left %(ids)s alone: already available or running.",
            )
        if completed:
            self._report(
                request, messages.ERROR, completed, "%(ids)s completed: cannot be retried."
            )
        return _back_to_job(request, jobs)

    @admin.action(permissions=["change"], description=_("Cancel selected jobs"))
    def cancel_jobs(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> Any:
        jobs = self.selected(request, queryset, ("id", "task", "state"))
        if jobs is None:
            return None
        cancelled, requested, left = [], [], []
        for job in jobs:
            before = job.state
            if not job.cancel():
                left.append(job)
            elif job.state == Job.State.RUNNING:
                requested.append(job)
                self.log_change(request, job, "Cancel requested: its worker stops it")
            else:
                cancelled.append(job)
                self.log_change(request, job, f"Cancelled: {before} → {job.state}")
        if cancelled:
            self._report(request, messages.SUCCESS, cancelled, "Cancelled %(ids)s.")
        if requested:
            self._report(
                request,
                messages.SUCCESS,
                requested,
                "Asked the workers of %(ids)s to stop: running, they end cancelled unless "
                "they finish first.",
            )
        if left:
            self._report(
                request,
                messages.WARNING,
                left,
                "Left %(ids)s alone: already ended, or already being cancelled.",
            )
        return _back_to_job(request, jobs)

    @admin.action(permissions=["delete"], description=_("Delete selected ended jobs"))
    def delete_selected(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> Any:
        """Deletes completed, failed and cancelled jobs, after a confirmation page; refuses
        the others (cancel them first), as deleting a job a worker runs would not stop it."""
        jobs = self.selected(request, queryset, ("id", "task", "state"))
        if jobs is None:
            return None
        ended = [job for job in jobs if job.is_terminal]
        unfinished = [job for job in jobs if not job.is_terminal]
        if unfinished:
            self._report(
                request,
                messages.WARNING,
                unfinished,
                "Not deleting %(ids)s: they have not ended. Cancel them first.",
            )
        if not ended:
            return None
        if request.POST.get("post") != "yes":
            context = {
                **self.admin_site.each_context(request),
                "title": _("Delete jobs?"),
                "opts": self.opts,
                "jobs": ended,
                "action": "delete_selected",
                "action_checkbox_name": ACTION_CHECKBOX_NAME,
                "media": self.media,
            }
            request.current_app = self.admin_site.name
            return TemplateResponse(
                request, "admin/django_eddyq/job/delete_jobs_confirmation.html", context
            )
        with transaction.atomic(using=queryset.db):
            # Locked, and only those still ended: one may have been retried meanwhile.
            locked = (
                Job.objects.using(queryset.db)
                .filter(pk__in=[job.pk for job in ended], state__in=list(TERMINAL_STATES))
                .select_for_update()
                .only("id", "task", "state")
                .order_by("pk")
            )
            doomed = list(locked)  # the log entries below read the same evaluated queryset
            if doomed:
                self.log_deletions(request, locked)
                Job.all_objects.using(queryset.db).filter(pk__in=[j.pk for j in doomed]).delete()
        if doomed:
            self._report(request, messages.SUCCESS, doomed, "Deleted %(ids)s.")
        return None

    def _report(
        self, request: HttpRequest, level: int, objects: Sequence[Any], template: str
    ) -> None:
        ids = ", ".join(f"#{obj.pk}" for obj in objects[:20])
        if len(objects) > 20:
            ids += f" and {len(objects) - 20} more"
        noun = ngettext("job", "jobs", len(objects))
        self.message_user(request, template % {"ids": f"{noun} {ids}"}, level)


def _bulk_summary(operation: str, result: bulk.BulkResult) -> str:
    done = {"retry": _("Retried"), "cancel": _("Cancelled"), "delete": _("Deleted")}[operation]
    summary = _("%(done)s %(changed)s of %(matched)s matching jobs; %(skipped)s left alone.") % {
        "done": done,
        "changed": f"{result.changed:,}",
        "matched": f"{result.matched:,}",
        "skipped": f"{result.skipped:,}",
    }
    if result.cancel_requested:
        summary += " " + _("%(requested)s running: their workers are asked to stop.") % {
            "requested": f"{result.cancel_requested:,}"
        }
    return str(summary)


# Workflows.


@admin.register(WorkflowRun)
class WorkflowRunAdmin(EstimatingAdmin):
    """A workflow: its counts, a graph of its steps and their list (the first
    ``inspection.WORKFLOW_STEPS_SHOWN``, summarised by the counts beyond); actions, on the
    list and as its page's buttons, retry its failed steps (``WorkflowRun.retry_failed``) and
    cancel it (``WorkflowRun.cancel``)."""

    list_display = (
        "id",
        "name",
        "state_badge",
        "steps",
        "unfinished",
        "failed",
        "created_at",
        "finalized_at",
    )
    list_filter = ("state",)
    search_fields = ("=id", "name")
    ordering = ("-id",)
    sortable_by = ("id",)
    actions = ("retry_failed_steps", "cancel_workflows")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        return (
            (
                None,
                {
                    "fields": (
                        ("id", "name", "state_badge"),
                        ("steps", "unfinished", "failed", "retention_display"),
                        ("created_at", "finalized_at"),
                    )
                },
            ),
            (_("Graph"), {"fields": ("graph",)}),
            (_("Steps"), {"fields": ("steps_table",)}),
        )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the cleaner deletes a workflow with its jobs, past its retention

    def _shown_steps(self, run: WorkflowRun) -> list[inspection.StepRow]:
        """Its first steps, read once for the graph and the list."""
        shown: list[inspection.StepRow] | None = getattr(run, "eddyq_steps", None)
        if shown is None:
            shown = inspection.workflow_steps(run.pk)
            run.eddyq_steps = shown  # type: ignore[attr-defined]
        return shown

    def _summary(self, run: WorkflowRun, shown: int) -> str:
        if run.steps <= shown:
            return ""
        return str(
            _(
                "The first %(shown)d of its %(steps)d steps; of them all, %(unfinished)d have "
                "not ended and %(failed)d failed or were cancelled."
            )
            % {
                "shown": shown,
                "steps": run.steps,
                "unfinished": run.unfinished,
                "failed": run.failed,
            }
        )

    @admin.display(description=_("state"), ordering="state")
    def state_badge(self, run: WorkflowRun) -> SafeString:
        return _badge(run.state, run.get_state_display())

    @admin.display(description=_("retention"))
    def retention_display(self, run: WorkflowRun) -> str:
        if run.retention is None:
            return str(_("forever"))
        return format_duration(timedelta(seconds=run.retention))

    @admin.display(description=_("graph"))
    def graph(self, run: WorkflowRun) -> SafeString:
        steps = self._shown_steps(run)
        drawn = workflow_graph(
            [
                GraphStep(
                    step.job_id,
                    step.name,
                    step.state,
                    reverse("admin:django_eddyq_job_change", args=[step.job_id]),
                    step.after,
                )
                for step in steps
            ],
            str(_("The steps of workflow %(name)s") % {"name": run.name}),
        )
        summary = self._summary(run, len(steps))
        return format_html(
            '<div class="eddyq-graph-box">{}</div>{}',
            drawn,
            format_html("<p>{}</p>", summary) if summary else "",
        )

    @admin.display(description=_("steps"))
    def steps_table(self, run: WorkflowRun) -> SafeString:
        steps = self._shown_steps(run)
        rows = format_html_join(
            "",
            '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td></tr>',
            (
                (
                    reverse("admin:django_eddyq_job_change", args=[step.job_id]),
                    step.name,
                    _badge(step.state, step.state),
                    f"{step.attempt} / {step.max_attempts}",
                    "" if step.seconds is None else f"{step.seconds:.3f} s",
                )
                for step in steps
            ),
        )
        return format_html(
            "<table><thead><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr></thead>"
            "<tbody>{}</tbody></table>{}",
            _("step"),
            _("state"),
            _("attempts"),
            _("duration"),
            rows,
            format_html("<p>{}</p>", summary)
            if (summary := self._summary(run, len(steps)))
            else "",
        )

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        extra_context = {
            **(extra_context or {}),
            "eddyq_can_change": self.has_change_permission(request),
            "eddyq_changelist_url": reverse("admin:django_eddyq_workflowrun_changelist"),
        }
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.action(permissions=["change"], description=_("Retry the failed steps"))
    def retry_failed_steps(
        self, request: HttpRequest, queryset: models.QuerySet[Any]
    ) -> HttpResponse | None:
        runs = self.selected(request, queryset, ("id", "name"))
        if runs is None:
            return None
        for run in runs:
            retried = run.retry_failed()
            self.log_change(request, run, f"Retried {retried} failed or cancelled steps")
            self.message_user(
                request,
                ngettext(
                    "Workflow %(name)s: %(count)d step retried.",
                    "Workflow %(name)s: %(count)d steps retried.",
                    retried,
                )
                % {"name": run.name, "count": retried},
                messages.SUCCESS if retried else messages.WARNING,
            )
        return _back_to_workflow(request, runs)

    @admin.action(permissions=["change"], description=_("Cancel the workflows"))
    def cancel_workflows(
        self, request: HttpRequest, queryset: models.QuerySet[Any]
    ) -> HttpResponse | None:
        runs = self.selected(request, queryset, ("id", "name"))
        if runs is None:
            return None
        for run in runs:
            cancelled = run.cancel()
            self.log_change(request, run, f"Cancelled {cancelled} unfinished steps")
            self.message_user(
                request,
                ngettext(
                    "Workflow %(name)s: %(count)d step cancelled.",
                    "Workflow %(name)s: %(count)d steps cancelled.",
                    cancelled,
                )
                % {"name": run.name, "count": cancelled},
                messages.SUCCESS if cancelled else messages.WARNING,
            )
        return _back_to_workflow(request, runs)


def _back_to_workflow(request: HttpRequest, runs: Sequence[WorkflowRun]) -> HttpResponse | None:
    """After an action started from a workflow's page, back to that page."""
    if request.POST.get("_eddyq_from_workflow") and len(runs) == 1:
        return HttpResponseRedirect(
            reverse("admin:django_eddyq_workflowrun_change", args=[runs[0].pk])
        )
    return None


# Batches.


def _job_counts() -> Subquery:
    """The counts of a batch's visible jobs per state, as one JSON object: one index scan of
    its jobs (eddyq_jobs_batch_idx)."""
    counts = {state: Count("pk", filter=Q(state=state)) for state in Job.State.values}
    return Subquery(
        Job.objects.filter(batch=OuterRef("pk"))
        .order_by()
        .values("batch")
        .annotate(counts=JSONObject(**counts))
        .values("counts")
    )


def _counts_badges(counts: dict[str, int] | None, batch_id: int) -> SafeString | str:
    if not counts or not any(counts.values()):
        return str(_("no jobs"))
    labels = dict(Job.State.choices)
    return format_html_join(
        " ",
        '<a href="{}">{}</a>',
        (
            (
                _job_list_url(batch=batch_id, state__exact=state),
                _badge(state, f"{labels[state]} {n}"),
            )
            for state, n in counts.items()
            if n
        ),
    )


@admin.register(Batch)
class BatchAdmin(EstimatingAdmin):
    list_display = (
        "id",
        "state_badge",
        "sealed",
        "callback_task",
        "job_counts",
        "created_at",
        "finalized_at",
        "jobs_link",
    )
    list_filter = ("state",)
    search_fields = ("=id", "callback_task")
    ordering = ("-id",)
    sortable_by = ("id",)
    actions = None

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The callback's arguments are a job's arguments: shown only with the same permission."""
        callback_args = (
            ("callback_args_json", "callback_kwargs_json")
            if sees_payload(request)
            else ("callback_args_hidden", "callback_kwargs_hidden")
        )
        return (
            (
                None,
                {
                    "fields": (
                        "id",
                        "state_badge",
                        "sealed",
                        "job_counts",
                        "jobs_link",
                        "created_at",
                        "finalized_at",
                    )
                },
            ),
            (_("Callback"), {"fields": ("callback_task", *callback_args, "callback_job_link")}),
            (_("Metadata"), {"fields": ("metadata_json",)}),
        )

    def get_queryset(self, request: HttpRequest) -> models.QuerySet[Any]:
        queryset: models.QuerySet[Any] = (
            super().get_queryset(request).annotate(counts_by_state=_job_counts())
        )
        return queryset

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # retention deletes batches; deleting a pending one would lose its callback

    @admin.display(description=_("state"), ordering="state")
    def state_badge(self, batch: Batch) -> SafeString:
        return _badge(batch.state, batch.get_state_display())

    @admin.display(description=_("jobs per state"))
    def job_counts(self, batch: Batch) -> SafeString | str:
        return _counts_badges(getattr(batch, "counts_by_state", None), batch.pk)

    @admin.display(description=_("jobs"))
    def jobs_link(self, batch: Batch) -> SafeString:
        return format_html('<a href="{}">{}</a>', _job_list_url(batch=batch.pk), _("its jobs"))

    @admin.display(description=_("callback arguments"))
    def callback_args_json(self, batch: Batch) -> SafeString:
        return _json(batch.callback_args)

    @admin.display(description=_("callback keyword arguments"))
    def callback_kwargs_json(self, batch: Batch) -> SafeString:
        return _json(batch.callback_kwargs)

    callback_args_hidden = _hidden_field(_("callback arguments"))
    callback_kwargs_hidden = _hidden_field(_("callback keyword arguments"))

    @admin.display(description=_("callback job"))
    def callback_job_link(self, batch: Batch) -> SafeString | str:
        if batch.callback_job is None:
            return "—"
        url = reverse("admin:django_eddyq_job_change", args=[batch.callback_job])
        return format_html('<a href="{}">#{}</a>', url, batch.callback_job)

    @admin.display(description=_("metadata"))
    def metadata_json(self, batch: Batch) -> SafeString:
        return _json(batch.metadata)


# Queues.

#: The fields of the queue's limits form, named as ``set_queue_limits`` takes them.
LIMIT_FIELDS = ("concurrency", "rate", "burst")


def queue_rate(queue: Queue) -> Rate | None:
    """The rate its row holds, or None (the row's checks keep the three columns together)."""
    if queue.rate_limit is None or queue.rate_period is None or queue.rate_burst is None:
        return None
    return Rate(queue.rate_limit, queue.rate_period, queue.rate_burst)


def limits_text(queue: Queue) -> str:
    """Its limits as the queue list shows them: "≤ 5 running · 100/m (burst 2)"; "" if none."""
    parts = []
    if queue.concurrency is not None:
        parts.append(str(_("≤ %(count)s running") % {"count": queue.concurrency}))
    rate = queue_rate(queue)
    if rate is not None:
        parts.append(str(_("%(rate)s (burst %(burst)s)") % {"rate": rate, "burst": rate.burst}))
    return " · ".join(parts)


class QueueLimitsForm(QueueFormBase):
    """A queue's limits as an operator writes them: empty for no limit (for the burst, the
    default). Checked as settings are, by ``Limits.from_options`` (``set_queue_limits``
    checks with the same validators of ``limits.py``): a ValueError becomes the error of the
    field it names first, and the page saves nothing."""

    concurrency = forms.IntegerField(
        label=_("Concurrency"),
        required=False,
        help_text=_("At most this many of its jobs run at once, on all workers. Empty: no limit."),
    )
    rate = forms.CharField(
        label=_("Rate"),
        required=False,
        empty_value=None,
        help_text=_(
            'At most this many of its jobs start per period: "100/m", "5/s", "1000/h", '
            '"2/10s". Empty: no limit.'
        ),
    )
    burst = forms.IntegerField(
        label=_("Burst"),
        required=False,
        help_text=_(
            "At most this many start at once after a quiet spell. Empty: one second's worth "
            "of the rate."
        ),
    )

    class Meta:
        model = Queue
        fields = ()  # nothing is written to the row but by set_queue_limits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        rate = queue_rate(self.instance)
        self.initial.update(
            concurrency=self.instance.concurrency,
            rate=None if rate is None else str(rate),
            burst=None if rate is None or _is_default_burst(rate) else rate.burst,
        )

    def clean(self) -> dict[str, Any] | None:
        data = super().clean()
        if data is None or not all(name in data for name in LIMIT_FIELDS):
            return data  # a field's own error says what is wrong
        try:
            Limits.from_options({name: data[name] for name in LIMIT_FIELDS})
        except ValueError as error:
            # limits.py's messages begin with the field they are about.
            field = str(error).split(" ", 1)[0]
            self.add_error(field if field in LIMIT_FIELDS else None, capfirst(f"{error}."))
        return data


def _is_default_burst(rate: Rate) -> bool:
    """Whether the form may show the burst empty. A row's period can be any positive float
    (PostgreSQL's NaN and Infinity too), which ``default_burst`` does not take."""
    finite = math.isfinite(rate.period_seconds)
    return finite and rate.burst == default_burst(rate.limit, rate.period_seconds)


@admin.register(Queue)
class QueueAdmin(EddyqAdmin):
    """Queues, paused and resumed by actions; a user who may change a queue sets its limits
    on its page (``operations.set_queue_limits``)."""

    list_display = (
        "name",
        "paused",
        "available",
        "running",
        "limits_display",
        "updated_at",
        "jobs_link",
    )
    list_filter = (("paused_at", admin.EmptyFieldListFilter),)
    search_fields = ("name",)
    actions = ("pause_queues", "resume_queues")
    show_facets = admin.ShowFacets.NEVER
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "name",
                    "paused",
                    "paused_at",
                    "available",
                    "running",
                    "jobs_link",
                    "created_at",
                    "updated_at",
                    "metadata_json",
                )
            },
        ),
    )
    form = QueueLimitsForm
    editable_fields = LIMIT_FIELDS

    def get_queryset(self, request: HttpRequest) -> models.QuerySet[Any]:
        queryset: models.QuerySet[Any] = (
            super().get_queryset(request).annotate(**inspection.queue_counts())
        )
        return queryset

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The limits as a form for a user who may change them, as text for others."""
        fields = LIMIT_FIELDS if self.saves_changes(request, obj) else ("limits_display",)
        limits = (
            _("Limits, across every worker"),
            {
                "fields": fields,
                "description": _(
                    "Workers follow a change within their poll interval, without a restart. "
                    'A worker sets the limits of EDDYQ["QUEUES"] again as it starts.'
                ),
            },
        )
        return (*self.fieldsets, limits)

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        # The form's own fields, none of the model's: Django would write those to the row.
        return super().get_form(request, obj, change, **{**kwargs, "fields": ()})

    def save_model(self, request: HttpRequest, obj: Queue, form: Any, change: bool) -> None:
        data = form.cleaned_data
        operations.set_queue_limits(
            obj.name, concurrency=data["concurrency"], rate=data["rate"], burst=data["burst"]
        )
        obj.refresh_from_db(fields=["concurrency", "rate_limit", "rate_period", "rate_burst"])

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # deleting a paused queue's row would resume it; the queue cleaner tidies

    @admin.display(description=_("paused"), ordering="paused_at")
    def paused(self, queue: Queue) -> SafeString:
        if queue.paused_at is None:
            return format_html('<span class="eddyq-queue-active">{}</span>', _("no"))
        return format_html(
            '<span class="eddyq-queue-paused">{}</span>',
            _("paused since %(at)s") % {"at": format_datetime(queue.paused_at)},
        )

    @admin.display(description=_("available jobs"))
    def available(self, queue: Queue) -> str:
        count = getattr(queue, "available_count", 0)
        if count > inspection.EXACT_COUNT_LIMIT:
            return f"{inspection.EXACT_COUNT_LIMIT:,}+"
        return f"{count:,}"

    @admin.display(description=_("running jobs"))
    def running(self, queue: Queue) -> str:
        return f"{getattr(queue, 'running_count', 0):,}"

    @admin.display(description=_("limits"))
    def limits_display(self, queue: Queue) -> str:
        return limits_text(queue) or "—"

    @admin.display(description=_("jobs"))
    def jobs_link(self, queue: Queue) -> SafeString:
        return format_html('<a href="{}">{}</a>', _job_list_url(queue=queue.name), _("its jobs"))

    @admin.display(description=_("metadata"))
    def metadata_json(self, queue: Queue) -> SafeString:
        return _json(queue.metadata)

    def _set_paused(
        self,
        request: HttpRequest,
        queryset: models.QuerySet[Any],
        method: Callable[[Queue], Queue],
        *,
        paused: bool,
    ) -> None:
        queues = self.selected(request, queryset, ("name", "paused_at"))
        if queues is None:
            return
        changed = []
        for queue in queues:
            if queue.is_paused == paused:
                continue
            method(queue)
            changed.append(queue)
            self.log_change(request, queue, "Paused" if paused else "Resumed")
        verb = _("Paused") if paused else _("Resumed")
        names = ", ".join(queue.name for queue in changed)
        if changed:
            self.message_user(request, f"{verb}: {names}.", messages.SUCCESS)
        unchanged = len(queues) - len(changed)
        if unchanged:
            state = _("paused") if paused else _("running")
            self.message_user(
                request,
                ngettext(
                    "%(count)d queue was already %(state)s.",
                    "%(count)d queues were already %(state)s.",
                    unchanged,
                )
                % {"count": unchanged, "state": state},
                messages.WARNING,
            )

    @admin.action(permissions=["change"], description=_("Pause selected queues"))
    def pause_queues(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> None:
        self._set_paused(request, queryset, Queue.pause, paused=True)

    @admin.action(permissions=["change"], description=_("Resume selected queues"))
    def resume_queues(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> None:
        self._set_paused(request, queryset, Queue.resume, paused=False)


# Workers.

WORKER_STATUS_LABELS = {"running": _("running"), "lost": _("lost"), "stopped": _("stopped")}
#: Hosts listed by the host filter, at most.
HOST_LIMIT = 100


class WorkerStatusFilter(admin.SimpleListFilter):
    """Running, lost or stopped, by the database's clock (``inspection.with_worker_status``)."""

    title = _("status")
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return list(WORKER_STATUS_LABELS.items())

    def queryset(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> Any:
        value = self.value()
        return queryset.filter(status=value) if value else queryset


class WorkerHostFilter(admin.SimpleListFilter):
    """The hosts of the registry, which the queue cleaner keeps short: one bounded query."""

    title = _("host")
    parameter_name = "host"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        hosts = WorkerProcess.objects.order_by("host").values_list("host", flat=True).distinct()
        names = list(hosts[:HOST_LIMIT])
        value = self.value()
        if value and value not in names:
            names.append(value)
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> Any:
        value = self.value()
        return queryset.filter(host=value) if value else queryset


#: Running workers first, then the lost ones, then the stopped; by host and pid.
WORKER_ORDERING = ("status_order", "host", "pid")


class WorkerChangeList(EddyqChangeList):
    def _get_default_ordering(self) -> list[Any]:
        # The order the list is in, for the column headers: ModelAdmin.ordering cannot name an
        # annotation (the system checks refuse it), so Django would show the model's.
        return list(WORKER_ORDERING)


@admin.register(WorkerProcess)
class WorkerProcessAdmin(EstimatingAdmin):
    """The registry of workers, read-only: workers register and renew their rows themselves,
    and the queue cleaner deletes the forgotten ones. Whether a worker is lost is decided by
    the database's clock, never the web server's."""

    list_display = (
        "id",
        "status_badge",
        "host",
        "pid",
        "queues_display",
        "concurrency",
        "started_at",
        "last_seen",
        "running",
        "leader_display",
    )
    list_filter = (WorkerStatusFilter, WorkerHostFilter)
    sortable_by = ("id", "status_badge", "host", "pid", "started_at", "last_seen", "running")
    list_per_page = 100
    actions = None
    change_list_template = "admin/django_eddyq/workerprocess/change_list.html"
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "status_badge",
                    ("host", "pid"),
                    "version",
                    ("queues_display", "concurrency"),
                    "started_at",
                    "last_seen",
                    "stopped_at",
                    "running",
                    "leader_display",
                )
            },
        ),
    )

    def get_queryset(self, request: HttpRequest) -> models.QuerySet[Any]:
        # Annotated before the ordering, which sorts by the status.
        workers = inspection.with_worker_status(WorkerProcess.objects.all())
        return workers.order_by(*self.get_ordering(request))

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        return WORKER_ORDERING

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return WorkerChangeList

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # workers write their own rows

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the queue cleaner deletes them after WORKER_RETENTION

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        retention = eddyq_settings.WORKER_RETENTION
        extra_context = {
            **(extra_context or {}),
            "eddyq_stale_after": format_duration(eddyq_settings.STALE_AFTER),
            "eddyq_worker_retention": None if retention is None else format_duration(retention),
        }
        return super().changelist_view(request, extra_context)

    @admin.display(description=_("status"), ordering="status_order")
    def status_badge(self, worker: WorkerProcess) -> SafeString:
        status = getattr(worker, "status", "")
        return format_html(
            '<span class="eddyq-state eddyq-worker-{}">{}</span>',
            status,
            WORKER_STATUS_LABELS.get(status, status),
        )

    @admin.display(description=_("queues"))
    def queues_display(self, worker: WorkerProcess) -> str:
        if worker.queues is None:
            return str(_("all"))
        if isinstance(worker.queues, list):
            return ", ".join(str(queue) for queue in worker.queues)
        return json.dumps(worker.queues)

    @admin.display(description=_("last seen"), ordering="last_seen_at")
    def last_seen(self, worker: WorkerProcess) -> str:
        return f"{format_datetime(worker.last_seen_at)} ({_ago(getattr(worker, 'seen_ago', None))})"

    @admin.display(description=_("leader"), boolean=True)
    def leader_display(self, worker: WorkerProcess) -> bool | None:
        """Whether it leads; unknown for a lost worker that led when last seen."""
        if not worker.leader:
            return False
        return True if getattr(worker, "status", "") == "running" else None


# Periodic schedules.


def _job_link(job_id: int) -> SafeString:
    return format_html(
        '<a href="{}">{}</a>',
        reverse("admin:django_eddyq_job_change", args=[job_id]),
        _("job %(id)s") % {"id": job_id},
    )


#: The actions a schedule's row posts, by the name of the method that does each.
SCHEDULE_ACTIONS = ("run_schedule_now", "enable_schedule", "disable_schedule")


@admin.register(PeriodicSchedule)
class PeriodicScheduleAdmin(EddyqAdmin):
    """Every configured schedule, with its next run by the database's clock, its last run and
    that run's job, and buttons to run it now, disable or enable it; then the rows of schedules
    no longer configured. Read from the configuration and ``eddyq_periodic`` through
    ``maintenance.periodic``, not a queryset: a schedule that never ran has no row yet.
    A button posts ``action`` (one of SCHEDULE_ACTIONS) and ``schedule`` (its name)."""

    actions = None
    change_list_template = "admin/django_eddyq/periodicschedule/change_list.html"
    fieldsets = (
        (
            None,
            {"fields": ("name", "enabled", "last_run_at", "last_job_link", "updated_at")},
        ),
    )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # deleting a row would enable the schedule again; the enqueuer tidies

    @admin.display(description=_("last run's job"))
    def last_job_link(self, schedule: PeriodicSchedule) -> SafeString | str:
        """A link to the job if it still exists (the job's page checks who may see it)."""
        job_id = schedule.last_job_id
        if job_id is None:
            return "—"
        if not Job.objects.using(schedule._state.db).filter(pk=job_id).exists():
            return str(_("job %(id)s (deleted)") % {"id": job_id})
        return _job_link(job_id)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            self.check_post_permission(request)
            self._steer(request)
            return HttpResponseRedirect(request.get_full_path())
        schedules = periodic_schedules()
        links = self._job_links(request, [schedule.last_job_id for schedule in schedules])
        context = {
            **self.admin_site.each_context(request),
            "title": capfirst(self.opts.verbose_name_plural),
            "opts": self.opts,
            "media": self.media,
            "eddyq_schedules": [self._row(schedule, links) for schedule in schedules],
            "eddyq_can_change": self.has_change_permission(request),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.change_list_template, context)

    def _row(self, schedule: ScheduleStatus, links: dict[int | None, SafeString]) -> Any:
        if schedule.next_run_at is not None:
            next_run = format_datetime(schedule.next_run_at)
        else:
            next_run = "—" if schedule.configured else ""
        last_run = format_datetime(schedule.last_run_at) if schedule.last_run_at else "—"
        job = links.get(schedule.last_job_id)
        return {
            "schedule": schedule,
            "next_run": next_run,
            "last_run": format_html("{} · {}", last_run, job) if job else last_run,
        }

    def _job_links(
        self, request: HttpRequest, job_ids: Sequence[int | None]
    ) -> dict[int | None, SafeString]:
        """Links to those of the jobs that still exist, if this user may see jobs: one query."""
        ids = {job_id for job_id in job_ids if job_id is not None}
        if not ids or not self.admin_site.is_registered(Job):
            return {}
        job_admin = self.admin_site.get_model_admin(Job)
        if not job_admin.has_view_permission(request):
            return {}
        existing = job_admin.get_queryset(request).filter(pk__in=ids).values_list("pk", flat=True)
        return {job_id: _job_link(job_id) for job_id in existing}

    def _steer(self, request: HttpRequest) -> None:
        actions = request.POST.getlist("action")
        name = request.POST.get("schedule", "")
        if len(actions) != 1 or actions[0] not in SCHEDULE_ACTIONS:
            message = _("Nothing was changed: no such action.")
            self.message_user(request, message, messages.ERROR)
            return
        try:
            getattr(self, actions[0])(request, name)
        except ScheduleNotFound as error:
            self.message_user(request, f"{capfirst(str(error))}.", messages.ERROR)

    @admin.action(permissions=["change"], description=_("Run now"))
    def run_schedule_now(self, request: HttpRequest, name: str) -> None:
        job = run_periodic_now(name)
        self.log_addition(request, job, f"Enqueued by hand: a run of the schedule {name}")
        self.message_user(
            request,
            format_html(str(_("Enqueued {}: a run of {} now.")), _job_link(job.pk), name),
            messages.SUCCESS,
        )

    @admin.action(permissions=["change"], description=_("Enable"))
    def enable_schedule(self, request: HttpRequest, name: str) -> None:
        self._set_enabled(request, name, enabled=True)

    @admin.action(permissions=["change"], description=_("Disable"))
    def disable_schedule(self, request: HttpRequest, name: str) -> None:
        self._set_enabled(request, name, enabled=False)

    def _set_enabled(self, request: HttpRequest, name: str, *, enabled: bool) -> None:
        changed = set_periodic_enabled(name, enabled)
        if not changed:
            message = (
                _("%(name)s was already enabled.")
                if enabled
                else _("%(name)s was already disabled.")
            )
            self.message_user(request, message % {"name": name}, messages.WARNING)
            return
        self.log_change(
            request, PeriodicSchedule.objects.get(name=name), "Enabled" if enabled else "Disabled"
        )
        message = _("Enabled: %(name)s.") if enabled else _("Disabled: %(name)s.")
        self.message_user(request, message % {"name": name}, messages.SUCCESS)
