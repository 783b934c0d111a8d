"""The duties every worker hosts (service/components/duties.py), as the settings
configure them: the one place that names them, so the worker names none."""

from __future__ import annotations

from casetrail.components.backtests import backtesting
from casetrail.components.duties import Duties
from casetrail.components.retention import retaining
from casetrail.components.sweeper import sweeping
from casetrail.config import Settings


def worker_duties(settings: Settings) -> Duties:
    return [
        ("sweeper", sweeping(settings.sweep_seconds)),
        ("retention", retaining(settings.retention_seconds, settings.archive_path(),
                                settings.archive_s3_endpoint)),
        ("backtests", backtesting()),
    ]
