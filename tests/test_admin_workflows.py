"""The admin's workflow page, through Django's test client: its counts, the graph and the list
of its steps (bounded, summarised beyond), its actions, and the job page's link to it."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_eddyq import Workflow, inspection
from django_eddyq.models import Job, WorkflowRun
from django_eddyq.testing import run_jobs
from tests import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def workflow_url(workflow: Workflow) -> str:
    return reverse("admin:django_eddyq_workflowrun_change", args=[workflow.id])


def staff_client(*codenames: str) -> Client:
    user = User.objects.create_user(f"staff-{'-'.join(codenames)}", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_eddyq", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


def failing_pipeline() -> Workflow:
    """fetch, then load (which fails), then report after load."""
    workflow = Workflow("nightly <import>")
    fetch = workflow.add(jobs.workflow_step.s("fetch"), name="fetch")
    load = workflow.add(
        jobs.workflow_step.using(max_attempts=1).s("load", fail=True), after=[fetch], name="load"
    )
    workflow.add(jobs.workflow_step.s("report"), after=[load], name="report")
    workflow.enqueue()
    for _ in range(3):
        run_jobs()
    return workflow


def test_the_workflow_page_draws_and_lists_its_steps(admin_client: Client) -> None:
    workflow = failing_pipeline()
    response = admin_client.get(workflow_url(workflow))
    assert response.status_code == 200
    page = response.content.decode()
    # The graph: a box per step, coloured by its state, linked to its job; a line per edge.
    svg = page[page.index('<svg class="eddyq-graph"') :]
    svg = svg[: svg.index("</svg>")]
    assert svg.count("<rect") == 3 and svg.count("<line") == 2
    assert 'eddyq-state-failed"><title>load: failed</title>' in svg
    report = workflow.steps[2]
    assert reverse("admin:django_eddyq_job_change", args=[report.job_id]) in svg
    # The list: each step's state, attempts and duration.
    assert re.search(r">load</a></td><td><span[^>]*>failed</span></td><td>1 / 1</td>", page)
    assert re.search(r">fetch</a></td><td><span[^>]*>completed</span></td><td>1 / 3</td>", page)
    assert ">report</a></td><td><span" in page and "cancelled" in page
    assert "nightly &lt;import&gt;" in page and "nightly <import>" not in page


def test_a_large_workflow_is_drawn_in_part_and_summarised(admin_client: Client) -> None:
    workflow = Workflow("wide")
    first = workflow.add(jobs.workflow_step.s("first"), name="first")
    for n in range(inspection.WORKFLOW_STEPS_SHOWN + 50):
        workflow.add(jobs.workflow_step.s(str(n)), after=[first], name=f"part-{n}")
    workflow.enqueue()
    page = admin_client.get(workflow_url(workflow)).content.decode()
    svg = page[page.index('<svg class="eddyq-graph"') :]
    svg = svg[: svg.index("</svg>")]
    assert svg.count("<rect") == inspection.WORKFLOW_STEPS_SHOWN
    assert "The first 200 of its 251 steps; of them all, 251 have not ended" in page


def test_the_actions_retry_failed_steps_and_cancel(admin_client: Client) -> None:
    workflow = failing_pipeline()
    _fetch, load, report = workflow.steps
    Job.objects.filter(pk=load.job_id).update(kwargs={"fail": False})
    changelist = reverse("admin:django_eddyq_workflowrun_changelist")
    response = admin_client.post(
        changelist,
        {"action": "retry_failed_steps", "_selected_action": [str(workflow.id)]},
        follow=True,
    )
    assert "1 step retried" in response.content.decode()
    assert Job.objects.get(pk=report.job_id).state == "pending"  # back, waiting for load
    admin_client.post(
        changelist, {"action": "cancel_workflows", "_selected_action": [str(workflow.id)]}
    )
    assert {Job.objects.get(pk=step.job_id).state for step in (load, report)} == {"cancelled"}
    assert WorkflowRun.objects.get(pk=workflow.id).state == "cancelled"


def test_the_actions_need_the_change_permission() -> None:
    workflow = failing_pipeline()
    viewer = staff_client("view_workflowrun", "view_job")
    assert viewer.get(workflow_url(workflow)).status_code == 200
    response = viewer.post(
        reverse("admin:django_eddyq_workflowrun_changelist"),
        {"action": "cancel_workflows", "_selected_action": [str(workflow.id)]},
    )
    assert response.status_code == 403
    assert WorkflowRun.objects.get(pk=workflow.id).state == "failed"


def test_the_job_page_links_to_its_workflow(admin_client: Client) -> None:
    workflow = failing_pipeline()
    step = workflow.steps[1]
    page = admin_client.get(
        reverse("admin:django_eddyq_job_change", args=[step.job_id])
    ).content.decode()
    assert f'<a href="{workflow_url(workflow)}">#{workflow.id}</a>, step load' in page
    plain = jobs.add.enqueue(1, 2)
    page = admin_client.get(reverse("admin:django_eddyq_job_change", args=[plain.pk])).content
    assert not re.search(rb"workflowrun/\d+/change", page)


def test_the_workflow_page_has_buttons_that_retry_and_cancel(admin_client: Client) -> None:
    workflow = failing_pipeline()
    _fetch, load, report = workflow.steps
    page = admin_client.get(workflow_url(workflow)).content.decode()
    changelist = reverse("admin:django_eddyq_workflowrun_changelist")
    # Failed, with nothing unfinished: it can be retried, there is nothing to cancel.
    assert f'<form method="post" action="{changelist}" class="eddyq-page-action">' in page
    assert 'name="csrfmiddlewaretoken"' in page
    assert ">Retry failed steps</button>" in page and "Cancel workflow" not in page

    Job.objects.filter(pk=load.job_id).update(kwargs={"fail": False})
    csrf = Client(enforce_csrf_checks=True)
    csrf.force_login(User.objects.get(is_superuser=True))
    button = {
        "action": "retry_failed_steps",
        "index": "0",
        "_selected_action": str(workflow.id),
        "_eddyq_from_workflow": "1",
    }
    assert csrf.post(changelist, button).status_code == 403  # no CSRF token: refused
    assert Job.objects.get(pk=load.job_id).state == "failed"

    response = admin_client.post(changelist, button, follow=True)
    assert response.redirect_chain == [(workflow_url(workflow), 302)]
    page = response.content.decode()
    assert "Workflow nightly &lt;import&gt;: 1 step retried." in page
    assert {Job.objects.get(pk=step.job_id).state for step in (load, report)} == {
        "available",
        "pending",
    }
    # Running again: now it can be cancelled, and there is nothing to retry.
    assert ">Cancel workflow</button>" in page and "Retry failed steps" not in page

    response = admin_client.post(changelist, {**button, "action": "cancel_workflows"}, follow=True)
    assert response.redirect_chain == [(workflow_url(workflow), 302)]
    assert "Workflow nightly &lt;import&gt;: 2 steps cancelled." in response.content.decode()
    assert {Job.objects.get(pk=step.job_id).state for step in (load, report)} == {"cancelled"}
    assert WorkflowRun.objects.get(pk=workflow.id).state == "cancelled"


def test_retrying_a_workflow_without_failed_steps_says_so(admin_client: Client) -> None:
    workflow = Workflow("quiet")
    workflow.add(jobs.workflow_step.s("only"), name="only")
    workflow.enqueue()
    run_jobs()
    response = admin_client.post(
        reverse("admin:django_eddyq_workflowrun_changelist"),
        {
            "action": "retry_failed_steps",
            "_selected_action": [str(workflow.id)],
            "_eddyq_from_workflow": "1",
        },
        follow=True,
    )
    assert response.redirect_chain == [(workflow_url(workflow), 302)]
    page = response.content.decode()
    assert 'class="warning">Workflow quiet: 0 steps retried.' in page
    # Completed: neither button.
    assert "Retry failed steps" not in page and "Cancel workflow" not in page


def test_the_buttons_need_the_change_permission() -> None:
    workflow = failing_pipeline()
    viewer = staff_client("view_workflowrun", "view_job")
    page = viewer.get(workflow_url(workflow)).content.decode()
    assert "Retry failed steps" not in page and "eddyq-page-action" not in page
    for action in ("retry_failed_steps", "cancel_workflows"):
        response = viewer.post(
            reverse("admin:django_eddyq_workflowrun_changelist"),
            {"action": action, "_selected_action": [str(workflow.id)], "_eddyq_from_workflow": "1"},
        )
        assert response.status_code == 403
    assert Job.objects.get(pk=workflow.steps[1].job_id).state == "failed"
    assert WorkflowRun.objects.get(pk=workflow.id).state == "failed"

    changer = staff_client("view_workflowrun", "change_workflowrun")
    assert ">Retry failed steps</button>" in changer.get(workflow_url(workflow)).content.decode()
