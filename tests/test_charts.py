"""The activity charts (charts.py): well-formed SVG, accessible, escaped; and the admin page
that shows them."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client

from django_eddyq.activity import Bucket, Series
from django_eddyq.charts import Line, activity_charts, line_chart, nice_ceiling
from django_eddyq.models import Activity

SVG = "{http://www.w3.org/2000/svg}"
START = datetime(2030, 5, 6, 12, 0, tzinfo=UTC)


def series(queue: str | None = None, count: int = 60) -> Series:
    buckets = [
        Bucket(
            START + timedelta(minutes=index),
            completed=index,
            failed=index % 3,
            retried=index % 2,
            cancelled=0,
            snoozed=0,
            available=None if index < 5 else 100 - index,
        )
        for index in range(count)
    ]
    return Series(timedelta(hours=1), timedelta(minutes=1), queue, buckets)


def test_a_chart_is_well_formed_accessible_svg() -> None:
    charts = activity_charts(
        series(), chart_id="c", heading="the last hour", label_every=10, label_format="%H:%M"
    )
    root = ElementTree.fromstring(str(charts.finished))
    assert root.tag == f"{SVG}svg"
    assert root.get("role") == "img"
    assert root.get("aria-labelledby") == "c-finished-title c-finished-desc"
    assert root.find(f"{SVG}title").text == "Jobs finished, the last hour"
    description = root.find(f"{SVG}desc").text
    assert "1,770 completed, 60 failed, 30 retried" in description
    assert "Busiest: 12:59, 62 jobs." in description
    legend = root.find(f"{SVG}g[@class='eddyq-chart-legend']")
    assert [text.text for text in legend.iter(f"{SVG}text")] == ["completed", "failed", "retried"]
    lines = root.findall(f"{SVG}g")
    dashes = {
        line.get("class"): line.find(f"{SVG}polyline").get("stroke-dasharray")
        for line in lines
        if "eddyq-chart-line" in (line.get("class") or "")
    }
    assert dashes == {
        "eddyq-chart-line eddyq-line-completed": None,
        "eddyq-chart-line eddyq-line-failed": "6 3",
        "eddyq-chart-line eddyq-line-retried": "2 3",
    }
    depth = ElementTree.fromstring(str(charts.depth))
    assert "available jobs between 41 and 95, 41 at the latest sample" in (
        depth.find(f"{SVG}desc").text
    )
    # The unsampled minutes are a gap: the line starts at the first sample.
    [polyline] = depth.iter(f"{SVG}polyline")
    assert len(polyline.get("points").split()) == 55


def test_texts_are_escaped() -> None:
    queue = '<script>alert("x")</script>&'
    charts = activity_charts(
        series(queue), chart_id='c"><x', heading="h", label_every=10, label_format="%H:%M"
    )
    root = ElementTree.fromstring(str(charts.finished))  # it parses: nothing broke out
    assert queue in root.find(f"{SVG}desc").text
    assert "<script>" not in str(charts.finished)
    chart = line_chart(
        [Line("<b>", [1, 2], "x", "", "circle")],
        [START, START + timedelta(minutes=1)],
        chart_id="d",
        title="<t>",
        description="&",
        label_every=1,
        label_format="%H:%M",
    )
    parsed = ElementTree.fromstring(str(chart))
    assert parsed.find(f"{SVG}title").text == "<t>"


def test_an_empty_series_draws_flat_lines_and_says_so() -> None:
    empty = Series(
        timedelta(hours=1),
        timedelta(minutes=1),
        None,
        [Bucket(START, 0, 0, 0, 0, 0, None)],
    )
    charts = activity_charts(empty, chart_id="e", heading="h", label_every=1, label_format="%H")
    ElementTree.fromstring(str(charts.finished))
    depth = ElementTree.fromstring(str(charts.depth))
    assert "no sample of the queues' depth" in depth.find(f"{SVG}desc").text
    assert not list(depth.iter(f"{SVG}polyline"))


@pytest.mark.parametrize(
    ("value", "top"), [(0, 1), (1, 1), (2, 2), (3, 5), (7, 10), (10, 10), (11, 20), (999, 1000)]
)
def test_the_y_axis_ends_at_a_round_number(value: int, top: int) -> None:
    assert nice_ceiling(value) == top


@pytest.mark.django_db
def test_the_activity_page(admin_client: Client) -> None:
    Activity.objects.create(
        minute=datetime.now(UTC).replace(second=0, microsecond=0),
        queue="<q>",
        source="w1",
        completed=4,
    )
    response = admin_client.get("/admin/django_eddyq/job/activity/", {"queue": "<q>"})
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count('role="img"') == 4
    assert "queue &lt;q&gt;: 4 completed" in html
    assert '<option value="&lt;q&gt;" selected>' in html
    job_list = admin_client.get("/admin/django_eddyq/job/").content.decode()
    assert 'href="/admin/django_eddyq/job/activity/"' in job_list


@pytest.mark.django_db
def test_the_activity_page_needs_the_view_permission(client: Any) -> None:
    from django.contrib.auth.models import User

    user = User.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get("/admin/django_eddyq/job/activity/").status_code == 403
