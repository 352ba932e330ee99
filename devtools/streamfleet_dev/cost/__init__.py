"""``make cost``: the monthly bill of a workload by component, from counted requests and the
synthesized templates, priced from a dated price list (:mod:`.bill`)."""
