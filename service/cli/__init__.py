"""The ``casetrail`` command line (``main``), its command groups in a module each, and
``up``, ``demo`` and ``tail`` (``demo``)."""
