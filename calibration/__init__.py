"""Torch collectors that calibrate simddp on a real cluster (needs the ``calibration`` extra: torch).

* :mod:`calibration.collectives` (``torchrun ... -m calibration.collectives``): collective timings.
* :mod:`calibration.compute` (``python -m calibration.compute`` or under torchrun): per-layer times.
* :mod:`calibration.ddp_step` (``torchrun ... -m calibration.ddp_step``): real DDP steps, for validation.
* :mod:`calibration.import_model`: a scenario's ``model:`` block from a torch model, no timing.
* :mod:`calibration.acceptance`: the whole CPU flow, collect -> fit -> DDP -> validate.

The files they write are :mod:`simddp.profile` models; ``simddp calibrate fit`` / ``validate`` /
``predict`` do the rest without torch. See docs/calibration.md.
"""
