"""Optional integrations; each sub-package needs its own extra (e.g. ``spark``)."""
