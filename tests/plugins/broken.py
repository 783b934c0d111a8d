"""A plugin whose module fails on import, as a broken release would."""

raise RuntimeError("this release of the plugin is broken")
