"""Selective int8 for CPU builds: W8A8 linear layers (int8.py), chosen by their measured effect on the label
log-probabilities of a calibration set (select.py), admitted by an accuracy gate on a held-out part of it
(gate.py); build_step.py is the build's `[quantize]` step that ties them together."""
