"""Integrations with web frameworks: enqueue inside the application's own transaction.

``jobqueue.contrib.django`` and ``jobqueue.contrib.flask`` are the two; what an integration
provides is :class:`jobqueue.frameworks.Framework`.
"""

from __future__ import annotations

import sys
from typing import Any

from jobqueue.frameworks import Framework


def detect_django() -> Framework | None:
    """The Django integration when this process runs a Django project that installed it, else None.

    Cheap when Django is not imported: a JobQueue created without a URL asks this on first use.
    """
    conf = sys.modules.get("django.conf")
    if conf is None:
        return None
    settings: Any = conf.settings
    if not settings.configured:
        return None
    if not any(str(name).startswith("jobqueue.contrib.django") for name in settings.INSTALLED_APPS):
        return None
    from jobqueue.contrib.django.integration import DjangoIntegration

    return DjangoIntegration.from_settings()


__all__ = ["Framework", "detect_django"]
