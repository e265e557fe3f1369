"""Tools around sluice that are not part of the runtime package: the synthetic data generator for the
example streams (``sluice generate``) and the end-to-end demo (``sluice demo``, ``make run``)."""
